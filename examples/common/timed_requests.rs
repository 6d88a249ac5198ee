//! `--requests N` of the request/response clients (`http_client`, `greeter_client`): the count's
//! parsing and the percentile line that scripts/compare-wire reads.

use std::time::Duration;

/// The value of `--requests`: a positive count.
pub fn parse_count(value: Option<String>) -> Result<usize, String> {
    let value = value.ok_or("--requests needs a count")?;
    value
        .parse()
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| format!("--requests wants a positive count, not {value:?}"))
}

/// `requests N p50 X us p90 Y us p99 Z us` for the latencies in `took` (sorts it; not empty).
pub fn report(took: &mut [Duration]) -> String {
    took.sort_unstable();
    let last = took.len() - 1;
    let at = |q: f64| took[(last as f64 * q).round() as usize].as_secs_f64() * 1e6;
    format!(
        "requests {} p50 {:.1} us p90 {:.1} us p99 {:.1} us",
        took.len(),
        at(0.5),
        at(0.9),
        at(0.99)
    )
}

#[cfg(test)]
mod timed_requests_tests {
    use super::*;

    #[test]
    fn counts_must_be_positive_numbers() {
        assert_eq!(parse_count(Some("7".into())), Ok(7));
        for bad in [None, Some("0".into()), Some("x".into()), Some("-3".into())] {
            assert!(parse_count(bad.clone()).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn report_names_the_nearest_rank_percentiles() {
        let mut took: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        assert_eq!(
            report(&mut took),
            "requests 100 p50 51.0 us p90 90.0 us p99 99.0 us"
        );
    }
}

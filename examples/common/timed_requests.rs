//! `--requests N` of the request/response clients (`http_client`, `greeter_client`): the flag's
//! value, and the percentile line that scripts/compare-wire reads.

use std::time::Duration;

/// `--requests N`'s value: a positive count (clap's value parser for the flag).
pub fn positive_count(value: &str) -> Result<usize, String> {
    value
        .parse()
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| format!("wants a positive count, not {value:?}"))
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
        assert_eq!(positive_count("7"), Ok(7));
        for bad in ["", "0", "x", "-3"] {
            assert!(positive_count(bad).is_err(), "{bad:?} was accepted");
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

//! `--requests N` of the request/response clients (`http_client`, `greeter_client`): the flag,
//! and the percentile line that scripts/compare-wire reads.

use std::time::Duration;

/// Takes `--requests N` into `requests` (its value from `rest`); returns whether `flag` was
/// it. N must be a positive count.
pub fn take_flag(
    flag: &str,
    rest: &mut impl Iterator<Item = String>,
    requests: &mut Option<usize>,
) -> Result<bool, String> {
    if flag != "--requests" {
        return Ok(false);
    }
    let value = rest.next().ok_or("--requests needs a count")?;
    let count = value
        .parse()
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| format!("--requests wants a positive count, not {value:?}"))?;
    *requests = Some(count);
    Ok(true)
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

    fn take(list: &[&str]) -> Result<Option<usize>, String> {
        let mut rest = list[1..].iter().map(|s| (*s).to_owned());
        let mut requests = None;
        assert!(take_flag(list[0], &mut rest, &mut requests)?);
        Ok(requests)
    }

    #[test]
    fn counts_must_be_positive_numbers() {
        assert_eq!(take(&["--requests", "7"]), Ok(Some(7)));
        for bad in [
            &["--requests"][..],
            &["--requests", "0"],
            &["--requests", "x"],
            &["--requests", "-3"],
        ] {
            assert!(take(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn other_flags_are_left_alone() {
        let mut requests = None;
        let mut rest = std::iter::once("7".to_owned());
        assert_eq!(take_flag("--h2", &mut rest, &mut requests), Ok(false));
        assert_eq!((requests, rest.next()), (None, Some("7".to_owned())));
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

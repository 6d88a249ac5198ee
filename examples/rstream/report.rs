//! The result table, formatted like rstream.c's `show_perf` and librdmacm's `size_str`/`cnt_str`,
//! so that the tables of the two tools line up column for column.

use std::time::Duration;

use crate::plan::Test;

/// `size_str`: binary magnitudes (k = 1024), one decimal only below 10 of a unit and only when
/// it is not zero: 1536 -> "1.5k", 8 192 000 -> "7.8m", 12 800 000 -> "12m".
pub fn size_str(size: u64) -> String {
    let (base, mag) = if size >= 1 << 30 {
        (1 << 30, "g")
    } else if size >= 1 << 20 {
        (1 << 20, "m")
    } else if size >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let whole = size / base;
    // Truncated, not rounded: 1023 KiB is "1023k", 1.99 MiB is "1.9m".
    let fraction = if whole < 10 {
        size % base * 10 / base
    } else {
        0
    };
    if fraction != 0 {
        format!("{whole}.{fraction}{mag}")
    } else {
        format!("{whole}{mag}")
    }
}

/// `cnt_str`: decimal magnitudes (k = 1000), truncated, no fraction: 100 000 -> "100k".
pub fn cnt_str(count: u64) -> String {
    match count {
        1_000_000_000.. => format!("{}b", count / 1_000_000_000),
        1_000_000.. => format!("{}m", count / 1_000_000),
        1_000.. => format!("{}k", count / 1_000),
        _ => count.to_string(),
    }
}

/// The header line rstream.c prints once, after the server listens and before the client
/// connects.
pub fn header() -> String {
    format!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
        "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
    )
}

/// One result line. `total` counts both directions; `usec/xfer` is the time of one transfer in
/// one direction. The arithmetic follows rstream.c, including its single-precision `usec`, so
/// that equal timings print equal digits.
pub fn perf_line(test: &Test, elapsed: Duration) -> String {
    let usec = elapsed.as_micros() as f32;
    let bytes = test.bytes_moved();
    let seconds = f64::from(usec) / 1_000_000.0;
    let gbit_per_sec = (bytes.saturating_mul(8)) as f64 / (1000.0 * f64::from(usec));
    let usec_per_xfer = (usec / test.iterations as f32) / (test.count as f32 * 2.0);
    format!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:8.2}s{:10.2}{:11.2}",
        test.name,
        size_str(test.size as u64),
        cnt_str(test.count as u64),
        cnt_str(test.iterations as u64),
        size_str(bytes),
        seconds,
        gbit_per_sec,
        f64::from(usec_per_xfer),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_like_common_c() {
        assert_eq!(size_str(64), "64");
        assert_eq!(size_str(1000), "1000");
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(4096), "4k");
        assert_eq!(size_str(100_000), "97k");
        assert_eq!(size_str(8_192_000), "7.8m");
        assert_eq!(size_str(12_800_000), "12m");
        assert_eq!(size_str(3 << 21), "6m");
        assert_eq!(size_str(3 << 29), "1.5g");
    }

    #[test]
    fn counts_like_common_c() {
        assert_eq!(cnt_str(1), "1");
        assert_eq!(cnt_str(999), "999");
        assert_eq!(cnt_str(1000), "1k");
        assert_eq!(cnt_str(100_000), "100k");
        assert_eq!(cnt_str(2_500_000), "2m");
        assert_eq!(cnt_str(3_000_000_000), "3b");
    }

    #[test]
    fn table_layout() {
        // Copied from the output of the C tool.
        assert_eq!(
            header(),
            "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer"
        );
        let test = Test {
            name: "custom".into(),
            size: 4096,
            count: 100,
            iterations: 10,
        };
        assert_eq!(
            perf_line(&test, Duration::from_micros(14_700)),
            "custom    4k      100     10      7.8m        0.01s      4.46       7.35"
        );
        let lat = Test::latency(64);
        assert_eq!(
            perf_line(&lat, Duration::from_micros(990_000)),
            "64_lat    64      1       100k    12m         0.99s      0.10       4.95"
        );
    }
}

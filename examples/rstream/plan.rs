//! Which tests a run is made of: rstream.c's size table and the iteration and transfer counts
//! it derives from each size.

use crate::report::size_str;

/// One line of the result table: `iterations` round trips of `count` transfers of `size` bytes
/// each way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Test {
    pub name: String,
    pub size: usize,
    pub count: usize,
    pub iterations: usize,
}

impl Test {
    /// `-S`/`-C`/`-I`: one test named "custom".
    pub fn custom(size: usize, count: usize, iterations: usize) -> Self {
        Test {
            name: "custom".into(),
            size,
            count,
            iterations,
        }
    }

    /// Ping-pong: one transfer per direction, many iterations.
    pub fn latency(size: usize) -> Self {
        Test {
            name: format!("{}_lat", size_str(size as u64)),
            size,
            count: 1,
            iterations: size_to_count(size),
        }
    }

    /// Streaming: many transfers per direction, one iteration.
    pub fn bandwidth(size: usize) -> Self {
        Test {
            name: format!("{}_bw", size_str(size as u64)),
            size,
            count: size_to_count(size),
            iterations: 1,
        }
    }

    /// Bytes moved in both directions together, the "total" column.
    pub fn bytes_moved(&self) -> u64 {
        [self.iterations, self.count, self.size, 2]
            .into_iter()
            .fold(1u64, |acc, n| acc.saturating_mul(n as u64))
    }
}

/// `size_to_count` of librdmacm's common.c: fewer repetitions for larger sizes.
pub fn size_to_count(size: usize) -> usize {
    match size {
        s if s >= 1 << 20 => 100,
        s if s >= 1 << 16 => 1_000,
        s if s >= 1 << 10 => 10_000,
        _ => 100_000,
    }
}

/// The sizes of the default run: 64 B, 4 KiB, 64 KiB and 1 MiB, or with `-S all` 33 sizes: every
/// power of two from 64 B to 4 MiB and, from 128 B on, one and a half times each (up to 6 MiB).
pub fn test_sizes(all: bool) -> Vec<usize> {
    const STANDARD: [usize; 4] = [1 << 6, 1 << 12, 1 << 16, 1 << 20];
    if !all {
        return STANDARD.to_vec();
    }
    let mut sizes = vec![1 << 6];
    for shift in 7..=22 {
        sizes.push(1 << shift);
        sizes.push((1 << shift) + (1 << (shift - 1)));
    }
    sizes
}

/// The largest transfer of the default run, which sizes the buffer however `-S all` is set
/// (rstream.c allocates it for the largest entry of its table either way).
pub fn largest_default_size() -> usize {
    test_sizes(true).into_iter().max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_table() {
        let all = test_sizes(true);
        assert_eq!(all.len(), 33);
        assert_eq!(&all[..4], &[64, 128, 192, 256]);
        assert_eq!(all.last(), Some(&(6 << 20)));
        assert!(test_sizes(false).iter().all(|s| all.contains(s)));
        assert_eq!(largest_default_size(), 6 << 20);
    }

    #[test]
    fn names_and_counts() {
        let lat = Test::latency(1536);
        assert_eq!(
            (lat.name.as_str(), lat.count, lat.iterations),
            ("1.5k_lat", 1, 10_000)
        );
        let bw = Test::bandwidth(1 << 20);
        assert_eq!(
            (bw.name.as_str(), bw.count, bw.iterations),
            ("1m_bw", 100, 1)
        );
        assert_eq!(Test::latency(64).bytes_moved(), 12_800_000);
    }
}

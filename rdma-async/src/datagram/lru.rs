//! [`LruMap`]: a map that keeps at most a given number of entries, forgetting the least
//! recently used one to make room, so that what peers can make a socket remember stays bounded.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// A map of at most `capacity` entries. Looking an entry up with [`Self::get`] or inserting it
/// makes it the most recently used; [`Self::peek`] does not.
#[derive(Debug)]
pub(crate) struct LruMap<K, V> {
    /// Each value with the stamp of its latest use.
    entries: HashMap<K, (V, u64)>,
    /// Keys by the stamp of their latest use: the first is the least recently used.
    by_use: BTreeMap<u64, K>,
    next_stamp: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> LruMap<K, V> {
    /// An empty map that keeps at most `capacity` entries (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        LruMap {
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            next_stamp: 0,
            capacity: capacity.max(1),
        }
    }

    #[cfg(any(test, rdma_async_hooks, rdma_async_fuzzing))]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// The value of `key`, without making it recently used.
    pub(crate) fn peek(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(v, _)| v)
    }

    /// The value of `key`, made the most recently used.
    pub(crate) fn get(&mut self, key: &K) -> Option<&mut V> {
        let stamp = self.stamp();
        let (value, used) = self.entries.get_mut(key)?;
        self.by_use.remove(used);
        *used = stamp;
        self.by_use.insert(stamp, key.clone());
        Some(value)
    }

    /// Forgets the least recently used entry until there is room for one more.
    fn make_room(&mut self) {
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                return;
            };
            self.entries.remove(&oldest);
        }
    }

    /// The value of `key`, inserted with `make` (forgetting the least recently used entry if
    /// the map is full) when absent; made the most recently used either way.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let stamp = self.stamp();
        match self.entries.get_mut(&key) {
            Some((_, used)) => {
                self.by_use.remove(used);
                *used = stamp;
            }
            None => self.make_room(),
        }
        self.by_use.insert(stamp, key.clone());
        &mut self.entries.entry(key).or_insert_with(|| (make(), stamp)).0
    }

    /// Sets the value of `key` (forgetting the least recently used entry if the map is full and
    /// `key` is new), made the most recently used.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        match self.get(&key) {
            Some(old) => *old = value,
            None => {
                self.get_or_insert_with(key, || value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_its_capacity_and_forgets_the_least_recently_used() {
        let mut m = LruMap::new(3);
        for k in 0..3 {
            m.insert(k, k * 10);
        }
        // 0 is used again: 1 is now the least recently used.
        assert_eq!(m.get(&0), Some(&mut 0));
        m.insert(3, 30);
        assert_eq!(m.len(), 3);
        assert_eq!(m.peek(&1), None, "the least recently used entry went");
        assert_eq!(
            (m.peek(&0), m.peek(&2), m.peek(&3)),
            (Some(&0), Some(&20), Some(&30))
        );
        // peek does not count as a use: 2 goes next.
        m.get_or_insert_with(4, || 40);
        assert_eq!(m.peek(&2), None);
        // An existing key is found, not replaced, and nothing is forgotten.
        assert_eq!(*m.get_or_insert_with(3, || 99), 30);
        m.insert(0, 1);
        assert_eq!((m.len(), m.peek(&0)), (3, Some(&1)));
    }

    #[test]
    fn thousands_of_keys_stay_within_the_capacity() {
        let mut m = LruMap::new(100);
        for k in 0..5000u32 {
            m.get_or_insert_with(k, || k);
            assert!(m.len() <= 100);
        }
        assert_eq!(m.len(), 100);
        assert_eq!(
            m.by_use.len(),
            100,
            "the use order tracks exactly the entries"
        );
        assert!(
            (4900..5000).all(|k| m.peek(&k) == Some(&k)),
            "the newest 100 stay"
        );
        assert_eq!(LruMap::<u8, u8>::new(0).capacity, 1);
    }
}

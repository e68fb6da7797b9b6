//! A near cache's memory: the values, bounded by CLOCK (second-chance) eviction
//! (docs/decisions/0018-near-cache-clock-eviction.md), and the recent evictions a lookup in
//! flight is checked against ([`super::Near::begin`], [`super::Near::insert`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A value of a near cache, when it was read from Redis, and whether it was answered since the
/// clock hand last passed it ([`Memory`]).
struct Entry<V> {
    value: V,
    at: Instant,
    used: bool,
    /// Its place in the ring (a key evicted and stored again has a new one; the hand skips
    /// the old).
    slot: u64,
}

/// The values of a near cache. Hashed with foldhash (seeded per process): a page looks up
/// about 40 ids, and SipHash took 2 % of a warm newsfeed page's instructions (callgrind).
type Entries<K, V> = HashMap<K, Entry<V>, foldhash::fast::RandomState>;

/// Evictions remembered key by key: a lookup that began fewer than this many evictions ago
/// refuses only the keys evicted since; an older one refuses everything it found.
const RECENT_EVICTIONS: usize = 4096;

/// The values, and what a lookup in flight needs to know of the evictions since it began.
///
/// **A full memory evicts by CLOCK** (second chance; Corbató, 1968; PostgreSQL's buffer
/// manager sweeps its buffers the same way): the keys stand in a ring in the order they were
/// stored, and an answered value is marked used; to make room, the hand takes keys off the
/// front of the ring, gives a used one a second chance (unmarks it and puts it at the back) and
/// drops the first unused one. So what the pages keep reading stays, and what was stored once
/// and not read since goes, with the whole capacity in use and a few steps per insert. (Before
/// it, a full memory dropped its oldest stored tenth by a scan under the lock, however often
/// those values were read: docs/decisions/0018-near-cache-clock-eviction.md.)
pub(super) struct Memory<K, V> {
    entries: Entries<K, V>,
    /// Keys and their slots in the hand's order; a slot whose key was evicted meanwhile stays
    /// until the hand reaches it.
    ring: std::collections::VecDeque<(K, u64)>,
    /// The next slot.
    slots: u64,
    capacity: usize,
    /// The keys of the latest evictions, each with the eviction count it made, oldest first.
    recent: std::collections::VecDeque<(u64, K)>,
    /// A lookup that began before this eviction count refuses everything: the memory was
    /// cleared since, or evictions after it were dropped from `recent`.
    refuse_before: u64,
}

impl<K: Eq + Hash + Copy, V: Clone> Memory<K, V> {
    /// A memory of at most `capacity` values.
    pub(super) fn new(capacity: usize) -> Self {
        Memory {
            entries: HashMap::default(),
            ring: std::collections::VecDeque::new(),
            slots: 0,
            capacity: capacity.max(1),
            recent: std::collections::VecDeque::new(),
            refuse_before: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The value of `key` if held and read from Redis less than `ttl` before `now`; marks it
    /// used.
    pub(super) fn get(&mut self, key: &K, ttl: Duration, now: Instant) -> Option<V> {
        let entry = self.entries.get_mut(key)?;
        if now.duration_since(entry.at) >= ttl {
            return None;
        }
        entry.used = true;
        Some(entry.value.clone())
    }

    /// Stores `value` read from Redis at `at`, making room first if the memory is full.
    pub(super) fn insert(&mut self, key: K, value: V, at: Instant) {
        if let Some(entry) = self.entries.get_mut(&key) {
            (entry.value, entry.at) = (value, at);
            return;
        }
        while self.entries.len() >= self.capacity && self.sweep() {}
        let (used, slot) = (false, self.slots);
        self.slots += 1;
        self.entries.insert(
            key,
            Entry {
                value,
                at,
                used,
                slot,
            },
        );
        self.ring.push_back((key, slot));
        if self.ring.len() > 2 * self.capacity {
            // Slots of keys evicted meanwhile: rebuilt once per `capacity` of them at most.
            self.ring = (self.entries.iter()).map(|(k, e)| (*k, e.slot)).collect();
        }
    }

    /// Moves the hand until it drops a value; `false` if the ring is empty.
    fn sweep(&mut self) -> bool {
        while let Some((key, slot)) = self.ring.pop_front() {
            match self.entries.get_mut(&key) {
                None => {}                              // evicted meanwhile
                Some(entry) if entry.slot != slot => {} // evicted and stored again since
                Some(entry) if entry.used => {
                    entry.used = false;
                    self.ring.push_back((key, slot));
                }
                Some(_) => {
                    self.entries.remove(&key);
                    return true;
                }
            }
        }
        false
    }

    /// Eviction `count` of `keys`.
    pub(super) fn evict(&mut self, count: u64, keys: &[K]) {
        for key in keys {
            self.entries.remove(key);
            self.recent.push_back((count, *key));
        }
        while self.recent.len() > RECENT_EVICTIONS {
            if let Some((dropped, _)) = self.recent.pop_front() {
                self.refuse_before = self.refuse_before.max(dropped);
            }
        }
    }

    /// Eviction `count` of everything.
    pub(super) fn clear(&mut self, count: u64) {
        self.entries.clear();
        self.ring.clear();
        self.recent.clear();
        self.refuse_before = count;
    }

    /// The keys evicted after eviction count `since` (at most the `now` count); `None` if
    /// they are not all known (the lookup must refuse everything).
    pub(super) fn evicted_since(&self, since: u64, now: u64) -> Option<Vec<K>> {
        if since < self.refuse_before {
            return None;
        }
        if since == now {
            return Some(Vec::new());
        }
        Some(
            (self.recent.iter().rev())
                .take_while(|(count, _)| *count > since)
                .map(|(_, key)| *key)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memory_drops_what_was_not_read_since_the_hand_passed_and_keeps_what_was() {
        let mut memory: Memory<i64, ()> = Memory::new(4);
        let start = Instant::now();
        let ttl = Duration::from_secs(60);
        let held = |m: &Memory<i64, ()>| {
            let mut keys: Vec<i64> = m.entries.keys().copied().collect();
            keys.sort_unstable();
            keys
        };
        for key in 0..4 {
            memory.insert(key, (), start);
        }
        // Read again, 0 and 2 get a second chance: the oldest unread values go instead.
        assert_eq!(memory.get(&0, ttl, start), Some(()));
        assert_eq!(memory.get(&2, ttl, start), Some(()));
        memory.insert(4, (), start);
        assert_eq!(held(&memory), vec![0, 2, 3, 4]);
        memory.insert(5, (), start);
        assert_eq!(held(&memory), vec![0, 2, 4, 5]);
        // Their chance is used up unless they are read again: 2 is, 0 is not.
        assert_eq!(memory.get(&2, ttl, start), Some(()));
        memory.insert(6, (), start);
        memory.insert(7, (), start);
        assert_eq!(held(&memory), vec![2, 5, 6, 7], "0 and 4 went");
        assert_eq!(memory.len(), 4);
        // An evicted key leaves a stale place in the ring, which the hand skips.
        memory.evict(1, &[6]);
        memory.insert(8, (), start);
        assert_eq!(held(&memory), vec![2, 5, 7, 8]);
        memory.insert(9, (), start);
        assert_eq!(held(&memory), vec![2, 7, 8, 9]);
        // A key evicted and stored again takes a new place: the hand skips its old one (next
        // in the ring, after the stale place of 6).
        memory.evict(2, &[7]);
        memory.insert(7, (), start);
        memory.insert(10, (), start);
        assert_eq!(held(&memory), vec![2, 7, 9, 10], "8 went, not the new 7");
        // Evictions and inserts below the capacity keep the ring bounded.
        for _ in 0..100 {
            memory.evict(2, &[9]);
            memory.insert(9, (), start);
        }
        assert!(memory.ring.len() <= 2 * 4, "{}", memory.ring.len());
        // An expired value is not answered.
        assert_eq!(memory.get(&10, ttl, start), Some(()));
        assert_eq!(memory.get(&10, ttl, start + ttl), None);
    }

    #[test]
    fn a_lookup_refuses_only_the_keys_evicted_since_it_began_unless_they_are_not_all_known() {
        let mut memory: Memory<i64, ()> = Memory::new(100);
        memory.evict(1, &[10]);
        assert_eq!(memory.evicted_since(1, 1), Some(vec![]), "nothing since");
        memory.evict(2, &[20, 21]);
        memory.evict(3, &[30]);
        assert_eq!(memory.evicted_since(1, 3), Some(vec![30, 21, 20]));
        assert_eq!(memory.evicted_since(2, 3), Some(vec![30]));
        assert_eq!(memory.evicted_since(0, 3), Some(vec![30, 21, 20, 10]));
        // A clear refuses every lookup that began before it.
        memory.clear(4);
        assert_eq!(memory.evicted_since(3, 4), None);
        assert_eq!(memory.evicted_since(4, 4), Some(vec![]));
        // Evictions dropped from the list refuse the lookups that began before them.
        for count in 5..(5 + RECENT_EVICTIONS as u64 + 2) {
            memory.evict(count, &[count as i64]);
        }
        let last = 5 + RECENT_EVICTIONS as u64 + 1;
        assert_eq!(
            memory.evicted_since(5, last),
            None,
            "eviction 6 is no longer known"
        );
        assert_eq!(
            memory.evicted_since(6, last).map(|k| k.len()),
            Some(RECENT_EVICTIONS)
        );
        assert_eq!(
            memory.evicted_since(last - 1, last),
            Some(vec![last as i64])
        );
    }
}

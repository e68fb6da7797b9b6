//! Page memory: which tweets each timeline page showed the last time this process served it,
//! so that the next read of the same page can prefetch their counters in the range read's round
//! trip ([`crate::cache::Cache::range`]) instead of asking for them in a second one after the
//! range came back. (Counters this process holds in its near cache, [`super::near`], are not
//! asked for at all: on a warm page, none are.)
//!
//! It is only a guess, never an answer: the range read still reads the list, and hydration
//! takes a prefetched counter only for a tweet that is on the page the list gave (a counter read
//! in the range's pipeline is as fresh as one read a round trip later, so the page stays exact).
//! A guess that missed costs the Redis lookups of the counters it named; the tweets it did not
//! name are asked for as before. Timelines change far more slowly than they are read (a warm
//! first page is the same page most of the times it is read), so a warm page mostly needs one
//! round trip to Redis, not two.
//!
//! Bounded: at most [`CAPACITY`] pages of at most [`MAX_IDS`] tweet ids each (about 5 MB for
//! 20,000 pages of 21); when it is full, a new page clears it (the guesses come back with the
//! next reads). Nothing needs invalidating: a stale guess costs lookups, never correctness.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cache::ListKey;

/// Pages a process remembers at most.
pub const CAPACITY: usize = 20_000;

/// Tweet ids one remembered page holds at most (a page is at most 100 items, plus one).
pub const MAX_IDS: usize = 101;

/// A page as requested: the list, the cursors (µs, exclusive) and how many items were asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageShape {
    pub list: ListKey,
    pub lt: Option<i64>,
    pub gt: Option<i64>,
    pub count: usize,
}

/// The page memory of one process (see the module docs).
#[derive(Default)]
pub struct PageMemory {
    pages: Mutex<HashMap<PageShape, Box<[i64]>, foldhash::fast::RandomState>>,
}

impl PageMemory {
    /// The tweet ids `shape` showed last, newest first; empty if not remembered.
    pub fn guess(&self, shape: &PageShape) -> Box<[i64]> {
        let pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        pages.get(shape).cloned().unwrap_or_default()
    }

    /// Remembers that `shape` showed `tweet_ids` (newest first). Cheap when the page did not
    /// change: the ids are compared before anything is stored.
    pub fn remember(&self, shape: PageShape, tweet_ids: &[i64]) {
        if tweet_ids.len() > MAX_IDS {
            return;
        }
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        match pages.get_mut(&shape) {
            Some(held) if **held == *tweet_ids => {}
            Some(held) => *held = tweet_ids.into(),
            None => {
                if pages.len() >= CAPACITY {
                    pages.clear();
                }
                pages.insert(shape, tweet_ids.into());
            }
        }
    }

    /// How many pages are remembered.
    pub fn len(&self) -> usize {
        self.pages.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no page is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Owner;

    fn shape(user: i64) -> PageShape {
        PageShape {
            list: ListKey::new(Owner::User(user), "home"),
            lt: None,
            gt: None,
            count: 21,
        }
    }

    #[test]
    fn a_page_remembers_its_last_tweets_and_the_memory_stays_bounded() {
        let memory = PageMemory::default();
        assert!(memory.guess(&shape(1)).is_empty());
        memory.remember(shape(1), &[30, 20, 10]);
        assert_eq!(&*memory.guess(&shape(1)), &[30, 20, 10]);
        memory.remember(shape(1), &[40, 30, 20]);
        assert_eq!(&*memory.guess(&shape(1)), &[40, 30, 20]);
        let other = PageShape {
            lt: Some(5),
            ..shape(1)
        };
        assert!(
            memory.guess(&other).is_empty(),
            "another cursor is another page"
        );
        memory.remember(shape(2), &(0..=MAX_IDS as i64).collect::<Vec<_>>());
        assert!(memory.guess(&shape(2)).is_empty(), "too long to keep");

        for user in 0..CAPACITY as i64 {
            memory.remember(shape(user + 10), &[user]);
        }
        assert!(memory.len() <= CAPACITY, "cleared when full");
        assert!(!memory.is_empty(), "and filled again");
    }
}

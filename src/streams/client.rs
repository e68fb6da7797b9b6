//! One connected stream client of a process's hub ([`super::hub`]): its bounded queue, why it
//! ended, what a public stream was sent, and which pull sources a `streaming/user` client's
//! user follows ([`PullFollows`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use super::Filter;
use super::hub::{Event, HubStats};

/// Why the hub ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client let its queue fill up.
    FallingBehind,
    /// The process lost its Redis subscription.
    Unavailable,
}

/// One connected client of this process.
#[derive(Debug)]
pub struct Client {
    pub(super) id: u64,
    pub(super) user_id: i64,
    /// `None`: `streaming/user` (the caller's newsfeed arrivals and deletes).
    pub(super) filter: Option<Filter>,
    pub(super) queue: mpsc::Sender<Event>,
    /// 0 while live, else an [`Ended`] code (1 falling behind, 2 unavailable).
    pub(super) ended: AtomicU8,
    /// Wakes the stream when `ended` is set.
    pub wake: Notify,
    /// A public stream's last [`SENT_KEPT`] tweets (tweet and edit events handed to it): their
    /// later edits and their delete reach it whatever its filter says of the new text (a
    /// `track` that matched the first text only).
    pub(super) sent: Mutex<VecDeque<i64>>,
    /// A `streaming/user` client's [`PullFollows`].
    pub(super) pulls: Mutex<Arc<PullFollows>>,
}

/// How many tweets a public stream's [`Client`] remembers it was sent.
pub(super) const SENT_KEPT: usize = 1024;

/// The pull sources ([`crate::hybrid`]) a `streaming/user` client's user follows, as its
/// session last read them (and its hub learned since): which pulled tweets the hub offers it.
/// Its memory is the user's followed pull sources (and those its hub learned of since the
/// read): the list of all of them is shared by every stream that read the same one.
#[derive(Debug, Default, Clone)]
pub struct PullFollows {
    /// The pull sources when read ([`crate::hybrid::PullAuthors::current`]; ascending ids).
    pub(super) authors: Arc<Vec<i64>>,
    /// Those the user follows → the friendship's `visible_from` (µs; `i64::MIN` if none):
    /// their pulled tweets after it are the user's.
    pub(super) follows: HashMap<i64, i64>,
    /// Pull sources not in `authors`, learned since, that the user does not follow.
    pub(super) learned: HashSet<i64>,
}

impl PullFollows {
    /// Of the pull sources `authors`, those the user `follows`, with `visible_from`.
    pub fn new(authors: Arc<Vec<i64>>, follows: &[(i64, Option<crate::time::Timestamp>)]) -> Self {
        let follows = follows
            .iter()
            .map(|(author, from)| (*author, from.map_or(i64::MIN, crate::time::to_micros)))
            .collect();
        PullFollows {
            authors,
            follows,
            learned: HashSet::new(),
        }
    }

    /// Whether the user's newsfeed has `author`'s pulled tweet of entry time `at_us`: `None`
    /// if `author` was not a pull source when this was read.
    pub fn has(&self, author: i64, at_us: i64) -> Option<bool> {
        match self.follows.get(&author) {
            Some(from) => Some(at_us > *from),
            None if self.learned.contains(&author) => Some(false),
            None => self.authors.binary_search(&author).ok().map(|_| false),
        }
    }

    /// Records what Postgres said of `author`: followed since `visible_from` (µs), or not.
    pub(super) fn learn(&mut self, author: i64, visible_from: Option<i64>) {
        match visible_from {
            Some(from) => {
                self.follows.insert(author, from);
                self.learned.remove(&author);
            }
            None => {
                self.follows.remove(&author);
                if self.authors.binary_search(&author).is_err() {
                    self.learned.insert(author);
                }
            }
        }
    }
}

impl Client {
    /// The pull sources this `streaming/user` client's user follows, as last set.
    pub fn pull_follows(&self) -> Arc<PullFollows> {
        let pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        pulls.clone()
    }

    /// Sets the pull sources this `streaming/user` client's user follows.
    pub fn set_pull_follows(&self, follows: PullFollows) {
        let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        *pulls = Arc::new(follows);
    }

    /// Records what Postgres said of one pull source: followed since `visible_from` (µs), or
    /// not (`None`).
    pub(super) fn learn(&self, author: i64, visible_from: Option<i64>) {
        let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        let known = match visible_from {
            Some(from) => pulls.follows.get(&author) == Some(&from),
            None => pulls.has(author, i64::MAX) == Some(false),
        };
        if !known {
            Arc::make_mut(&mut pulls).learn(author, visible_from);
        }
    }

    /// Whether this public stream was sent tweet `id` (among its last [`SENT_KEPT`]).
    pub(super) fn was_sent(&self, id: i64) -> bool {
        let sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.contains(&id)
    }

    /// Records that this public stream was sent tweet `id`.
    pub(super) fn remember_sent(&self, id: i64) {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        if sent.len() == SENT_KEPT {
            sent.pop_front();
        }
        sent.push_back(id);
    }

    /// Why the hub ended this stream, if it did.
    pub fn ended(&self) -> Option<Ended> {
        match self.ended.load(Ordering::Acquire) {
            1 => Some(Ended::FallingBehind),
            2 => Some(Ended::Unavailable),
            _ => None,
        }
    }

    /// Ends the stream (its session sends the last word and stops).
    pub fn end(&self, why: Ended) {
        let code = match why {
            Ended::FallingBehind => 1,
            Ended::Unavailable => 2,
        };
        if self
            .ended
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.wake.notify_one();
        }
    }

    /// Queues `event`; a full queue ends the client (FALLING_BEHIND). Returns whether it was
    /// queued.
    pub(super) fn offer(&self, event: Event, stats: &HubStats) -> bool {
        if self.ended.load(Ordering::Acquire) != 0 {
            return false;
        }
        match self.queue.try_send(event) {
            Ok(()) => {
                stats.queued.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                stats.fell_behind.fetch_add(1, Ordering::Relaxed);
                self.end(Ended::FallingBehind);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stream learns from its hub's reads of a pulled tweet's followers: of a new pull
    /// source, that its user follows it (since when) or not; of a known one, a follow or an
    /// unfollow since the stream read them.
    #[test]
    fn a_stream_learns_whom_its_user_follows_among_the_pull_sources() {
        let mut f = PullFollows::new(Arc::new(vec![1]), &[]);
        assert_eq!((f.has(1, 10), f.has(2, 10)), (Some(false), None));
        f.learn(2, None);
        assert_eq!(f.has(2, 10), Some(false));
        f.learn(2, Some(5));
        assert_eq!((f.has(2, 10), f.has(2, 5)), (Some(true), Some(false)));
        f.learn(1, Some(i64::MIN));
        assert_eq!(f.has(1, 0), Some(true));
        f.learn(1, None);
        assert_eq!(f.has(1, 0), Some(false));
        assert!(f.learned.contains(&2) || f.follows.contains_key(&2));
        assert!(
            !f.learned.contains(&1),
            "a source of the list read is not learned"
        );
    }
}

//! The cached shape of a thread (`{p}:{t<root>}:thread`): which tweets reply to which, the ids
//! the context view ([`crate::replies::context`]) walks, without the tweets themselves (those
//! come from the object caches, so an edit or a new count never touches this key).
//!
//! Versioned like the counters ([`super::counts`]): the thread's `threads.version` is bumped in
//! the transaction of every reply posted or deleted (under that row's lock), the writer stores
//! the shape it read in that transaction with `SET_IF_NEWER` after the commit, and a reader
//! that loaded a miss from Postgres stores what it read with its version the same way, so no
//! slow reader can put back a shape older than a write that answered. The outbox relay writes
//! the floor `"{version}|"` when the writer's step did not land (readers take it for a miss).

use crate::cache::counts::Versioned;
use crate::cache::{Cache, CacheUnavailable};

/// Most replies a cached shape holds; a bigger thread is cached as [`ThreadShape::replies`]
/// `None` and read from Postgres (its context view pages through an index instead).
pub const MAX_CACHED_THREAD: usize = 2000;

/// One tweet of a thread: its id, the id of the tweet it replies to (0 for the thread's first),
/// its time (µs) and its author.
pub type ShapeReply = (i64, i64, i64, i64);

/// A thread's tweets (each reply with the tweet it answers), its first tweet first (unless
/// deleted), then its replies oldest first, with the version they were read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadShape {
    /// `threads.version` when read (0: the thread never had a reply).
    pub version: i64,
    /// Its tweets; `None` if it has more than [`MAX_CACHED_THREAD`].
    pub replies: Option<Vec<ShapeReply>>,
}

impl Versioned for ThreadShape {
    fn version(&self) -> i64 {
        self.version
    }
    /// `"{version}|[[id,parent,µs,author],…]"`, or `"{version}|big"`.
    fn encode(&self) -> String {
        let body = match &self.replies {
            None => "big".to_owned(),
            // Serialising integers can not fail.
            Some(replies) => serde_json::to_string(replies).unwrap_or_else(|_| "big".to_owned()),
        };
        format!("{}|{}", self.version, body)
    }
    fn decode(raw: &str) -> Option<Self> {
        let (version, body) = raw.split_once('|')?;
        let version = version.parse().ok()?;
        let replies = match body {
            "" => return None, // a floor: load it again
            "big" => None,
            json => Some(serde_json::from_str(json).ok()?),
        };
        Some(ThreadShape { version, replies })
    }
}

impl Cache {
    /// The cached shape of the thread whose first tweet is `root` (`None`: not cached).
    ///
    /// # Errors
    /// Redis failed or is off.
    pub async fn get_thread(&self, root: i64) -> Result<Option<ThreadShape>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.thread(root));
        let (raw,): (Option<String>,) = self.run(&pipe).await?;
        Ok(raw.as_deref().and_then(ThreadShape::decode))
    }

    /// Caches a shape loaded from Postgres unless a newer one is cached. Best effort.
    pub async fn put_thread(&self, root: i64, shape: &ThreadShape) {
        let Some(keys) = self.keys() else { return };
        let mut pipe = redis::pipe();
        self.pipe_put_versioned(&mut pipe, keys.thread(root), shape.version, shape.encode());
        let _ = self.run::<()>(&pipe).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_round_trips_and_a_floor_is_a_miss() {
        let shape = ThreadShape {
            version: 3,
            replies: Some(vec![
                (7, 0, 1_763_900_000_000_000, 5),
                (12, 7, 1_763_900_000_000_002, 6),
            ]),
        };
        assert_eq!(
            shape.encode(),
            "3|[[7,0,1763900000000000,5],[12,7,1763900000000002,6]]"
        );
        assert_eq!(ThreadShape::decode(&shape.encode()), Some(shape));
        let big = ThreadShape {
            version: 9,
            replies: None,
        };
        assert_eq!(ThreadShape::decode(&big.encode()), Some(big));
        assert_eq!(ThreadShape::decode("4|"), None, "a floor");
        assert_eq!(ThreadShape::decode("x|[]"), None);
        assert_eq!(ThreadShape::decode("4|[[1,2,3]]"), None);
    }
}

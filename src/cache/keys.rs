//! Typed builders for every Redis key chirp writes, all under `CHIRP_REDIS_PREFIX`.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p}:feed:{user_id}` | sorted set | the user's newsfeed: member `"{newsfeed_id}:{tweet_id}"`, score = created_at in µs |
//! | `{p}:utl:{user_id}` | sorted set | the user's own tweets: member `"{tweet_id}"`, score = created_at in µs |
//! | `{list}:gen` | string (integer) | generation of a list, bumped by every write to it (see `cache::lists`) |
//! | `{p}:tweet:{id}` | string | tweet object JSON, or the tombstone `-` once deleted |
//! | `{p}:user:{id}` | string | `"{version}\|{user JSON}"` |
//! | `{p}:cnt:tweet:{id}`, `{p}:cnt:user:{id}` | string | versioned counts (see `cache::counts`) |
//! | `{p}:token:{sha256 hex}` | string | the user id of a bearer token, or the tombstone `-` |
//! | `{p}:liked:{user_id}` | set | ids of the tweets the user liked, and the marker `#` |

use std::fmt;

/// A cached timeline list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKey {
    /// The newsfeed (home timeline) of a user.
    Newsfeed(i64),
    /// The tweets a user wrote (user timeline).
    UserTweets(i64),
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (e.g. `chirp`).
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// The sorted set of a list.
    pub fn list(&self, list: ListKey) -> String {
        match list {
            ListKey::Newsfeed(id) => format!("{}:feed:{id}", self.prefix),
            ListKey::UserTweets(id) => format!("{}:utl:{id}", self.prefix),
        }
    }

    /// The generation counter of a list.
    pub fn gen_of(list_key: &str) -> String {
        format!("{list_key}:gen")
    }

    /// A tweet object.
    pub fn tweet(&self, id: i64) -> String {
        format!("{}:tweet:{id}", self.prefix)
    }

    /// A user object.
    pub fn user(&self, id: i64) -> String {
        format!("{}:user:{id}", self.prefix)
    }

    /// A bearer token (by the hex SHA-256 it is stored under).
    pub fn token(&self, hash: &[u8]) -> String {
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:token:{hex}", self.prefix)
    }

    /// The set of tweets a user liked.
    pub fn liked(&self, user_id: i64) -> String {
        format!("{}:liked:{user_id}", self.prefix)
    }

    /// The prefix itself (for `SCAN MATCH {prefix}:*`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl fmt::Display for ListKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListKey::Newsfeed(id) => write!(f, "newsfeed of user {id}"),
            ListKey::UserTweets(id) => write!(f, "tweets of user {id}"),
        }
    }
}

//! Typed builders for every Redis key chirp writes, all under `CHIRP_REDIS_PREFIX` (`{p}`).
//!
//! Every key of one owner carries the owner's hash tag (`{u42}` for user 42, `{t17}` for tweet
//! 17), so a list and its generation, and every multi-key command or Lua script on one owner,
//! stay in one Redis Cluster slot. The prefix itself may not contain `{` or `}`.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p}:{u42}:feed` | sorted set | user 42's newsfeed: member `"{newsfeed_id}:{tweet_id}:{author_id}"`, score = `created_at` in µs |
//! | `{p}:{u42}:tweets` | sorted set | user 42's own tweets: member `"{tweet_id}"`, score = `created_at` in µs |
//! | `{p}:{u42}:liked` | set | ids of the tweets user 42 liked, plus the marker `-1` (an integer, so the set stays an intset) |
//! | `{list}:gen` | hash | the generations of a list or set: `w` (bumped by every write), `r` (by every removal) |
//! | `{p}:{u42}:user` | string | `"{version}\|{user JSON}"` |
//! | `{p}:{u42}:cnt` | string | `"{counts_version}\|{followers}\|{followings}\|{tweets}"` |
//! | `{p}:{t17}:tweet` | string | the tweet object JSON, or the tombstone `-` once deleted |
//! | `{p}:{t17}:cnt` | string | `"{counts_version}\|{likes}\|{comments}"` |
//! | `{p}:{k<sha256 hex>}:token` | string | the user id of a bearer token, or the tombstone `-` after logout |
//! | `{p}:epoch` | string | the cache epoch, also kept in Postgres (see [`super::epoch`]) |

use std::fmt;

/// A cached, generation-guarded collection of one user: a timeline list or the liked set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListKey {
    /// The owner's user id (the hash tag `{u<id>}`).
    pub owner: i64,
    /// The collection's name after the hash tag (`feed`, `tweets`, `liked`).
    pub name: &'static str,
}

impl ListKey {
    /// The collection `name` of user `owner`.
    pub const fn new(owner: i64, name: &'static str) -> Self {
        ListKey { owner, name }
    }
}

impl fmt::Display for ListKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of user {}", self.name, self.owner)
    }
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (e.g. `chirp`).
    ///
    /// # Errors
    /// An empty prefix, or one with `{` or `}` (it would move the hash tag), `:` (a prefix
    /// `a` would then own the keys of a prefix `a:b`, e.g. in [`crate::cache::Cache::clear`]) or
    /// a glob character (`*?[]\`).
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        if prefix.is_empty() || prefix.contains(['{', '}', ':', '*', '?', '[', ']', '\\']) {
            anyhow::bail!(
                "CHIRP_REDIS_PREFIX must be non-empty and contain none of {{ }} : * ? [ ] \\"
            );
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
        })
    }

    /// The key of a list or set.
    pub fn list(&self, list: ListKey) -> String {
        format!("{}:{{u{}}}:{}", self.prefix, list.owner, list.name)
    }

    /// The generation hash of a list or set (same slot as the list).
    pub fn gen_of(list_key: &str) -> String {
        format!("{list_key}:gen")
    }

    /// A tweet object.
    pub fn tweet(&self, id: i64) -> String {
        format!("{}:{{t{id}}}:tweet", self.prefix)
    }

    /// A tweet's counts.
    pub fn tweet_counts(&self, id: i64) -> String {
        format!("{}:{{t{id}}}:cnt", self.prefix)
    }

    /// A user object.
    pub fn user(&self, id: i64) -> String {
        format!("{}:{{u{id}}}:user", self.prefix)
    }

    /// A user's profile counts.
    pub fn user_counts(&self, id: i64) -> String {
        format!("{}:{{u{id}}}:cnt", self.prefix)
    }

    /// A bearer token (by the SHA-256 it is stored under).
    pub fn token(&self, hash: &[u8]) -> String {
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{{k{hex}}}:token", self.prefix)
    }

    /// The set of tweets a user liked.
    pub fn liked(&self, user_id: i64) -> String {
        self.list(ListKey::new(user_id, LIKED))
    }

    /// The cache epoch (see [`super::epoch`]).
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }

    /// The prefix itself (for `SCAN MATCH {prefix}:*`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// The name of a user's liked set.
pub const LIKED: &str = "liked";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_one_owner_shares_its_hash_tag() {
        let keys = Keys::new("p").unwrap();
        let feed = keys.list(ListKey::new(42, "feed"));
        assert_eq!(feed, "p:{u42}:feed");
        assert_eq!(Keys::gen_of(&feed), "p:{u42}:feed:gen");
        assert_eq!(keys.liked(42), "p:{u42}:liked");
        assert_eq!(keys.user(42), "p:{u42}:user");
        assert_eq!(keys.user_counts(42), "p:{u42}:cnt");
        assert_eq!(keys.tweet(7), "p:{t7}:tweet");
        assert_eq!(keys.tweet_counts(7), "p:{t7}:cnt");
        assert_eq!(keys.token(&[0xab, 0x01]), "p:{kab01}:token");
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("a:b").is_err());
        assert!(Keys::new("a*").is_err());
        assert!(Keys::new("").is_err());
    }
}

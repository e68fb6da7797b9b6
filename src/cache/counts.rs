//! Cached counters: `likes_count` / `comments_count` of tweets and the profile counts of users.
//!
//! Postgres is the truth: each count is a denormalized column changed atomically
//! (`set likes_count = likes_count + 1, counts_version = counts_version + 1 ... returning`) in
//! the transaction of the write that causes it. Redis holds `"{version}|{count}|{count}..."` per
//! object, written with [`scripts::SET_IF_NEWER`](super::scripts::SET_IF_NEWER) both by writers
//! (after the commit, with the values and version their `update` returned) and by readers that
//! load a miss from Postgres. Redis never increments anything, so:
//! - a missing key never turns into a count of 1 (the `INCR` on a missing key bug);
//! - a reader that loaded an old count before a write committed can not put it back over the
//!   write's newer version (the lost increment of refill-while-incrementing);
//! - every value is set with the TTL (no immortal counters).
//!
//! A write whose update can not reach Redis invalidates the key through the outbox.

use crate::cache::{Cache, CacheUnavailable, scripts};

/// Whose counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CountsOf {
    /// `[likes_count, comments_count]` of a tweet.
    Tweet(i64),
    /// `[followers_count, followings_count, tweets_count]` of a user.
    User(i64),
}

/// A versioned set of counts (see [`CountsOf`] for the order of `values`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub version: i64,
    pub values: Vec<i64>,
}

impl Counts {
    fn encode(&self) -> String {
        let mut s = self.version.to_string();
        for v in &self.values {
            s.push('|');
            s.push_str(&v.to_string());
        }
        s
    }

    fn decode(raw: &str) -> Option<Self> {
        let mut parts = raw.split('|').map(|p| p.parse::<i64>());
        let version = parts.next()?.ok()?;
        let values = parts.collect::<Result<Vec<_>, _>>().ok()?;
        Some(Counts { version, values })
    }

    /// Value `i`, 0 if absent.
    pub fn get(&self, i: usize) -> i64 {
        self.values.get(i).copied().unwrap_or(0)
    }
}

impl Cache {
    /// The key of a set of counts (`{p}:cnt:tweet:{id}`, `{p}:cnt:user:{id}`); `None` when off.
    pub fn counts_key(&self, of: CountsOf) -> Option<String> {
        let keys = self.keys()?;
        Some(match of {
            CountsOf::Tweet(id) => format!("{}:cnt:tweet:{id}", keys.prefix()),
            CountsOf::User(id) => format!("{}:cnt:user:{id}", keys.prefix()),
        })
    }

    /// Adds the `MGET` of these counts to a pipeline (see [`Cache::get_tweets`]).
    pub(crate) fn pipe_get_counts(&self, pipe: &mut redis::Pipeline, of: &[CountsOf]) {
        let names: Vec<String> = of.iter().filter_map(|o| self.counts_key(*o)).collect();
        pipe.cmd("MGET").arg(names);
    }

    pub(crate) fn decode_counts(values: Vec<Option<String>>) -> Vec<Option<Counts>> {
        values
            .into_iter()
            .map(|v| v.as_deref().and_then(Counts::decode))
            .collect()
    }

    /// Cached counts, in order (`None`: not cached).
    pub async fn get_counts(
        &self,
        of: &[CountsOf],
    ) -> Result<Vec<Option<Counts>>, CacheUnavailable> {
        if of.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        self.pipe_get_counts(&mut pipe, of);
        let (values,): (Vec<Option<String>>,) = self.run(&pipe).await?;
        Ok(Self::decode_counts(values))
    }

    /// Adds a versioned set of counts to a pipeline.
    pub(crate) fn pipe_put_counts(
        &self,
        pipe: &mut redis::Pipeline,
        of: CountsOf,
        counts: &Counts,
    ) {
        let (Some(key), Some(ttl)) = (self.counts_key(of), self.ttl()) else {
            return;
        };
        pipe.invoke_script(
            scripts::SET_IF_NEWER
                .key(key)
                .arg(counts.version)
                .arg(counts.encode())
                .arg(ttl),
        )
        .ignore();
    }

    /// Caches counts loaded from Postgres unless newer ones are cached. Best effort.
    pub async fn put_counts(&self, items: &[(CountsOf, Counts)]) {
        if items.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for (of, counts) in items {
            self.pipe_put_counts(&mut pipe, *of, counts);
        }
        let _ = self.run::<()>(&pipe).await;
    }
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn counts_round_trip_through_their_encoding() {
        let c = Counts {
            version: 7,
            values: vec![3, 0, 12],
        };
        assert_eq!(c.encode(), "7|3|0|12");
        assert_eq!(Counts::decode("7|3|0|12"), Some(c));
        assert_eq!(Counts::decode("7|x"), None);
    }
}

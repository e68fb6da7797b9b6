//! Cached counters: `likes_count` / `comments_count` / `replies_count` / `retweets_count` of tweets and the profile counts of users.
//!
//! Postgres is the truth: each count is a denormalized column changed atomically
//! (`set likes_count = likes_count + 1, counts_version = counts_version + 1 ... returning`) in
//! the transaction of the write that causes it. Redis holds `"{version}|{count}|{count}..."` per
//! object, written with [`scripts::SET_IF_NEWER`] both by writers (after the commit, with the
//! values and version their `update` returned) and by readers that load a miss from Postgres.
//! Redis never increments anything, so:
//! - a missing key never turns into a count of 1 (the `INCR` on a missing key bug);
//! - a reader that loaded an old count before a write committed can not put it back over the
//!   write's newer version (the lost increment of refill-while-incrementing);
//! - every value is set with the TTL (no immortal counters).

use crate::cache::{Cache, CacheUnavailable, scripts};
use crate::model::{TweetCounts, UserCounts};

/// Counts stored as `"{version}|{a}|{b}..."`.
pub trait Versioned: Sized {
    /// The version that orders writes of these counts.
    fn version(&self) -> i64;
    /// The cached form.
    fn encode(&self) -> String;
    /// Parses the cached form; `None` if malformed.
    fn decode(raw: &str) -> Option<Self>;
}

/// Parses exactly `N` `|`-separated decimal integers. Byte by byte: a page decodes one value
/// per tweet, and `str::split` with `str::parse` cost about 360 instructions each (callgrind).
fn numbers<const N: usize>(raw: &str) -> Option<[i64; N]> {
    let mut out = [0; N];
    let mut parts = raw.as_bytes().split(|b| *b == b'|');
    for slot in &mut out {
        *slot = integer(parts.next()?)?;
    }
    parts.next().is_none().then_some(out)
}

/// A decimal integer with an optional `-`; `None` if empty, not digits, or out of range.
fn integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(d - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

impl Versioned for TweetCounts {
    fn version(&self) -> i64 {
        self.version
    }
    fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.version, self.likes, self.comments, self.replies, self.retweets
        )
    }
    fn decode(raw: &str) -> Option<Self> {
        let [version, likes, comments, replies, retweets] = numbers(raw)?;
        Some(TweetCounts {
            likes,
            comments,
            replies,
            retweets,
            version,
        })
    }
}

impl Versioned for UserCounts {
    fn version(&self) -> i64 {
        self.version
    }
    fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.version, self.followers, self.followings, self.tweets
        )
    }
    fn decode(raw: &str) -> Option<Self> {
        let [version, followers, followings, tweets] = numbers(raw)?;
        Some(UserCounts {
            followers,
            followings,
            tweets,
            version,
        })
    }
}

impl Cache {
    /// Adds a versioned write of `counts` under `key` to a pipeline.
    pub(crate) fn pipe_put_versioned(
        &self,
        pipe: &mut redis::Pipeline,
        key: String,
        version: i64,
        value: String,
    ) {
        let Some(ttl) = self.ttl() else { return };
        pipe.invoke_script(
            scripts::SET_IF_NEWER
                .key(key)
                .arg(version)
                .arg(value)
                .arg(ttl),
        )
        .ignore();
    }

    /// [`Cache::pipe_put_versioned`] of many `(key, version, value)` in as few script calls as
    /// the deployment allows: one on a single Redis, one per hash slot on a cluster.
    pub(crate) fn pipe_put_versioned_many(
        &self,
        pipe: &mut redis::Pipeline,
        mut puts: Vec<(String, i64, String)>,
    ) {
        let Some(ttl) = self.ttl() else { return };
        if self.is_cluster() {
            puts.sort_by_key(|(key, _, _)| super::conn::key_slot(key.as_bytes()));
        }
        let mut rest = puts.as_slice();
        while let Some((first, _, _)) = rest.first() {
            let slot = super::conn::key_slot(first.as_bytes());
            let n = match self.is_cluster() {
                true => rest
                    .iter()
                    .take_while(|(key, _, _)| super::conn::key_slot(key.as_bytes()) == slot)
                    .count(),
                false => rest.len(),
            };
            let (group, tail) = rest.split_at(n);
            let mut inv = scripts::SET_IF_NEWER_EACH.prepare_invoke();
            inv.arg(ttl);
            for (key, version, value) in group {
                inv.key(key).arg(*version).arg(value);
            }
            pipe.invoke_script(&inv).ignore();
            rest = tail;
        }
    }

    /// A user's cached profile counts (`None`: not cached).
    pub async fn get_user_counts(&self, id: i64) -> Result<Option<UserCounts>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.user_counts(id));
        let (raw,): (Option<String>,) = self.run(&pipe).await?;
        Ok(raw.as_deref().and_then(UserCounts::decode))
    }

    /// Caches a user's counts loaded from Postgres unless newer ones are cached. Best effort.
    pub async fn put_user_counts(&self, id: i64, counts: &UserCounts) {
        let Some(keys) = self.keys() else { return };
        let mut pipe = redis::pipe();
        self.pipe_put_versioned(
            &mut pipe,
            keys.user_counts(id),
            counts.version,
            counts.encode(),
        );
        let _ = self.run::<()>(&pipe).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_through_their_encoding() {
        let c = UserCounts {
            followers: 3,
            followings: 0,
            tweets: 12,
            version: 7,
        };
        assert_eq!(c.encode(), "7|3|0|12");
        assert_eq!(UserCounts::decode("7|3|0|12"), Some(c));
        assert_eq!(UserCounts::decode("7|x"), None);
        assert_eq!(TweetCounts::decode("7|3|0"), None, "wrong arity");
        let t = TweetCounts {
            likes: 2,
            comments: 5,
            replies: 4,
            retweets: 6,
            version: 9,
        };
        assert_eq!(TweetCounts::decode(&t.encode()), Some(t));
    }

    #[test]
    fn numbers_parse_like_str_parse_and_refuse_anything_else() {
        assert_eq!(
            numbers::<3>("0|-12|9223372036854775807"),
            Some([0, -12, i64::MAX])
        );
        assert_eq!(numbers::<1>("-9223372036854775808"), Some([i64::MIN]));
        for bad in [
            "",
            "|1",
            "1||2",
            "1|2|",
            "1|+2",
            "1|2 ",
            "1|9223372036854775808",
            "1|-",
            "1|2|3|4",
        ] {
            let parsed = numbers::<2>(bad);
            assert_eq!(parsed, None, "{bad:?}");
        }
        assert_eq!(numbers::<2>("1|2"), Some([1, 2]));
    }
}

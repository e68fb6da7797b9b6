//! Per-object caches used for hydration: tweet objects (immutable until deleted, then a
//! tombstone) and user objects (versioned, so a slow reader can not put back an old profile).

use crate::cache::counts::{Counts, CountsOf};
use std::collections::HashSet;

use crate::cache::{Cache, CacheUnavailable, Keys, scripts};
use crate::tweets::{TweetRecord, TweetRow};
use crate::users::UserRecord;

/// The value a deleted tweet's object key holds, so no reader can cache the tweet again.
pub const TOMBSTONE: &str = "-";

/// What the cache knows of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached<T> {
    /// Not cached (or unreadable): ask Postgres.
    Miss,
    /// Known to be deleted.
    Deleted,
    /// Cached.
    Hit(T),
}

impl Cache {
    /// Tweet objects and their counts for `ids`, in order, in one round trip (two `MGET`s in
    /// one pipeline).
    pub async fn get_tweets(
        &self,
        ids: &[i64],
    ) -> Result<(Vec<Cached<TweetRecord>>, Vec<Option<Counts>>), CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let names: Vec<String> = ids.iter().map(|id| keys.tweet(*id)).collect();
        let counts: Vec<CountsOf> = ids.iter().map(|id| CountsOf::Tweet(*id)).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(&names);
        self.pipe_get_counts(&mut pipe, &counts);
        let (values, counts): (Vec<Option<String>>, Vec<Option<String>>) = self.run(&pipe).await?;
        let tweets = values.into_iter().map(decode_tweet).collect();
        Ok((tweets, Self::decode_counts(counts)))
    }

    /// Caches tweets and counts loaded from Postgres (`SET NX`: a tombstone written meanwhile
    /// wins; counts only if newer) and tombstones for ids Postgres did not have. Best effort.
    pub async fn put_tweets(&self, rows: &[TweetRow], missing: &[i64]) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let mut pipe = redis::pipe();
        for row in rows {
            let Ok(json) = serde_json::to_string(&row.record) else {
                continue;
            };
            pipe.cmd("SET")
                .arg(keys.tweet(row.record.id))
                .arg(json)
                .arg("NX")
                .arg("EX")
                .arg(ttl)
                .ignore();
            self.pipe_put_counts(&mut pipe, CountsOf::Tweet(row.record.id), &row.counts());
        }
        for id in missing {
            pipe.cmd("SET")
                .arg(keys.tweet(*id))
                .arg(TOMBSTONE)
                .arg("EX")
                .arg(ttl)
                .ignore();
        }
        let _ = self.run::<()>(&pipe).await;
    }

    /// User objects for `ids`, in order, in one `MGET`.
    pub async fn get_users(
        &self,
        ids: &[i64],
    ) -> Result<Vec<Option<UserRecord>>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = ids.iter().map(|id| keys.user(*id)).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(&names);
        let (values,): (Vec<Option<String>>,) = self.run(&pipe).await?;
        Ok(values.into_iter().map(decode_user).collect())
    }

    /// Caches users loaded from Postgres unless a newer version is cached. Best effort.
    pub async fn put_users(&self, rows: &[UserRecord]) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        if rows.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for row in rows {
            let Ok(json) = serde_json::to_string(row) else {
                continue;
            };
            pipe.invoke_script(
                scripts::SET_IF_NEWER
                    .key(keys.user(row.id))
                    .arg(row.version)
                    .arg(format!("{}|{json}", row.version))
                    .arg(ttl),
            )
            .ignore();
        }
        let _ = self.run::<()>(&pipe).await;
    }
}

/// What the cache knows of a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedToken {
    /// Not cached: ask Postgres.
    Miss,
    /// Revoked (logout).
    Revoked,
    /// Valid for this user.
    User(i64),
}

impl Cache {
    /// The user a token (by hash) belongs to, if cached.
    pub async fn get_token(&self, hash: &[u8]) -> Result<CachedToken, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.token(hash));
        let (value,): (Option<String>,) = self.run(&pipe).await?;
        Ok(match value.as_deref() {
            None => CachedToken::Miss,
            Some(TOMBSTONE) => CachedToken::Revoked,
            Some(id) => id.parse().map_or(CachedToken::Miss, CachedToken::User),
        })
    }

    /// Caches a token loaded from Postgres (`SET NX`: a revocation written meanwhile wins).
    pub async fn put_token(&self, hash: &[u8], user_id: i64) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(keys.token(hash))
            .arg(user_id)
            .arg("NX")
            .arg("EX")
            .arg(ttl)
            .ignore();
        let _ = self.run::<()>(&pipe).await;
    }

    /// Which of `tweet_ids` `user` liked, from the user's cached liked set in one round trip
    /// (`SMISMEMBER`); `None` if the set is not cached.
    pub async fn liked_among(
        &self,
        user: i64,
        tweet_ids: &[i64],
    ) -> Result<Option<HashSet<i64>>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("SMISMEMBER")
            .arg(keys.liked(user))
            .arg("#")
            .arg(tweet_ids);
        let (flags,): (Vec<bool>,) = self.run(&pipe).await?;
        Ok(liked_from_flags(tweet_ids, flags))
    }

    /// The generation of a user's liked set, read before loading it from Postgres.
    pub async fn liked_generation(&self, user: i64) -> Result<Option<String>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(Keys::gen_of(&keys.liked(user)));
        let (value,): (Option<String>,) = self.run(&pipe).await?;
        Ok(value)
    }

    /// Stores a user's liked set loaded from Postgres unless it exists or changed since
    /// `generation` was read. Best effort.
    pub async fn fill_liked(&self, user: i64, generation: Option<&str>, tweet_ids: &[i64]) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let key = keys.liked(user);
        let mut inv = scripts::SET_FILL.key(&key);
        inv.key(Keys::gen_of(&key))
            .arg(generation.unwrap_or(""))
            .arg(ttl);
        for id in tweet_ids {
            inv.arg(*id);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv).ignore();
        let _ = self.run::<()>(&pipe).await;
    }
}

/// Everything one hydration round trip found, in the order asked.
#[derive(Debug, Default)]
pub struct Fetched {
    pub tweets: Vec<Cached<TweetRecord>>,
    pub counts: Vec<Option<Counts>>,
    pub users: Vec<Option<UserRecord>>,
    /// Which of the tweets the viewer liked; `None` without a viewer or if the viewer's liked
    /// set is not cached.
    pub liked: Option<HashSet<i64>>,
}

/// Decodes `SMISMEMBER liked '#' ids...`: `None` if the set is not cached (no marker), else the
/// liked ids.
fn liked_from_flags(tweet_ids: &[i64], flags: Vec<bool>) -> Option<HashSet<i64>> {
    let mut flags = flags.into_iter();
    if flags.next() != Some(true) {
        return None;
    }
    Some(
        tweet_ids
            .iter()
            .zip(flags)
            .filter(|(_, f)| *f)
            .map(|(id, _)| *id)
            .collect(),
    )
}

fn decode_tweet(v: Option<String>) -> Cached<TweetRecord> {
    match v.as_deref() {
        None => Cached::Miss,
        Some(TOMBSTONE) => Cached::Deleted,
        Some(json) => serde_json::from_str(json).map_or(Cached::Miss, Cached::Hit),
    }
}

fn decode_user(v: Option<String>) -> Option<UserRecord> {
    let (_, json) = v.as_deref()?.split_once('|')?;
    serde_json::from_str(json).ok()
}

impl Cache {
    /// Tweet objects, their counts, the authors and the viewer's likes of them, in one pipeline.
    pub async fn fetch_for_hydration(
        &self,
        tweet_ids: &[i64],
        user_ids: &[i64],
        viewer: Option<i64>,
    ) -> Result<Fetched, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        if tweet_ids.is_empty() {
            return Ok(Fetched::default());
        }
        let counts: Vec<CountsOf> = tweet_ids.iter().map(|id| CountsOf::Tweet(*id)).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(
            tweet_ids
                .iter()
                .map(|id| keys.tweet(*id))
                .collect::<Vec<_>>(),
        );
        self.pipe_get_counts(&mut pipe, &counts);
        pipe.cmd("MGET")
            .arg(user_ids.iter().map(|id| keys.user(*id)).collect::<Vec<_>>());
        if let Some(v) = viewer {
            pipe.cmd("SMISMEMBER")
                .arg(keys.liked(v))
                .arg("#")
                .arg(tweet_ids);
        }
        let mut values: Vec<redis::Value> = self.run::<Vec<redis::Value>>(&pipe).await?;
        values.reverse();
        let mut next = |what: &str| -> Result<redis::Value, CacheUnavailable> {
            values.pop().ok_or_else(|| {
                tracing::warn!(what, "short pipeline reply");
                CacheUnavailable
            })
        };
        let strings = |v: redis::Value| {
            redis::from_redis_value::<Vec<Option<String>>>(v).map_err(|_| CacheUnavailable)
        };
        let tweets = strings(next("tweets")?)?
            .into_iter()
            .map(decode_tweet)
            .collect();
        let counts = Self::decode_counts(strings(next("counts")?)?);
        let users = strings(next("users")?)?
            .into_iter()
            .map(decode_user)
            .collect();
        let liked = match viewer {
            None => None,
            Some(_) => {
                let flags = redis::from_redis_value::<Vec<bool>>(next("liked")?)
                    .map_err(|_| CacheUnavailable)?;
                liked_from_flags(tweet_ids, flags)
            }
        };
        Ok(Fetched {
            tweets,
            counts,
            users,
            liked,
        })
    }
}

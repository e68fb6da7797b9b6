//! The cache consistency checker (`chirp check-cache`): compares every cached list, object and
//! counter under the prefix with Postgres and lists the differences. Run it on a quiet system
//! (after load stops, jobs drained and the outbox relayed) — or let it re-check: a key that
//! differs is read again (Redis and Postgres) after [`RECHECK_AFTER`], and only a difference that
//! persists is reported, so writes in flight do not count.
//!
//! What is compared, key by key (see [`crate::cache::keys`]):
//! - timelines (`{u…}:feed`, `{u…}:posts`, `{l…}:items`, `{c…}:items`): a complete list must
//!   hold exactly the timeline's entries in Postgres (row id, tweet id and time to the µs); an
//!   incomplete one exactly those at or above its floor (its lowest entry's time);
//! - tweet objects: equal to the row, or the tombstone exactly when the row is gone;
//! - user objects and tweet and user counts: not older than the row's version, and equal at
//!   the same version (a relay's floor `"{version}|"` is a miss and passes);
//! - tokens: the user of the live token, or the tombstone exactly when no token has the hash;
//! - liked sets: every tweet the user likes, and no other live tweet;
//! - hidden sets (mutes and blocks): not older than `users.hidden_version`, and equal to
//!   Postgres's at the same version.
//!
//! Generations, ranks, chat backlogs, rate limits and acknowledgements are counted as not
//! compared.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use crate::cache::counts::Versioned;
use crate::cache::liked::{LIKED_MARKER, TOO_MANY_MARKER};
use crate::cache::lists::entry_time;
use crate::cache::objects::{
    Cached, CachedTweet, TOMBSTONE, decode_stored_tweet, decode_stored_user,
};
use crate::cache::{Cache, CacheUnavailable};
use crate::model::{TweetCounts, UserCounts, UserRecord};
use crate::timeline::{ListEntry, Timeline};

/// How long the checker waits before reading a differing key again.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// What one cached key is, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Timeline(Timeline),
    Tweet(i64),
    TweetCounts(i64),
    User(i64),
    UserCounts(i64),
    Token(Vec<u8>),
    Liked(i64),
    Hidden(i64),
    /// Generations, ranks, backlogs, limits, acknowledgements, the epoch.
    Other,
}

impl Kind {
    fn label(&self) -> &'static str {
        match self {
            Kind::Timeline(Timeline::Newsfeed(_)) => "newsfeeds",
            Kind::Timeline(Timeline::UserTweets(_)) => "user tweets",
            Kind::Timeline(Timeline::List(_)) => "list timelines",
            Kind::Timeline(Timeline::Circle(_)) => "circle tweets",
            Kind::Timeline(Timeline::Pulled(_)) => "pulled tweets",
            Kind::Timeline(Timeline::Hashtag(_)) => "hashtag tweets",
            Kind::Tweet(_) => "tweet objects",
            Kind::TweetCounts(_) => "tweet counts",
            Kind::User(_) => "user objects",
            Kind::UserCounts(_) => "user counts",
            Kind::Token(_) => "tokens",
            Kind::Liked(_) => "liked sets",
            Kind::Hidden(_) => "hidden sets",
            Kind::Other => "not compared",
        }
    }
}

/// Classifies `key` (`{prefix}:{tag}:{name}`).
fn classify(prefix: &str, key: &str) -> Kind {
    let Some((tag, name)) = key
        .strip_prefix(prefix)
        .and_then(|k| k.strip_prefix(":{"))
        .and_then(|k| k.split_once("}:"))
    else {
        return Kind::Other;
    };
    let id = |p: &str| tag.strip_prefix(p).and_then(|n| n.parse::<i64>().ok());
    match (name, tag.as_bytes().first()) {
        ("feed", Some(b'u')) => {
            id("u").map_or(Kind::Other, |u| Kind::Timeline(Timeline::Newsfeed(u)))
        }
        ("posts", Some(b'u')) => {
            id("u").map_or(Kind::Other, |u| Kind::Timeline(Timeline::UserTweets(u)))
        }
        ("pulled", Some(b'u')) => {
            id("u").map_or(Kind::Other, |u| Kind::Timeline(Timeline::Pulled(u)))
        }
        ("items", Some(b'l')) => id("l").map_or(Kind::Other, |l| Kind::Timeline(Timeline::List(l))),
        ("items", Some(b'c')) => {
            id("c").map_or(Kind::Other, |c| Kind::Timeline(Timeline::Circle(c)))
        }
        ("items", Some(b'h')) => {
            id("h").map_or(Kind::Other, |h| Kind::Timeline(Timeline::Hashtag(h)))
        }
        ("tweetv4", Some(b't')) => id("t").map_or(Kind::Other, Kind::Tweet),
        ("cnt3", Some(b't')) => id("t").map_or(Kind::Other, Kind::TweetCounts),
        ("user", Some(b'u')) => id("u").map_or(Kind::Other, Kind::User),
        ("cnt", Some(b'u')) => id("u").map_or(Kind::Other, Kind::UserCounts),
        ("liked", Some(b'u')) => id("u").map_or(Kind::Other, Kind::Liked),
        ("hidden", Some(b'u')) => id("u").map_or(Kind::Other, Kind::Hidden),
        ("token", Some(b'k')) => tag
            .strip_prefix('k')
            .and_then(from_hex)
            .map_or(Kind::Other, Kind::Token),
        _ => Kind::Other,
    }
}

fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One cached key that disagrees with Postgres.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The Redis key.
    pub key: String,
    /// What differs.
    pub detail: String,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Keys compared, per kind (`"newsfeeds"`, `"tweet objects"`, …, and `"not compared"`).
    pub checked: BTreeMap<&'static str, usize>,
    /// Differences that persisted after [`RECHECK_AFTER`].
    pub differences: Vec<Difference>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (kind, n) in &self.checked {
            writeln!(f, "{kind:>16}: {n}")?;
        }
        for d in self.differences.iter().take(50) {
            writeln!(f, "DIFFERENCE {}: {}", d.key, d.detail)?;
        }
        write!(f, "{} differences", self.differences.len())
    }
}

/// Compares every cached key under the prefix with Postgres (see the module docs).
///
/// # Errors
/// Redis or Postgres could not be read (a cache that can not be read can not be wrong).
pub async fn run(db: &PgPool, cache: &Cache) -> anyhow::Result<Report> {
    let prefix = cache
        .keys()
        .context("the cache is off")?
        .prefix()
        .to_owned();
    let unavailable = |_: CacheUnavailable| anyhow::anyhow!("redis unavailable");
    let mut scan = cache
        .scan(format!("{prefix}:*"))
        .await
        .map_err(unavailable)?;
    let mut report = Report::default();
    let mut suspects = Vec::new();
    while let Some(keys) = scan.next().await.map_err(unavailable)? {
        let kinds: Vec<(String, Kind)> = keys
            .into_iter()
            .map(|k| {
                let kind = classify(&prefix, &k);
                (k, kind)
            })
            .collect();
        for (_, kind) in &kinds {
            *report.checked.entry(kind.label()).or_default() += 1;
        }
        let compared = kinds
            .into_iter()
            .filter(|(_, k)| *k != Kind::Other)
            .collect();
        suspects.extend(compare(db, cache, compared).await?);
    }
    if !suspects.is_empty() {
        tokio::time::sleep(RECHECK_AFTER).await;
        let again: Vec<(String, Kind)> = suspects
            .into_iter()
            .map(|d| {
                let kind = classify(&prefix, &d.key);
                (d.key, kind)
            })
            .collect();
        report.differences = compare(db, cache, again).await?;
    }
    Ok(report)
}

/// What Redis holds under one key, as read by the checker.
enum Stored {
    Missing,
    Text(String),
    Scored(Vec<(Vec<u8>, i64)>),
    Set(Vec<i64>),
}

async fn read(cache: &Cache, kinds: &[(String, Kind)]) -> anyhow::Result<Vec<Stored>> {
    let mut pipe = redis::pipe();
    for (key, kind) in kinds {
        match kind {
            Kind::Timeline(_) => pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES"),
            Kind::Liked(_) => pipe.cmd("SMEMBERS").arg(key),
            _ => pipe.cmd("GET").arg(key),
        };
    }
    let values: Vec<redis::Value> = cache
        .run_unchecked(&pipe, kinds.len())
        .await
        .map_err(|_| anyhow::anyhow!("redis unavailable"))?;
    Ok(kinds
        .iter()
        .zip(values)
        .map(|((_, kind), value)| decode(kind, value))
        .collect())
}

fn decode(kind: &Kind, value: redis::Value) -> Stored {
    use redis::FromRedisValue;
    match kind {
        Kind::Timeline(_) => match Vec::<(Vec<u8>, String)>::from_redis_value(value) {
            Ok(pairs) if pairs.is_empty() => Stored::Missing,
            Ok(pairs) => Stored::Scored(
                pairs
                    .into_iter()
                    .map(|(m, s)| (m, s.parse::<f64>().map_or(i64::MIN, |f| f as i64)))
                    .collect(),
            ),
            Err(_) => Stored::Missing,
        },
        Kind::Liked(_) => match Vec::<i64>::from_redis_value(value) {
            Ok(v) if v.is_empty() => Stored::Missing,
            Ok(v) => Stored::Set(v),
            Err(_) => Stored::Missing,
        },
        _ => match Option::<String>::from_redis_value(value) {
            Ok(Some(text)) => Stored::Text(text),
            _ => Stored::Missing,
        },
    }
}

/// The differences among `kinds` (Redis read first, then Postgres).
async fn compare(
    db: &PgPool,
    cache: &Cache,
    kinds: Vec<(String, Kind)>,
) -> anyhow::Result<Vec<Difference>> {
    if kinds.is_empty() {
        return Ok(Vec::new());
    }
    let stored = read(cache, &kinds).await?;
    let tweet_ids: Vec<i64> = kinds
        .iter()
        .filter_map(|(_, k)| match k {
            Kind::Tweet(id) | Kind::TweetCounts(id) => Some(*id),
            _ => None,
        })
        .collect();
    let user_ids: Vec<i64> = kinds
        .iter()
        .filter_map(|(_, k)| match k {
            Kind::User(id) | Kind::UserCounts(id) => Some(*id),
            _ => None,
        })
        .collect();
    let tweets: HashMap<i64, crate::tweets::TweetRow> = crate::tweets::rows_by_ids(db, &tweet_ids)
        .await?
        .into_iter()
        .map(|r| (r.record.id, r))
        .collect();
    let users = users_by_ids(db, &user_ids).await?;
    let mut out = Vec::new();
    let mut differ = |key: &str, detail: String| {
        out.push(Difference {
            key: key.to_owned(),
            detail,
        })
    };
    let limit = cache.list_limit();
    for ((key, kind), stored) in kinds.iter().zip(stored) {
        let Stored::Missing = stored else {
            match (kind, stored) {
                (Kind::Timeline(t), Stored::Scored(items)) => {
                    if let Some(d) = compare_timeline(db, *t, items, limit).await? {
                        differ(key, d);
                    }
                }
                (Kind::Tweet(id), Stored::Text(v)) => {
                    match (decode_stored_tweet(&v), tweets.get(id)) {
                        (Cached::Deleted, Some(_)) => {
                            differ(key, "tombstone of a live tweet".into())
                        }
                        (Cached::Hit(_), None) => differ(key, "object of a deleted tweet".into()),
                        (Cached::Hit(c), Some(row)) if c != CachedTweet::of(&row.record) => {
                            differ(key, "object differs from the row".into())
                        }
                        // A floor (a late edit's repair): a miss for readers.
                        (Cached::Miss, _) if v.ends_with('|') => {}
                        (Cached::Miss, _) => differ(key, format!("unreadable value {v:?}")),
                        _ => {}
                    }
                }
                (Kind::TweetCounts(id), Stored::Text(v)) => {
                    if let Some(row) = tweets.get(id)
                        && let Some(d) = compare_counts::<TweetCounts>(&v, &row.counts)
                    {
                        differ(key, d);
                    }
                }
                (Kind::User(id), Stored::Text(v)) => {
                    match (decode_stored_user(&v), users.get(id)) {
                        (_, None) => differ(key, "object of a missing user".into()),
                        (None, _) if v.ends_with('|') => {}
                        (None, _) => differ(key, format!("unreadable value {v:?}")),
                        (Some(cached), Some((row, _))) => {
                            if cached.version < row.version {
                                differ(
                                    key,
                                    format!("version {} < {}", cached.version, row.version),
                                );
                            } else if cached != *row {
                                differ(key, "object differs from the row".into());
                            }
                        }
                    }
                }
                (Kind::UserCounts(id), Stored::Text(v)) => {
                    if let Some((_, counts)) = users.get(id)
                        && let Some(d) = compare_counts::<UserCounts>(&v, counts)
                    {
                        differ(key, d);
                    }
                }
                (Kind::Token(hash), Stored::Text(v)) => {
                    let owner: Option<i64> =
                        sqlx::query_scalar("select user_id from auth_tokens where token_hash = $1")
                            .bind(hash)
                            .fetch_optional(db)
                            .await?;
                    match (v.as_str(), owner) {
                        (TOMBSTONE, Some(_)) => differ(key, "tombstone of a live token".into()),
                        (TOMBSTONE, None) => {}
                        (user, owner) if user.parse::<i64>().ok() != owner => {
                            differ(key, format!("user {user}, Postgres says {owner:?}"))
                        }
                        _ => {}
                    }
                }
                (Kind::Hidden(user), Stored::Text(v)) => {
                    let row = crate::blocks::load_hidden(db, *user).await?;
                    match crate::blocks::Hidden::decode(&v) {
                        None if v.ends_with('|') => {}
                        None => differ(key, format!("unreadable value {v:?}")),
                        Some(cached) if cached.version < row.version => {
                            differ(key, format!("version {} < {}", cached.version, row.version))
                        }
                        Some(cached) if cached.version == row.version && cached != row => {
                            differ(key, "set differs from Postgres's".into())
                        }
                        Some(_) => {}
                    }
                }
                (Kind::Liked(user), Stored::Set(members)) => {
                    if let Some(d) = compare_liked(db, *user, &members).await? {
                        differ(key, d);
                    }
                }
                _ => {}
            }
            continue;
        };
    }
    Ok(out)
}

async fn users_by_ids(
    db: &PgPool,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, (UserRecord, UserCounts)>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        user: UserRecord,
        #[sqlx(flatten)]
        counts: UserCounts,
    }
    let rows: Vec<Row> = sqlx::query_as(concat!(
        "select ",
        crate::user_record_columns!(),
        ", followers_count, followings_count, tweets_count, counts_version
             from users where id = any($1)"
    ))
    .bind(ids)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.user.id, (r.user, r.counts)))
        .collect())
}

/// A cached `"{version}|…"` against the row's counts.
fn compare_counts<C: Versioned + PartialEq + fmt::Debug>(stored: &str, row: &C) -> Option<String> {
    let Some(cached) = C::decode(stored) else {
        // The relay's floor `"{version}|"` is a miss.
        let floor = stored.strip_suffix('|').and_then(|v| v.parse::<i64>().ok());
        return match floor {
            Some(v) if v <= row.version() => None,
            _ => Some(format!("unreadable value {stored:?}")),
        };
    };
    if cached.version() < row.version() {
        Some(format!(
            "version {} < {} (a lost write-through)",
            cached.version(),
            row.version()
        ))
    } else if cached.version() == row.version() && cached != *row {
        Some(format!("{cached:?} != {row:?} at the same version"))
    } else if cached.version() > row.version() {
        Some(format!("version {} > {}", cached.version(), row.version()))
    } else {
        None
    }
}

async fn compare_timeline(
    db: &PgPool,
    timeline: Timeline,
    items: Vec<(Vec<u8>, i64)>,
    limit: usize,
) -> anyhow::Result<Option<String>> {
    let complete = items.iter().any(|(m, _)| m == b"#");
    // (row id, tweet id, time in µs) of each entry.
    let mut cached: Vec<(i64, i64, i64)> = Vec::with_capacity(items.len());
    for (member, score) in items.iter().filter(|(m, _)| m != b"#") {
        let entry = timeline
            .parse(member)
            .zip(entry_time(*score, member))
            .map(|(m, at)| (m.id, m.tweet_id, at));
        match entry {
            Some(e) => cached.push(e),
            None => return Ok(Some(format!("unreadable member {member:?}"))),
        }
    }
    let floor = cached
        .iter()
        .map(|e| e.2)
        .min()
        .map(crate::time::from_micros);
    let mut truth = timeline
        .entries(db, None, limit.max(cached.len()) + 1)
        .await?;
    if !complete {
        match floor {
            Some(f) => truth.retain(|e| e.created_at >= f),
            None => truth.clear(),
        }
    }
    let key = |e: &ListEntry| (e.id, e.tweet_id, crate::time::to_micros(e.created_at));
    let have: HashSet<_> = cached.iter().copied().collect();
    let want: HashSet<_> = truth.iter().map(key).collect();
    let extra = have.difference(&want).count();
    let missing = want.difference(&have).count();
    Ok((extra + missing > 0).then(|| {
        format!(
            "{} entries cached{}, {missing} missing, {extra} not in Postgres",
            cached.len(),
            if complete { " (complete)" } else { "" }
        )
    }))
}

async fn compare_liked(db: &PgPool, user: i64, members: &[i64]) -> anyhow::Result<Option<String>> {
    if members.contains(&TOO_MANY_MARKER) {
        return Ok(None);
    }
    if !members.contains(&LIKED_MARKER) {
        return Ok(Some("liked set without its marker".into()));
    }
    let truth: HashSet<i64> =
        sqlx::query_scalar::<_, i64>("select tweet_id from tweet_likes where user_id = $1")
            .bind(user)
            .fetch_all(db)
            .await?
            .into_iter()
            .collect();
    let have: HashSet<i64> = members.iter().copied().filter(|m| *m > 0).collect();
    // A deleted tweet's likes go with it in Postgres; a member naming it is never asked for.
    let extra: Vec<i64> = have.difference(&truth).copied().collect();
    let live: Vec<i64> = sqlx::query_scalar("select id from tweets where id = any($1)")
        .bind(&extra)
        .fetch_all(db)
        .await?;
    let (extra, missing) = (live.len(), truth.difference(&have).count());
    Ok((extra + missing > 0).then(|| format!("{missing} likes missing, {extra} not in Postgres")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_classified_by_tag_and_name() {
        let p = "p";
        assert_eq!(
            classify(p, "p:{u42}:feed"),
            Kind::Timeline(Timeline::Newsfeed(42))
        );
        assert_eq!(
            classify(p, "p:{u42}:posts"),
            Kind::Timeline(Timeline::UserTweets(42))
        );
        assert_eq!(
            classify(p, "p:{l7}:items"),
            Kind::Timeline(Timeline::List(7))
        );
        assert_eq!(
            classify(p, "p:{c3}:items"),
            Kind::Timeline(Timeline::Circle(3))
        );
        assert_eq!(classify(p, "p:{t9}:tweetv4"), Kind::Tweet(9));
        assert_eq!(
            classify(p, "p:{t9}:tweet"),
            Kind::Other,
            "an older build's key"
        );
        assert_eq!(classify(p, "p:{t9}:cnt3"), Kind::TweetCounts(9));
        assert_eq!(classify(p, "p:{u4}:user"), Kind::User(4));
        assert_eq!(classify(p, "p:{u4}:cnt"), Kind::UserCounts(4));
        assert_eq!(classify(p, "p:{u4}:liked"), Kind::Liked(4));
        assert_eq!(classify(p, "p:{u4}:hidden"), Kind::Hidden(4));
        assert_eq!(
            classify(p, "p:{kab01}:token"),
            Kind::Token(vec![0xab, 0x01])
        );
        assert_eq!(classify(p, "p:{u42}:feed:gen"), Kind::Other);
        assert_eq!(classify(p, "p:{ch5}:msgs"), Kind::Other);
        assert_eq!(classify(p, "p:{c3d20261122}:rank"), Kind::Other);
        assert_eq!(classify(p, "p:epoch"), Kind::Other);
    }
}

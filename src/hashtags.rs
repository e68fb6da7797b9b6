//! Hashtags: `#tag` in a tweet's text, each tag's tweets as one more cached timeline
//! (`Timeline::Hashtag`, read from `tweet_hashtags`), and trends. Every SQL statement on
//! `hashtags` and `tweet_hashtags` lives here.
//!
//! **Tags.** A tweet's hashtags are a function of its text ([`parse`], Twitter's rule: `#` not
//! preceded by a letter, digit, `_` or `&`, then letters, digits and `_` with at least one
//! letter), so the `hashtags` of a `Tweet` object are derived when it is built and an edit changes
//! them with the text. `tweet_hashtags` indexes them for the timelines and the trends.
//!
//! **Timelines.** A post locks its tags' rows (in name order, after its author's and circle's
//! rows) and takes its time above each tag's newest tweet, so one tag's tweets commit in the order
//! of their times and a refresh from the newest one a client holds misses none (as a circle's:
//! docs/decisions/0024-hashtag-timelines-and-trends.md). A tag an edit adds lists the tweet at
//! its own (older) time, which a client that already refreshed past it does not get (the list
//! timelines' late-arrival exception). Known gap: a post's merge into a tag's cached list is not
//! guarded by the list's removal generation, so a post whose cache step reaches Redis only
//! through the outbox relay, after an edit took the tag away and a reader refilled the list,
//! lists the tweet there until the list is next dropped (a page then shows a tweet whose text
//! lacks the tag).
//!
//! **Trends.** Mastodon's rule (`Trends::Tags`): a tag's score in a window (the last hour or
//! day) is `(observed - expected)² / expected` where `observed` is the number of distinct
//! accounts that used it in the window and `expected` the number in the window before it
//! (at least 1); a tag is listed when `observed >= 3` and `observed > expected`. Counted from
//! Postgres ([`trends_at`]) by one process of the fleet at a time, at most every
//! [`TRENDS_MAX_AGE`], and shared through Redis ([`Trends`]), so a post shows within a second and
//! the ranking is Postgres's by construction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Mutex;

use crate::cache::Cache;
use crate::entities::{self, Grammar};
use crate::error::{ApiError, ApiResult};
use crate::time::Timestamp;
use crate::timeline::{FeedRow, ListEntry};

/// Fewest distinct accounts in the window for a tag to trend (the v3 contract's floor).
pub const MIN_ACCOUNTS: i64 = 3;
/// Most trends listed.
pub const MAX_TRENDS: usize = 20;
/// How long a process answers trends from the ranking it last counted (a post shows within
/// this plus one count's time).
pub const TRENDS_MAX_AGE: Duration = Duration::from_millis(500);
/// Most characters of a tag in a path (`GET /api/hashtags/{tag}/tweets/`): a tweet holds at
/// most 280.
pub const MAX_TAG_CHARS: usize = 280;

/// How a hashtag is written: `#` (or `＃`), then letters, digits and `_`; not right after a
/// letter, digit, `_` or `&`.
const HASHTAG: Grammar = Grammar {
    sigils: ['#', '＃'],
    body: tag_char,
    joins: joins_tag,
};

/// Whether `c` may be part of a tag.
fn tag_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether a `#` right after `c` is part of a word (`a#b`, the entity `&#38;`).
fn joins_tag(c: char) -> bool {
    tag_char(c) || c == '&'
}

/// The hashtags of `content`: each `#tag` (letters, digits and `_`, at least one letter; not
/// right after a letter, digit, `_` or `&`, so `a#b` and `&#38;` are none), lowercased,
/// without repeats, in order of first use.
pub fn parse(content: &str) -> Vec<String> {
    let tags = entities::scan(content, &HASHTAG)
        .filter(|body| body.chars().any(char::is_alphabetic))
        .map(str::to_lowercase);
    entities::distinct(tags, usize::MAX)
}

/// The tag of a path (`GET /api/hashtags/{tag}/tweets/`): with or without its `#`, any case;
/// lowercased. `None` unless it is one tag as [`parse`] reads them (a path no tweet can list).
pub fn parse_path_tag(raw: &str) -> Option<String> {
    let body = (raw.strip_prefix('#').or_else(|| raw.strip_prefix('＃'))).unwrap_or(raw);
    let valid = body.chars().count() <= MAX_TAG_CHARS
        && body.chars().all(tag_char)
        && body.chars().any(char::is_alphabetic);
    valid.then(|| body.to_lowercase())
}

/// One tag of a tweet being posted: its id and the time of its newest tweet (if any), read under
/// its row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct TagHead {
    pub id: i64,
    pub newest: Option<Timestamp>,
}

/// Creates the rows of `tags` that do not exist and locks all of them, in name order (every
/// writer takes them in that order, after its author's and its circle's rows: no two posts wait
/// for each other in a cycle); returns each tag's id and newest tweet, in the order of `tags`.
///
/// # Errors
/// Postgres failed.
pub(crate) async fn lock(tx: &mut PgConnection, tags: &[String]) -> sqlx::Result<Vec<TagHead>> {
    if tags.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted: Vec<&str> = tags.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let ids: Vec<(String, i64)> = sqlx::query_as(
        "insert into hashtags (name) select n from unnest($1::text[]) n order by n
         on conflict (name) do update set name = excluded.name
         returning name, id",
    )
    .bind(&sorted)
    .fetch_all(&mut *tx)
    .await?;
    let ids: HashMap<String, i64> = ids.into_iter().collect();
    let ordered: Vec<i64> = tags.iter().filter_map(|t| ids.get(t).copied()).collect();
    sqlx::query_as(
        "select h.id, (select created_at from tweet_hashtags where hashtag_id = h.id
                       order by created_at desc limit 1) as newest
         from unnest($1::bigint[]) with ordinality h(id, n) order by h.n",
    )
    .bind(&ordered)
    .fetch_all(tx)
    .await
}

/// Lists tweet `tweet_id` of `user_id`, posted at `created_at`, under the tags `ids`.
///
/// # Errors
/// Postgres failed.
pub(crate) async fn insert_rows(
    tx: &mut PgConnection,
    tweet_id: i64,
    user_id: i64,
    created_at: Timestamp,
    ids: &[i64],
) -> sqlx::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into tweet_hashtags (hashtag_id, tweet_id, user_id, created_at)
         select unnest($1::bigint[]), $2, $3, $4 on conflict do nothing",
    )
    .bind(ids)
    .bind(tweet_id)
    .bind(user_id)
    .bind(created_at)
    .execute(tx)
    .await?;
    Ok(())
}

/// Unlists tweet `tweet_id` from the tags named `names` (all of its tags if `None`); returns
/// the ids of the tags it was listed under.
///
/// # Errors
/// Postgres failed.
pub(crate) async fn delete_rows(
    tx: &mut PgConnection,
    tweet_id: i64,
    names: Option<&[String]>,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(
        "delete from tweet_hashtags
         where tweet_id = $1
           and ($2::text[] is null
                or hashtag_id in (select id from hashtags where name = any($2)))
         returning hashtag_id",
    )
    .bind(tweet_id)
    .bind(names)
    .fetch_all(tx)
    .await
}

/// The id of tag `name` (lowercase), if any tweet ever used it.
///
/// # Errors
/// Postgres failed.
pub async fn id_of(db: &PgPool, name: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("select id from hashtags where name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Tag ids by name as this process read them (`GET /api/hashtags/{tag}/tweets/` would otherwise
/// ask Postgres for the id on every page): an id is never reused for another name while the
/// database lives, so a name found stays right; each is kept [`TAG_IDS_SECS`] (a `chirp import
/// --reset` renumbers them), at most [`TAG_IDS_HELD`] (emptied when full). Unknown names are
/// not kept (any post may create them).
#[derive(Debug, Default)]
pub struct TagIds(std::sync::Mutex<HashMap<String, (i64, Instant)>>);

/// Most tag ids a process keeps.
pub const TAG_IDS_HELD: usize = 100_000;
/// How long a process keeps a tag's id, in seconds.
pub const TAG_IDS_SECS: u64 = 60;

impl TagIds {
    /// The id of tag `name` (lowercase), if any tweet ever used it.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn get(&self, db: &PgPool, name: &str) -> sqlx::Result<Option<i64>> {
        let keep = Duration::from_secs(TAG_IDS_SECS);
        if let Ok(ids) = self.0.lock()
            && let Some((id, at)) = ids.get(name)
            && at.elapsed() < keep
        {
            return Ok(Some(*id));
        }
        let id = id_of(db, name).await?;
        if let (Some(id), Ok(mut ids)) = (id, self.0.lock()) {
            if ids.len() >= TAG_IDS_HELD {
                ids.clear();
            }
            ids.insert(name.to_owned(), (id, Instant::now()));
        }
        Ok(id)
    }
}

/// Whether tag `id` exists.
///
/// # Errors
/// Postgres failed.
pub async fn exists(db: &PgPool, id: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar("select exists (select 1 from hashtags where id = $1)")
        .bind(id)
        .fetch_one(db)
        .await
}

/// The newest `limit` entries of tag `id`'s tweets older than `lt` (if given), for filling the
/// cache.
///
/// # Errors
/// Postgres failed.
pub async fn timeline_entries(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = "select tweet_id as id, tweet_id, user_id as author_id, created_at
         from tweet_hashtags
         where hashtag_id = $1 and created_at < coalesce($2, 'infinity')
         order by created_at desc limit $3";
    crate::timeline::fetch_entries(db, sql, id, lt, limit).await
}

/// A page of tag `id`'s tweets strictly between the cursors, hydrated in the same query.
///
/// # Errors
/// Postgres failed.
pub async fn timeline_page(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = concat!(
        "select t.id as entry_id, t.created_at,",
        crate::feed_row_columns!(),
        "from tweet_hashtags h join tweets t on t.id = h.tweet_id
         join users u on u.id = t.user_id
         where h.hashtag_id = $1
           and h.created_at < coalesce($2, 'infinity') and h.created_at > coalesce($3, '-infinity')
         order by h.created_at desc limit $4"
    );
    crate::timeline::fetch_page(db, sql, id, lt, gt, limit).await
}

/// A trends window: the last hour or the last day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    Hour,
    Day,
}

impl Window {
    /// The window of `?window=` (`1h` or `24h`; default `1h`).
    ///
    /// # Errors
    /// 400 on `window` for anything else.
    pub fn parse(raw: Option<&str>) -> ApiResult<Self> {
        match raw.map(str::trim) {
            None | Some("" | "1h") => Ok(Window::Hour),
            Some("24h") => Ok(Window::Day),
            Some(_) => Err(ApiError::field("window", "Use 1h or 24h.")),
        }
    }

    /// Its name in the query and in Redis: `1h`, `24h`.
    pub fn name(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
        }
    }

    /// Its length.
    pub fn length(self) -> TimeDelta {
        match self {
            Window::Hour => TimeDelta::hours(1),
            Window::Day => TimeDelta::hours(24),
        }
    }
}

/// One trending tag: `{"hashtag", "accounts", "tweets", "score"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Trend {
    /// The tag, lowercase, without `#`.
    pub hashtag: String,
    /// Distinct accounts that used it in the window.
    pub accounts: i64,
    /// Tweets with it in the window.
    pub tweets: i64,
    /// `(accounts - expected)² / expected`, `expected` being the distinct accounts of the
    /// window before (at least 1).
    pub score: f64,
}

/// Mastodon's score of a tag used by `observed` accounts in a window and `previous` in the
/// window before it; `None` if it does not trend (fewer than [`MIN_ACCOUNTS`], or not above
/// what was expected).
pub fn score(observed: i64, previous: i64) -> Option<f64> {
    let expected = previous.max(1) as f64;
    let observed_f = observed as f64;
    (observed >= MIN_ACCOUNTS && observed_f > expected)
        .then(|| (observed_f - expected).powi(2) / expected)
}

/// Ranks `(tag, accounts, tweets, previous accounts)` counts: by score, then accounts, then
/// tag; at most [`MAX_TRENDS`].
pub fn rank(counts: impl IntoIterator<Item = (String, i64, i64, i64)>) -> Vec<Trend> {
    let mut trends: Vec<Trend> = counts
        .into_iter()
        .filter_map(|(hashtag, accounts, tweets, previous)| {
            Some(Trend {
                score: score(accounts, previous)?,
                hashtag,
                accounts,
                tweets,
            })
        })
        .collect();
    trends.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.accounts.cmp(&a.accounts))
            .then_with(|| a.hashtag.cmp(&b.hashtag))
    });
    trends.truncate(MAX_TRENDS);
    trends
}

/// The trends of `window` ending at `now` (and the uses stamped after it: a tag's newest plus
/// 1 µs, or another host's clock), counted from Postgres: two range scans of
/// `tweet_hashtags_created_idx` (the window and the one before it).
///
/// # Errors
/// Postgres failed.
pub async fn trends_at(db: &PgPool, window: Window, now: Timestamp) -> sqlx::Result<Vec<Trend>> {
    let start = now - window.length();
    let before = start - window.length();
    let counts: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "with cur as (
             select hashtag_id, count(distinct user_id) as accounts, count(*) as tweets
             from tweet_hashtags where created_at > $2
             group by hashtag_id having count(distinct user_id) >= $3),
         prev as (
             select hashtag_id, count(distinct user_id) as accounts
             from tweet_hashtags
             where created_at > $1 and created_at <= $2 and hashtag_id in (select hashtag_id from cur)
             group by hashtag_id)
         select h.name, cur.accounts, cur.tweets, coalesce(prev.accounts, 0)
         from cur join hashtags h on h.id = cur.hashtag_id
         left join prev on prev.hashtag_id = cur.hashtag_id",
    )
    .bind(before)
    .bind(start)
    .bind(MIN_ACCOUNTS)
    .fetch_all(db)
    .await?;
    Ok(rank(counts))
}

/// The trends as this process last read them, with the fleet's shared count in Redis behind
/// them ([`crate::cache::trends`]): a window's ranking is served from this process's memory while
/// fresh, else from Redis while fresh there, else counted from Postgres by the one process that
/// takes the count's lock (the others wait for its result, at most [`TRENDS_LOCK_WAIT`], then
/// count themselves). Fresh means counted within [`TRENDS_MAX_AGE`]. A ranking that is no
/// longer fresh but younger than [`TRENDS_MAX_STALE`] is still answered while one task reads
/// the next in the background (stale-while-revalidate: no reader waits for a count then); an
/// older one, or none, is waited for. Without Redis each process counts for itself, one count
/// at a time.
#[derive(Debug, Default)]
pub struct Trends {
    windows: std::sync::Mutex<HashMap<Window, Held>>,
    /// Held by the one task of this process that reads a new ranking.
    counting: Mutex<()>,
}

/// A ranking in a process's memory.
#[derive(Debug, Clone)]
struct Held {
    trends: Arc<Vec<Trend>>,
    /// Answered as it is until then.
    fresh_until: Instant,
    /// Answered while a new one is read until then.
    stale_until: Instant,
    /// A task is reading the next one.
    refreshing: bool,
}

/// How long a process waits for another's count of a window before it counts itself.
pub const TRENDS_LOCK_WAIT: Duration = Duration::from_secs(1);
/// How old a ranking (from the start of its count) may be answered while the next is read.
pub const TRENDS_MAX_STALE: Duration = Duration::from_secs(1);

impl Trends {
    /// The trends of `window`: counted within the last [`TRENDS_MAX_AGE`], or within
    /// [`TRENDS_MAX_STALE`] while a newer count runs.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn get(
        self: &Arc<Self>,
        db: &PgPool,
        cache: &Cache,
        window: Window,
    ) -> sqlx::Result<Arc<Vec<Trend>>> {
        if let Some(trends) = self.held(db, cache, window) {
            return Ok(trends);
        }
        // Too old or none: wait for one count (this process's readers that come meanwhile
        // take its result).
        let _counting = self.counting.lock().await;
        if let Some(trends) = self.held(db, cache, window) {
            return Ok(trends);
        }
        let started = Instant::now();
        let (trends, fresh) = shared_count(db, cache, window).await?;
        Ok(self.keep(window, trends, started, fresh))
    }

    /// The held ranking of `window` if it may be answered, starting its refresh if it is no
    /// longer fresh.
    fn held(
        self: &Arc<Self>,
        db: &PgPool,
        cache: &Cache,
        window: Window,
    ) -> Option<Arc<Vec<Trend>>> {
        let now = Instant::now();
        let mut windows = self.windows.lock().ok()?;
        let held = windows.get_mut(&window)?;
        if now < held.fresh_until {
            return Some(held.trends.clone());
        }
        if now >= held.stale_until {
            return None;
        }
        if !held.refreshing {
            held.refreshing = true;
            let (this, db, cache) = (self.clone(), db.clone(), cache.clone());
            tokio::spawn(async move {
                let _counting = this.counting.lock().await;
                let started = Instant::now();
                match shared_count(&db, &cache, window).await {
                    Ok((trends, fresh)) => {
                        this.keep(window, trends, started, fresh);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "counting the trends failed");
                        if let Ok(mut windows) = this.windows.lock()
                            && let Some(held) = windows.get_mut(&window)
                        {
                            held.refreshing = false;
                        }
                    }
                }
            });
        }
        Some(held.trends.clone())
    }

    /// Holds a ranking whose count started at `started` (or that Redis held, fresh for
    /// `fresh` more).
    fn keep(
        &self,
        window: Window,
        trends: Vec<Trend>,
        started: Instant,
        fresh: Duration,
    ) -> Arc<Vec<Trend>> {
        let trends = Arc::new(trends);
        let fresh_until = (started + fresh).min(Instant::now() + fresh);
        let held = Held {
            trends: trends.clone(),
            fresh_until,
            stale_until: fresh_until + TRENDS_MAX_STALE.saturating_sub(TRENDS_MAX_AGE),
            refreshing: false,
        };
        if let Ok(mut windows) = self.windows.lock() {
            windows.insert(window, held);
        }
        trends
    }
}

/// The fleet's count of `window` and how long it stays fresh: from Redis (what is left of its
/// TTL), or counted here
/// under the count's lock (stored for the others), or counted here without it (Redis failed,
/// or the lock's holder did not store a count within [`TRENDS_LOCK_WAIT`]).
async fn shared_count(
    db: &PgPool,
    cache: &Cache,
    window: Window,
) -> sqlx::Result<(Vec<Trend>, Duration)> {
    let name = window.name();
    let deadline = Instant::now() + TRENDS_LOCK_WAIT;
    loop {
        match cache.cached_trends(name).await {
            Ok(Some((json, fresh))) => {
                if let Ok(trends) = serde_json::from_str::<Vec<Trend>>(&json) {
                    return Ok((trends, fresh.min(TRENDS_MAX_AGE)));
                }
            }
            Ok(None) => {}
            Err(_) => break,
        }
        match cache.lock_trends(name, TRENDS_LOCK_WAIT).await {
            Ok(true) => {
                // Fresh for TRENDS_MAX_AGE from the count's start, in Redis as here: a ranking
                // read back from Redis is not younger than its count.
                let started = Instant::now();
                let trends = match trends_at(db, window, chrono::Utc::now()).await {
                    Ok(trends) => trends,
                    Err(e) => {
                        let _ = cache.unlock_trends(name).await;
                        return Err(e);
                    }
                };
                let fresh = TRENDS_MAX_AGE.saturating_sub(started.elapsed());
                match serde_json::to_string(&trends) {
                    Ok(json) if !fresh.is_zero() => {
                        let _ = cache.store_trends(name, &json, fresh).await;
                    }
                    _ => {
                        let _ = cache.unlock_trends(name).await;
                    }
                }
                return Ok((trends, fresh));
            }
            Ok(false) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(false) | Err(_) => break,
        }
    }
    Ok((
        trends_at(db, window, chrono::Utc::now()).await?,
        TRENDS_MAX_AGE,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_lowercase_unique_and_in_order() {
        assert_eq!(
            parse("#Rust and #rust, #Tokio_1! #42 #_x a#b &#38; (#Ünïcode) #日本"),
            ["rust", "tokio_1", "_x", "ünïcode", "日本"]
        );
        assert_eq!(parse("#"), Vec::<String>::new());
        assert_eq!(parse("##a #b#c"), ["a", "b"]);
        assert_eq!(parse("＃fullwidth"), ["fullwidth"]);
    }

    #[test]
    fn path_tags() {
        assert_eq!(parse_path_tag("#Rust").as_deref(), Some("rust"));
        assert_eq!(parse_path_tag("rust_2").as_deref(), Some("rust_2"));
        assert_eq!(parse_path_tag("＃Tag").as_deref(), Some("tag"));
        assert_eq!(parse_path_tag("42"), None);
        assert_eq!(parse_path_tag("a-b"), None);
        assert_eq!(parse_path_tag(""), None);
    }

    #[test]
    fn mastodons_score() {
        assert_eq!(score(2, 0), None); // too few accounts
        assert_eq!(score(3, 0), Some(4.0)); // expected 1
        assert_eq!(score(3, 3), None); // not above expected
        assert_eq!(score(6, 2), Some(8.0));
        let ranked = rank([
            ("b".to_owned(), 3, 9, 0),
            ("a".to_owned(), 3, 3, 0),
            ("c".to_owned(), 10, 10, 5),
            ("d".to_owned(), 2, 2, 0),
        ]);
        let names: Vec<&str> = ranked.iter().map(|t| t.hashtag.as_str()).collect();
        assert_eq!(names, ["c", "a", "b"]);
    }
}

//! Hybrid timelines (Twitter's push/pull split of its home timelines; Silberstein et al.,
//! "Feeding Frenzy: Selectively Materializing Users' Event Feeds", SIGMOD 2010): the tweets of
//! an author with more than `CHIRP_FANOUT_PULL_ABOVE` followers are not fanned out (no
//! newsfeed row per follower); each follower's newsfeed reads them at read time, beside its
//! fan-out rows, with the same cursors ([`crate::newsfeeds::page`]).
//!
//! **Which tweets are pulled.** A compose decides for its tweet, under the author's row lock
//! ([`count_tweet`]): an author above the threshold becomes a pull source (`has_pulled`, in the
//! set every newsfeed read consults: [`PullAuthors`]), and its tweets are pulled once every process
//! has re-read that set since (`CHIRP_FANOUT_PULL_SETTLE_MS`); below
//! `CHIRP_FANOUT_PULL_BELOW` (hysteresis) its tweets are fanned out again. A tweet keeps the
//! way it was posted: its rows, or its `pulled` flag, never both (but the author's own row and
//! a follow's backfill: see below), so a crossing in either direction repeats nothing and
//! leaves no hole.
//!
//! **Exact refresh across both kinds.** A newsfeed entry's time is its place in the newsfeed
//! (docs/decisions/0001): whoever sees an entry must already see every older one, or a refresh
//! with `created_at__gt` misses it. Fan-out rows keep that under their newsfeed's head lock; a
//! pulled tweet has no per-reader lock, so one global clock orders the two kinds
//! (`pull_clock`): every writer of newsfeed entries stamps them above the newest pulled tweet
//! and, last before its commit, [`check`]s under the clock's lock (shared) that they still lie
//! above it (else it rolls back and stamps again) and waits for the database clock to pass
//! them; a pulled tweet is stamped under the lock held exclusively (in `tweets::create`'s
//! insert), above the newest pulled tweet and the database clock. So an entry committed before
//! a pulled tweet is older than it, and one committed after is newer; and a pulled compose
//! waits only for writers in their last statement and commit, never for a whole fan-out
//! batch. A follow records `visible_from` (the same clock): the followee's pulled tweets up to
//! it are copied by the follow's backfill (stamped above the newsfeed's head, as in pure
//! fan-out), later ones are pulled. docs/decisions/0004-hybrid-timelines.md.
//!
//! **Cached reads.** Each pull source's pulled tweets are one cached list that all its readers
//! merge with their own rows, checked against one small Postgres snapshot per page
//! ([`crate::newsfeeds::read`], docs/decisions/0005-cached-pulled-reads.md).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use crate::config::Config;
use crate::model::{UserCounts, UserRecord};

/// When a compose pulls its tweet instead of fanning it out (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullPolicy {
    /// Followers above which an author's tweets are pulled (`CHIRP_FANOUT_PULL_ABOVE`).
    pub above: i64,
    /// Followers below which a pulled author is fanned out again (`CHIRP_FANOUT_PULL_BELOW`).
    pub below: i64,
    /// How long an author that crossed `above` waits before its tweets are pulled
    /// (`CHIRP_FANOUT_PULL_SETTLE_MS`): a process re-reads the pulled authors at least twice
    /// in it ([`PullAuthors`]).
    pub settle: Duration,
}

impl PullPolicy {
    /// The policy of `config` (`below` defaults to 90% of `above`, and is at most `above`).
    pub fn from_config(config: &Config) -> Self {
        let above = i64::try_from(config.fanout_pull_above).unwrap_or(i64::MAX);
        let below = config
            .fanout_pull_below
            .map_or(above - above / 10, |b| i64::try_from(b).unwrap_or(i64::MAX))
            .min(above);
        PullPolicy {
            above,
            below,
            settle: Duration::from_millis(config.fanout_pull_settle_ms),
        }
    }
}

/// Counts a new tweet of `author` (`tweets_count` + 1, a new `counts_version`) and decides
/// whether it is pulled, in one statement that takes the author's row lock (held until the
/// commit: one author's composes decide in turn). With `may_pull` (a tweet that is neither a
/// reply nor a retweet) it also moves the author between the modes: above `policy.above`
/// followers an author becomes a pull source (pending), its next compose starts the settle
/// time, and tweets posted after it are pulled; below `policy.below` they are fanned out
/// again. Returns the author's new counts (for the cache), whether the tweet is pulled (never
/// without `may_pull`) and the author's row (the new tweet object's author, so the compose
/// needs no load of it after its commit).
///
/// One statement, not a count and then a decision (one round trip fewer; BENCHMARKS.md, round
/// 30, resolved no latency change from it). The `SET` clause reads the row as it was, the
/// `RETURNING` clause as it is now.
///
/// # Errors
/// Postgres failed; `RowNotFound` if `author` does not exist.
pub async fn count_tweet(
    tx: &mut PgConnection,
    policy: &PullPolicy,
    author: i64,
    may_pull: bool,
) -> sqlx::Result<(UserCounts, bool, UserRecord)> {
    #[derive(sqlx::FromRow)]
    struct Counted {
        #[sqlx(flatten)]
        counts: UserCounts,
        pulled: bool,
        #[sqlx(flatten)]
        author: UserRecord,
    }
    let settle_us = i64::try_from(policy.settle.as_micros()).unwrap_or(i64::MAX);
    let counted: Counted = sqlx::query_as(concat!(
        "update users set
             tweets_count = tweets_count + 1,
             counts_version = counts_version + 1,
             pull_from = case
                 when not $5 then pull_from
                 when pull_from is null and followers_count > $2 then 'infinity'
                 when pull_from is not null and followers_count < $3 then null
                 when pull_from = 'infinity' then clock_timestamp() + $4 * interval '1 microsecond'
                 else pull_from end,
             has_pulled = has_pulled or ($5 and pull_from is null and followers_count > $2)
         where id = $1
         returning followers_count, followings_count, tweets_count, counts_version,
                   $5 and coalesce(pull_from <= clock_timestamp(), false) as pulled, ",
        crate::user_record_columns!()
    ))
    .bind(author)
    .bind(policy.above)
    .bind(policy.below)
    .bind(settle_us)
    .bind(may_pull)
    .fetch_one(tx)
    .await?;
    Ok((counted.counts, counted.pulled, counted.author))
}

/// Takes the `pull-clock` lock shared, for the rest of the transaction, before the caller
/// stamps entries: its [`check`] then cannot fail. A writer's retry after [`check`] failed
/// (pulled tweets kept committing while it stamped) does this, so it makes progress. Take the
/// newsfeed heads the writer stamps first ([`crate::newsfeeds::lock_heads`]): every
/// transaction takes heads before the clock.
///
/// # Errors
/// Postgres failed.
pub async fn lock_clock(tx: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query("select pg_advisory_xact_lock_shared(hashtextextended('pull-clock', 0))")
        .execute(tx)
        .await
        .map(|_| ())
}

/// Retries an entry writer makes before it holds the pull clock from the start
/// ([`lock_clock`]).
pub const OPTIMISTIC_TRIES: u32 = 2;

/// The last step of every writer of newsfeed entries, right before its commit: takes the
/// `pull-clock` lock shared (until the commit) and checks that the entries it wrote (their
/// times: `times`) all lie above the newest pulled tweet (`false`: a pulled tweet newer than
/// one of them committed since they were stamped; roll back and stamp again); then waits until
/// the database clock has passed the newest, so a pulled tweet stamped after the commit lies
/// above them (entries take their tweets' times, or a few µs past a head: nearly never a wait).
/// The lock is held for one statement and the commit, so a pulled compose waits that long at
/// most. A writer that wrote no entry has nothing to check (`true`, no statement).
///
/// # Errors
/// Postgres failed.
pub async fn check(
    tx: &mut PgConnection,
    times: impl IntoIterator<Item = crate::time::Timestamp>,
) -> sqlx::Result<bool> {
    let bounds = times.into_iter().fold(None, |b, t| match b {
        None => Some((t, t)),
        Some((lo, hi)) => Some((t.min(lo), t.max(hi))),
    });
    let Some((oldest, newest)) = bounds else {
        return Ok(true);
    };
    let (pulled, clock): (Option<crate::time::Timestamp>, crate::time::Timestamp) =
        sqlx::query_as("select nullif(at, '-infinity'), clock from pull_clock_share()")
            .fetch_one(&mut *tx)
            .await?;
    if pulled.is_some_and(|pulled| oldest <= pulled) {
        return Ok(false);
    }
    wait_past(tx, newest, Some(clock)).await?;
    Ok(true)
}

/// The authors with pulled tweets, as this process last read them: every newsfeed read asks
/// which of them its reader follows ([`crate::newsfeeds::sources`]). Re-read from Postgres
/// when older than a half of the settle time: an author's tweets are pulled only a settle time after it joined
/// the set, so no process reads a newsfeed without the pulled tweets it would show a moment
/// later (below entries the client already holds).
pub struct PullAuthors {
    held: Mutex<Option<(Instant, Arc<Vec<i64>>)>>,
    reading: tokio::sync::Mutex<()>,
    max_age: Duration,
}

impl PullAuthors {
    /// An empty memory for `policy`.
    pub fn new(policy: &PullPolicy) -> Self {
        PullAuthors {
            held: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            max_age: policy.settle / 2,
        }
    }

    fn fresh(&self) -> Option<Arc<Vec<i64>>> {
        let held = self.held.lock().ok()?;
        held.as_ref()
            .filter(|(at, _)| at.elapsed() < self.max_age)
            .map(|(_, authors)| authors.clone())
    }

    /// How many authors had pulled tweets when this process last read them (`None`: it has
    /// not read them yet): `/healthz` `fanout.pull_sources`, `chirp_fanout_pull_sources`.
    pub fn last_read(&self) -> Option<usize> {
        let held = self.held.lock().ok()?;
        held.as_ref().map(|(_, authors)| authors.len())
    }

    /// The authors with pulled tweets (ascending ids; usually none).
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn current(&self, db: &PgPool) -> sqlx::Result<Arc<Vec<i64>>> {
        if let Some(authors) = self.fresh() {
            return Ok(authors);
        }
        // One reader at a time: the others wait and take its answer.
        let _reading = self.reading.lock().await;
        if let Some(authors) = self.fresh() {
            return Ok(authors);
        }
        // The time before the query: the answer holds everything committed before it.
        let asked = Instant::now();
        let authors: Vec<i64> =
            sqlx::query_scalar("select id from users where has_pulled order by id")
                .fetch_all(db)
                .await?;
        let authors = Arc::new(authors);
        if let Ok(mut held) = self.held.lock() {
            *held = Some((asked, authors.clone()));
        }
        Ok(authors)
    }
}

/// Waits until the database clock has passed `newest`, the newest newsfeed entry time the
/// caller's transaction wrote (see [`check`]): a pulled tweet stamped after the commit is then
/// newer than every entry committed before it. `clock` is the database clock the caller read
/// last, if it did (`None`: ask).
///
/// # Errors
/// Postgres failed.
pub async fn wait_past(
    tx: &mut PgConnection,
    newest: crate::time::Timestamp,
    clock: Option<crate::time::Timestamp>,
) -> sqlx::Result<()> {
    if clock.is_some_and(|c| c > newest) {
        return Ok(());
    }
    sqlx::query(
        "select pg_sleep(greatest(0, extract(epoch from $1 - clock_timestamp()) + 0.000002))",
    )
    .bind(newest)
    .execute(tx)
    .await
    .map(|_| ())
}

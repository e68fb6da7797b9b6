//! The durable job queue: typed jobs, claimed with a lease, retried with backoff, parked after
//! [`MAX_ATTEMPTS`]. The job bodies live with the feature they serve (fan-out, backfill and
//! unmerge in [`crate::newsfeeds`], and their list counterparts in [`crate::lists`]); this module only queues and runs them (as crates.io's
//! `background_job` does).
//!
//! Lifecycle: a job row is inserted in the same transaction as the write that needs it; after
//! the commit [`Worker::announce`] wakes the runners of this process at once and those of the
//! others through Redis pub/sub (or a `pg_notify` of its own when Redis is unavailable). No
//! `pg_notify` runs inside the write's transaction: Postgres serialises the commits of
//! notifying transactions on one lock, which halved the commit rate at 16 writers
//! (docs/benchmarks-journal.md). A runner that misses a wake-up polls every second. A worker claims the oldest ready job with
//! `FOR UPDATE SKIP LOCKED` and takes a 30 s lease (`locked_until`); it deletes the row when done
//! (a fan-out part deletes its own row in its last batch's transaction: [`finish`]).
//! A job that fails is retried with exponential backoff (`run_after`), and after
//! [`MAX_ATTEMPTS`] it is kept with `failed_at` set. A worker that crashes leaves its lease to
//! expire, and the next worker resumes the job: every step is idempotent (`on conflict`, sorted
//! set adds, cache updates staged in the outbox with the step's transaction), and a fan-out job
//! stores its progress after each batch.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

use crate::cache::Cache;
use crate::time::Timestamp;
use crate::trace::TraceId;
use crate::{lists, newsfeeds};

/// The jobs a runner may claim now: not parked, past their backoff, and not leased (or with an
/// expired lease). The claims and the compose back-pressure ([`Backlog`]) share it, so the
/// back-pressure counts exactly the jobs no runner has taken.
macro_rules! ready_jobs {
    () => {
        "failed_at is null and run_after <= now() and (locked_until is null or locked_until < now())"
    };
}

/// Attempts before a job is parked with `failed_at`.
pub const MAX_ATTEMPTS: i32 = 10;
/// The Postgres notification channel that wakes workers (when Redis is unavailable).
pub const CHANNEL: &str = "chirp_jobs";
/// The pub/sub topic that wakes workers ([`crate::cache::Cache::topic`]).
pub const TOPIC: &str = "jobs";

/// A job, parsed once from its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Fan-out-on-write of a new tweet to its author's followers, resuming after `progress`
    /// (the `created_at` of the last friendship done), then to the lists that contain the
    /// author, resuming after `list_progress` (the `created_at` of the last membership done).
    Fanout {
        tweet_id: i64,
        progress: Option<Timestamp>,
        list_progress: Option<Timestamp>,
    },
    /// One part of a fan-out of more than one batch (see [`crate::newsfeeds::fanout`]): the
    /// followers whose friendship is newer than `progress` and at most `until`. Parts of one
    /// tweet run on several workers at once, beside the fan-out job, which runs the last.
    FanoutPart {
        tweet_id: i64,
        progress: Option<Timestamp>,
        until: Timestamp,
    },
    /// Copy `followee`'s recent tweets into `follower`'s newsfeed (after a follow).
    Backfill { follower: i64, followee: i64 },
    /// Remove `followee`'s tweets from `follower`'s newsfeed (after an unfollow).
    Unmerge { follower: i64, followee: i64 },
    /// Copy `member`'s recent tweets into `list`'s timeline (after the member was added).
    ListBackfill { list: i64, member: i64 },
    /// Remove `member`'s tweets from `list`'s timeline (after the member was removed).
    ListUnmerge { list: i64, member: i64 },
}

impl Job {
    /// The `kind` column of this job.
    pub fn kind(&self) -> &'static str {
        match self {
            Job::Fanout { .. } => "fanout",
            Job::FanoutPart { .. } => "fanout_part",
            Job::Backfill { .. } => "backfill",
            Job::Unmerge { .. } => "unmerge",
            Job::ListBackfill { .. } => "list_backfill",
            Job::ListUnmerge { .. } => "list_unmerge",
        }
    }
}

/// A claimed job's row.
#[derive(Debug, sqlx::FromRow)]
struct JobRow {
    id: i64,
    kind: String,
    tweet_id: Option<i64>,
    follower_id: Option<i64>,
    followee_id: Option<i64>,
    list_id: Option<i64>,
    progress: Option<Timestamp>,
    list_progress: Option<Timestamp>,
    until_at: Option<Timestamp>,
    attempts: i32,
    trace_id: Option<String>,
}

impl TryFrom<&JobRow> for Job {
    type Error = String;

    fn try_from(r: &JobRow) -> Result<Self, String> {
        let pair = || match (r.follower_id, r.followee_id) {
            (Some(follower), Some(followee)) => Ok((follower, followee)),
            _ => Err(format!("{} job without its users", r.kind)),
        };
        // List jobs keep the member (the account whose tweets move) in `followee_id`.
        let list_pair = || match (r.list_id, r.followee_id) {
            (Some(list), Some(member)) => Ok((list, member)),
            _ => Err(format!("{} job without its list or member", r.kind)),
        };
        match r.kind.as_str() {
            "fanout" => Ok(Job::Fanout {
                tweet_id: r.tweet_id.ok_or("fanout job without a tweet")?,
                progress: r.progress,
                list_progress: r.list_progress,
            }),
            "fanout_part" => Ok(Job::FanoutPart {
                tweet_id: r.tweet_id.ok_or("fanout_part job without a tweet")?,
                progress: r.progress,
                until: r.until_at.ok_or("fanout_part job without its end")?,
            }),
            "backfill" => pair().map(|(follower, followee)| Job::Backfill { follower, followee }),
            "unmerge" => pair().map(|(follower, followee)| Job::Unmerge { follower, followee }),
            "list_backfill" => list_pair().map(|(list, member)| Job::ListBackfill { list, member }),
            "list_unmerge" => list_pair().map(|(list, member)| Job::ListUnmerge { list, member }),
            other => Err(format!("unknown job kind {other:?}")),
        }
    }
}

/// The part of a compose's insert statement that queues the new tweet's [`Job::Fanout`]
/// (`tweets::create`: one round trip fewer than [`enqueue`] after it): a data-modifying `WITH`
/// item, `queued_fanout`, that inserts the job row of each row of the statement's `ins` item
/// (the tweet, with its `id`), with the trace id in the parameter given (bind
/// [`trace_column`]). The row is the one [`enqueue`] would insert; the job's foreign key is
/// checked at the end of the statement, after the tweet's insert.
#[macro_export]
macro_rules! queue_fanout {
    ($trace:literal) => {
        concat!(
            "queued_fanout as (insert into jobs (kind, tweet_id, trace_id) select 'fanout', ins.id, ",
            $trace,
            " from ins)"
        )
    };
}

/// The `trace_id` column of a job queued now: the trace id of the request or job queuing it
/// ([`TraceId::current`]), as 32 hex digits.
pub fn trace_column() -> Option<String> {
    TraceId::current().map(|t| t.to_string())
}

/// Queues `job` in the transaction of the write that needs it, with the trace id of the
/// request or job queuing it ([`trace_column`]); call [`Worker::announce`] after the commit.
pub async fn enqueue(tx: &mut PgConnection, job: &Job) -> sqlx::Result<()> {
    let (progress, until) = match job {
        Job::FanoutPart {
            progress, until, ..
        } => (*progress, Some(*until)),
        _ => (None, None),
    };
    let (tweet, follower, followee, list) = match job {
        Job::Fanout { tweet_id, .. } | Job::FanoutPart { tweet_id, .. } => {
            (Some(*tweet_id), None, None, None)
        }
        Job::Backfill { follower, followee } | Job::Unmerge { follower, followee } => {
            (None, Some(*follower), Some(*followee), None)
        }
        Job::ListBackfill { list, member } | Job::ListUnmerge { list, member } => {
            (None, None, Some(*member), Some(*list))
        }
    };
    sqlx::query(
        "insert into jobs (kind, tweet_id, follower_id, followee_id, list_id, progress, until_at,
                           trace_id)
         values ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(job.kind())
    .bind(tweet)
    .bind(follower)
    .bind(followee)
    .bind(list)
    .bind(progress)
    .bind(until)
    .bind(trace_column())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Which part of a fan-out job made progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The followers' newsfeeds (`progress`).
    Followers,
    /// The lists that contain the author (`list_progress`).
    Lists,
}

/// The fan-out lag (`/healthz`'s `fanout`): jobs waiting or running (`failed_at` is null:
/// fan-outs, backfills, unmerges, list jobs alike) and the age of the oldest one, in ms
/// (`None` with none). A worker that has stopped shows as a growing age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct Lag {
    pub queued_jobs: i64,
    pub oldest_job_age_ms: Option<i64>,
}

/// Compose back-pressure (issue 36): when writes outrun the fan-out, accepting more tweets
/// only makes every follower see them later (under the DeathStarBench mix at its highest
/// closed-loop rate the queue grew without bound and followers saw tweets six minutes late).
/// This process watches how long the oldest fan-out job that no runner has taken yet has
/// waited (`CHIRP_FANOUT_MAX_WAIT_MS`, read every [`Backlog::EVERY`]); above the limit,
/// composes answer 503 with `Retry-After` (the admission control of SEDA, Welsh et al.,
/// SOSP 2001), and reads, likes and everything else go on. Jobs being run, waiting out a
/// retry's backoff, or parked do not count: a big account's fan-out in progress, or a failing
/// job, never stops everyone's composes.
#[derive(Debug)]
pub struct Backlog {
    /// The wait in ms at the last look (0: none waiting, or not looked yet).
    wait_ms: std::sync::atomic::AtomicU64,
    /// The limit in ms (0: off).
    limit_ms: u64,
}

impl Backlog {
    /// How often [`Backlog::watch`] looks.
    pub const EVERY: Duration = Duration::from_millis(100);

    /// A backlog watch with `limit_ms` (0: off).
    pub fn new(limit_ms: u64) -> Self {
        Backlog {
            wait_ms: std::sync::atomic::AtomicU64::new(0),
            limit_ms,
        }
    }

    /// `Some(seconds to wait)` when a compose should be refused now.
    pub fn refuse(&self) -> Option<u64> {
        let wait = self.wait_ms.load(std::sync::atomic::Ordering::Relaxed);
        (self.limit_ms > 0 && wait > self.limit_ms).then(|| wait.div_ceil(1000).clamp(1, 30))
    }

    /// The wait at the last look, in ms.
    pub fn wait_ms(&self) -> u64 {
        self.wait_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Looks once: the age of the oldest fan-out job ready and not taken.
    ///
    /// # Errors
    /// Postgres failed (the last value stays).
    pub async fn refresh(&self, db: &PgPool) -> sqlx::Result<()> {
        let wait: Option<i64> = sqlx::query_scalar(concat!(
            "select (extract(epoch from now() - created_at) * 1000)::bigint from jobs
             where kind in ('fanout', 'fanout_part') and ",
            ready_jobs!(),
            " order by id limit 1"
        ))
        .fetch_optional(db)
        .await?
        .flatten();
        self.wait_ms.store(
            u64::try_from(wait.unwrap_or(0)).unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    /// Looks every [`Backlog::EVERY`] until `shutdown` (nothing when off).
    pub async fn watch(self: Arc<Self>, db: PgPool, mut shutdown: watch::Receiver<bool>) {
        if self.limit_ms == 0 {
            return;
        }
        while !*shutdown.borrow() {
            if let Err(e) = self.refresh(&db).await {
                tracing::debug!(error = %e, "fan-out backlog unknown");
            }
            tokio::select! {
                _ = tokio::time::sleep(Self::EVERY) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// Reads the [`Lag`]: a count over the ready jobs' partial index, and the oldest by id (ids
/// follow insertion).
///
/// # Errors
/// Postgres failed.
pub async fn lag(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<Lag> {
    sqlx::query_as(
        "select (select count(*) from jobs where failed_at is null) as queued_jobs,
                (select (extract(epoch from now() - created_at) * 1000)::bigint
                 from jobs where failed_at is null order by id limit 1) as oldest_job_age_ms",
    )
    .fetch_one(db)
    .await
}

/// Records a fan-out job's progress in `part` and renews its lease (after each batch).
pub async fn save_progress(
    db: impl sqlx::PgExecutor<'_>,
    job_id: i64,
    part: Part,
    progress: Timestamp,
) -> sqlx::Result<()> {
    let sql = match part {
        Part::Followers => {
            "update jobs set progress = $2, locked_until = now() + interval '30 seconds'
             where id = $1"
        }
        Part::Lists => {
            "update jobs set list_progress = $2, locked_until = now() + interval '30 seconds'
             where id = $1"
        }
    };
    sqlx::query(sql)
        .bind(job_id)
        .bind(progress)
        .execute(db)
        .await
        .map(|_| ())
}

/// Ends job `job_id`: the runner's delete after a job returns, or, inside the transaction of a
/// job's last step, the job's own (a fan-out part's last batch), so that the job is gone when
/// that step's work commits; the runner's delete then finds nothing.
pub async fn finish(db: impl sqlx::PgExecutor<'_>, job_id: i64) -> sqlx::Result<()> {
    sqlx::query("delete from jobs where id = $1")
        .bind(job_id)
        .execute(db)
        .await
        .map(|_| ())
}

/// What a worker needs: the database, the cache and the batch sizes.
#[derive(Clone)]
pub struct Worker {
    pub db: PgPool,
    pub cache: Cache,
    /// Followers per fan-out batch (`CHIRP_FANOUT_BATCH_SIZE`).
    pub batch_size: usize,
    /// Parts a fan-out of more than one batch is cut into (`CHIRP_FANOUT_PARTS`; see
    /// [`crate::newsfeeds::fanout`]).
    pub fanout_parts: usize,
    /// Fan-out jobs of small accounts taken at once (`CHIRP_FANOUT_BATCH_JOBS`; see
    /// [`crate::newsfeeds::fanout_batch`]).
    pub batch_jobs: usize,
    /// Tweets copied by a follow backfill (`CHIRP_CACHE_LIST_LIMIT`).
    pub backfill_limit: usize,
    /// Woken by in-process writers, by the `jobs` pub/sub topic and by `LISTEN chirp_jobs`.
    pub wake: Arc<Notify>,
    /// This process's name on the `jobs` topic (random): its own announcements come back to it
    /// through its subscription, and [`wakes`] ignores them.
    pub origin: u64,
}

impl Worker {
    /// Wakes job runners after a commit that queued jobs: this process's at once, every other
    /// process's through the `jobs` pub/sub topic, or, with Redis unavailable, a `pg_notify`
    /// in a transaction of its own (never in the write's). Returns at once; a lost wake-up
    /// costs at most the runners' one-second poll.
    pub fn announce(&self) {
        self.wake.notify_one();
        let (cache, db, origin) = (self.cache.clone(), self.db.clone(), self.origin);
        tokio::spawn(async move { wake_others(&cache, &db, &origin.to_string()).await });
    }
}

/// Whether a message of the `jobs` topic wakes the runners of the process whose
/// [`Worker::origin`] is `origin`: not when it is that process's own announcement, whose
/// runners [`Worker::announce`] woke already (before, every post made a second runner claim
/// in vain: a Postgres statement beside the post's answer, on the same cores).
pub fn wakes(origin: u64, message: &str) -> bool {
    message.parse::<u64>() != Ok(origin)
}

/// Wakes the job runners of every process after a commit that queued jobs: the `jobs` pub/sub
/// topic (`origin`: the announcing [`Worker::origin`], or `""` from a process without runners
/// of its own such as `chirp replay`), or, with Redis unavailable, a `pg_notify` in a
/// transaction of its own. Best effort (runners poll every second).
pub async fn wake_others(cache: &Cache, db: &PgPool, origin: &str) {
    if cache.publish(TOPIC, origin).await.is_err() {
        let _ = sqlx::query("select pg_notify($1, '')")
            .bind(CHANNEL)
            .execute(db)
            .await;
    }
}

/// A job (or a batch of fan-outs) that runs this long is logged with its trace id.
pub const SLOW_JOB: Duration = Duration::from_secs(1);

/// The id, attempt number and trace id of a claimed job.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub id: i64,
    pub attempts: i32,
    /// The trace id of what queued it ([`crate::trace`]).
    pub trace: Option<TraceId>,
}

impl Worker {
    /// Claims the oldest ready job, if any, with a 30 s lease. A row that does not parse is
    /// parked at once.
    pub async fn claim(&self) -> sqlx::Result<Option<(Claim, Result<Job, String>)>> {
        let row: Option<JobRow> = sqlx::query_as(concat!(
            "update jobs set attempts = attempts + 1, locked_until = now() + interval '30 seconds'
             where id = (select id from jobs where ",
            ready_jobs!(),
            " order by id limit 1 for update skip locked)
             returning id, kind, tweet_id, follower_id, followee_id, list_id, progress, list_progress,
                       until_at, attempts, trace_id"
        ))
        .fetch_optional(&self.db)
        .await?;
        Ok(row.map(|r| {
            let claim = Claim {
                id: r.id,
                attempts: r.attempts,
                trace: r.trace_id.as_deref().and_then(TraceId::parse),
            };
            (claim, Job::try_from(&r))
        }))
    }

    /// Claims up to `limit` more fan-out jobs that have not started (no progress), oldest
    /// first, with the same lease as [`Worker::claim`].
    async fn claim_fresh_fanouts(&self, limit: usize) -> sqlx::Result<Vec<(Claim, i64)>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, i32, i64, Option<String>)> = sqlx::query_as(concat!(
            "update jobs set attempts = attempts + 1, locked_until = now() + interval '30 seconds'
             where id in (
                 select id from jobs
                 where kind = 'fanout' and progress is null and list_progress is null and ",
            ready_jobs!(),
            " order by id limit $1 for update skip locked)
             returning id, attempts, tweet_id, trace_id"
        ))
        .bind(limit as i64)
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, attempts, tweet_id, trace)| {
                let trace = trace.as_deref().and_then(TraceId::parse);
                (
                    Claim {
                        id,
                        attempts,
                        trace,
                    },
                    tweet_id,
                )
            })
            .collect())
    }

    /// Runs claimed fan-out jobs that have not started as one batch
    /// ([`newsfeeds::fanout_batch`]), then what it leaves: big accounts' jobs whole, and the
    /// list part of jobs whose author is in a list. If a batch fails, its jobs run one at a
    /// time (each fails, and is retried, on its own).
    async fn run_batch(&self, claims: Vec<(Claim, i64)>) -> sqlx::Result<()> {
        let fresh: Vec<newsfeeds::Fresh> = claims
            .iter()
            .map(|(c, tweet_id)| newsfeeds::Fresh {
                job_id: c.id,
                tweet_id: *tweet_id,
            })
            .collect();
        let claim_of: std::collections::HashMap<i64, Claim> =
            claims.iter().map(|(c, _)| (c.id, *c)).collect();
        let traces: Vec<String> = (claims.iter())
            .filter_map(|(c, _)| c.trace.map(|t| t.to_string()))
            .collect();
        tracing::debug!(jobs = claims.len(), trace_ids = ?traces, "fan-out batch");
        let started = std::time::Instant::now();
        let mut next = fresh;
        while !next.is_empty() {
            let left = match newsfeeds::fanout_batch(self, &next).await {
                Ok(left) => left,
                Err(e) => {
                    // Nothing of it committed. One job alone fails alone: each runs on its own
                    // (a poison job must not fail, and in the end park, the jobs beside it).
                    tracing::warn!(error = ?e, jobs = next.len(), "fan-out batch failed; running its jobs one at a time");
                    for job in &next {
                        if let Some(&claim) = claim_of.get(&job.job_id) {
                            self.run_rest(claim, job.tweet_id, true).await?;
                        }
                    }
                    return Ok(());
                }
            };
            // In the order of their tweets: a big account's first, then the list parts.
            for job in &left.whole {
                if let Some(&claim) = claim_of.get(&job.job_id) {
                    self.run_rest(claim, job.tweet_id, true).await?;
                }
            }
            for job in &left.lists {
                if let Some(&claim) = claim_of.get(&job.job_id) {
                    self.run_rest(claim, job.tweet_id, false).await?;
                }
            }
            next = left.later;
        }
        let took = started.elapsed();
        if took >= SLOW_JOB {
            let took_ms = took.as_millis() as u64;
            tracing::info!(took_ms, jobs = claims.len(), trace_ids = ?traces, "slow fan-out batch");
        }
        Ok(())
    }

    /// Runs what a batch left of fan-out job `claim`: the whole job (`whole`: its tweet's author
    /// has more than a batch of followers), or its lists alone (its newsfeeds committed with
    /// the batch).
    async fn run_rest(&self, claim: Claim, tweet_id: i64, whole: bool) -> sqlx::Result<()> {
        if whole {
            let job = Job::Fanout {
                tweet_id,
                progress: None,
                list_progress: None,
            };
            return self
                .run_claimed(claim, job.kind(), self.dispatch(claim, &job))
                .await;
        }
        let lists = lists::fanout(self, claim.id, tweet_id, None);
        self.run_claimed(claim, "fanout", lists).await
    }

    /// Runs `work` of job `claim` in the job's span, then ends the job, or fails it for a retry.
    async fn run_claimed(
        &self,
        claim: Claim,
        kind: &'static str,
        work: impl Future<Output = anyhow::Result<()>>,
    ) -> sqlx::Result<()> {
        let span = tracing::info_span!(
            "job",
            id = claim.id,
            kind,
            attempt = claim.attempts,
            trace_id = claim.trace.map(tracing::field::display),
        );
        // Jobs this one queues (a fan-out's parts) carry its trace id.
        let work = TraceId::scope(claim.trace, work);
        let started = std::time::Instant::now();
        let done = work.instrument(span.clone()).await;
        let took = started.elapsed();
        if took >= SLOW_JOB {
            span.in_scope(|| tracing::info!(took_ms = took.as_millis() as u64, "slow job"));
        }
        match done {
            Ok(()) => finish(&self.db, claim.id).await,
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = ?e, "job failed; will retry"));
                self.fail(claim, &format!("{e:#}"), false).await
            }
        }
    }

    /// Claims and runs one job (with a fan-out that has not started, up to
    /// `CHIRP_FANOUT_BATCH_JOBS` such fan-outs as one batch). Returns whether there was one.
    pub async fn run_one(&self) -> sqlx::Result<bool> {
        let Some((claim, job)) = self.claim().await? else {
            return Ok(false);
        };
        let job = match job {
            Ok(job) => job,
            Err(e) => {
                tracing::error!(id = claim.id, error = %e, "unreadable job parked");
                self.fail(claim, &e, true).await?;
                return Ok(true);
            }
        };
        if let Job::Fanout {
            tweet_id,
            progress: None,
            list_progress: None,
        } = job
            && self.batch_jobs > 1
        {
            let mut claims = vec![(claim, tweet_id)];
            claims.extend(self.claim_fresh_fanouts(self.batch_jobs - 1).await?);
            self.run_batch(claims).await?;
            return Ok(true);
        }
        self.run_claimed(claim, job.kind(), self.dispatch(claim, &job))
            .await?;
        Ok(true)
    }

    async fn dispatch(&self, claim: Claim, job: &Job) -> anyhow::Result<()> {
        match *job {
            Job::Fanout {
                tweet_id,
                progress,
                list_progress,
            } => {
                // Newsfeeds first: the lists that contain the author never delay them.
                newsfeeds::fanout(self, claim.id, tweet_id, progress, None).await?;
                lists::fanout(self, claim.id, tweet_id, list_progress).await
            }
            Job::FanoutPart {
                tweet_id,
                progress,
                until,
            } => newsfeeds::fanout(self, claim.id, tweet_id, progress, Some(until)).await,
            Job::Backfill { follower, followee } => {
                newsfeeds::backfill(self, follower, followee).await
            }
            Job::Unmerge { follower, followee } => {
                newsfeeds::unmerge(self, follower, followee).await
            }
            Job::ListBackfill { list, member } => lists::backfill(self, list, member).await,
            Job::ListUnmerge { list, member } => lists::unmerge(self, list, member).await,
        }
    }

    async fn fail(&self, claim: Claim, error: &str, park: bool) -> sqlx::Result<()> {
        sqlx::query(
            "update jobs set locked_until = null, last_error = $2,
                 run_after = now() + make_interval(secs => least(power(2, attempts), 300)),
                 failed_at = case when $4 or attempts >= $3 then now() end
             where id = $1",
        )
        .bind(claim.id)
        .bind(error)
        .bind(MAX_ATTEMPTS)
        .bind(park)
        .execute(&self.db)
        .await
        .map(|_| ())
    }

    /// Runs jobs until none is ready (tests and tools use this instead of waiting).
    pub async fn run_until_idle(&self) -> sqlx::Result<usize> {
        let mut n = 0;
        while self.run_one().await? {
            n += 1;
        }
        Ok(n)
    }

    /// Runs `runners` job loops (none for 0) until `shutdown`; a job in progress finishes first. Wakes on
    /// `LISTEN chirp_jobs`, on in-process writes, and every second regardless.
    pub async fn run(self, runners: usize, shutdown: watch::Receiver<bool>) {
        if runners == 0 {
            return;
        }
        let listener = tokio::spawn(listen(self.db.clone(), self.wake.clone(), shutdown.clone()));
        let mut tasks = Vec::new();
        for _ in 0..runners {
            let worker = self.clone();
            let mut shutdown = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                while !*shutdown.borrow() {
                    match worker.run_one().await {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => tracing::warn!(error = %e, "job queue unavailable"),
                    }
                    tokio::select! {
                        _ = worker.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        listener.abort();
    }
}

async fn listen(db: PgPool, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let mut listener = match PgListener::connect_with(&db)
            .await
            .context("connecting the job listener")
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = ?e, "LISTEN unavailable; polling");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                    _ = shutdown.changed() => return,
                }
            }
        };
        if listener.listen(CHANNEL).await.is_err() {
            continue;
        }
        loop {
            tokio::select! {
                n = listener.recv() => match n {
                    Ok(_) => wake.notify_one(),
                    Err(_) => break,
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fanout_queued_by_a_compose_statement_has_the_kind_of_a_fanout_job() {
        let kind = Job::Fanout {
            tweet_id: 1,
            progress: None,
            list_progress: None,
        }
        .kind();
        assert!(crate::queue_fanout!("$1").contains(&format!("select '{kind}', ins.id")));
    }
}

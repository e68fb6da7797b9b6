//! Durable background jobs: fan-out-on-write of new tweets, follow backfill and unfollow unmerge
//! (the merge / unmerge of Mastodon's FeedManager and Redis in Action ch. 8).
//!
//! Lifecycle: a job row is inserted in the same transaction as the write that needs it, and
//! `pg_notify('chirp_jobs')` wakes the workers. A worker claims the oldest ready job with
//! `FOR UPDATE SKIP LOCKED` and takes a 30 s lease (`locked_until`); it deletes the row when done.
//! A job that fails is retried with exponential backoff (`run_after`), and after
//! [`MAX_ATTEMPTS`] it is kept with `failed_at` set. A worker that crashes leaves its lease to
//! expire, and the next worker resumes the job: every step is idempotent (`on conflict`, sorted
//! set adds), and a fan-out job stores its progress after each batch, so a re-run has no visible
//! effect beyond finishing the work.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Notify, watch};

use crate::cache::timeline::ListEntry;
use crate::cache::{Cache, Expect, ListKey, Update};
use crate::time::{self, Timestamp};

/// Attempts before a job is parked with `failed_at`.
pub const MAX_ATTEMPTS: i32 = 10;
/// The Postgres notification channel that wakes workers.
pub const CHANNEL: &str = "chirp_jobs";

/// What a worker needs: the database, the cache and the batch sizes.
#[derive(Clone)]
pub struct Worker {
    pub db: PgPool,
    pub cache: Cache,
    /// Followers per fan-out batch (`CHIRP_FANOUT_BATCH_SIZE`).
    pub batch_size: usize,
    /// Tweets copied by a follow backfill (`CHIRP_CACHE_LIST_LIMIT`).
    pub backfill_limit: usize,
    /// Woken by in-process writers and by `LISTEN chirp_jobs`.
    pub wake: Arc<Notify>,
}

/// A claimed job.
#[derive(Debug, sqlx::FromRow)]
pub struct Job {
    pub id: i64,
    pub kind: String,
    pub tweet_id: Option<i64>,
    pub follower_id: Option<i64>,
    pub followee_id: Option<i64>,
    pub progress: Option<Timestamp>,
    pub attempts: i32,
}

async fn enqueue(
    tx: &mut Transaction<'_, Postgres>,
    kind: &str,
    tweet: Option<i64>,
    follower: Option<i64>,
    followee: Option<i64>,
) -> sqlx::Result<()> {
    sqlx::query(
        "insert into jobs (kind, tweet_id, follower_id, followee_id) values ($1, $2, $3, $4);",
    )
    .bind(kind)
    .bind(tweet)
    .bind(follower)
    .bind(followee)
    .execute(&mut **tx)
    .await?;
    sqlx::query("select pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Queues the fan-out of a new tweet to its author's followers (in the tweet's transaction).
pub async fn enqueue_fanout(tx: &mut Transaction<'_, Postgres>, tweet: i64) -> sqlx::Result<()> {
    enqueue(tx, "fanout", Some(tweet), None, None).await
}

/// Queues copying `followee`'s recent tweets into `follower`'s newsfeed (in the follow's
/// transaction).
pub async fn enqueue_backfill(
    tx: &mut Transaction<'_, Postgres>,
    follower: i64,
    followee: i64,
) -> sqlx::Result<()> {
    enqueue(tx, "backfill", None, Some(follower), Some(followee)).await
}

/// Queues removing `followee`'s tweets from `follower`'s newsfeed (in the unfollow's
/// transaction).
pub async fn enqueue_unmerge(
    tx: &mut Transaction<'_, Postgres>,
    follower: i64,
    followee: i64,
) -> sqlx::Result<()> {
    enqueue(tx, "unmerge", None, Some(follower), Some(followee)).await
}

impl Worker {
    /// Claims the oldest ready job, if any, with a 30 s lease.
    pub async fn claim(&self) -> sqlx::Result<Option<Job>> {
        sqlx::query_as(
            "update jobs set attempts = attempts + 1, locked_until = now() + interval '30 seconds'
             where id = (
                 select id from jobs
                 where failed_at is null and run_after <= now()
                   and (locked_until is null or locked_until < now())
                 order by id limit 1
                 for update skip locked)
             returning id, kind, tweet_id, follower_id, followee_id, progress, attempts",
        )
        .fetch_optional(&self.db)
        .await
    }

    /// Claims and runs one job. Returns whether there was one.
    pub async fn run_one(&self) -> sqlx::Result<bool> {
        let Some(job) = self.claim().await? else {
            return Ok(false);
        };
        let span =
            tracing::info_span!("job", id = job.id, kind = %job.kind, attempt = job.attempts);
        let _enter = span.enter();
        let result = match job.kind.as_str() {
            "fanout" => self.fanout(&job).await,
            "backfill" => self.backfill(&job).await,
            "unmerge" => self.unmerge(&job).await,
            other => Err(sqlx::Error::Protocol(format!("unknown job kind {other}"))),
        };
        match result {
            Ok(()) => {
                sqlx::query("delete from jobs where id = $1")
                    .bind(job.id)
                    .execute(&self.db)
                    .await?;
            }
            Err(e) => {
                tracing::warn!(error = %e, "job failed; will retry");
                sqlx::query(
                    "update jobs set locked_until = null, last_error = $2,
                         run_after = now() + make_interval(secs => least(power(2, attempts), 300)),
                         failed_at = case when attempts >= $3 then now() end
                     where id = $1",
                )
                .bind(job.id)
                .bind(e.to_string())
                .bind(MAX_ATTEMPTS)
                .execute(&self.db)
                .await?;
            }
        }
        Ok(true)
    }

    /// Runs jobs until none is ready (tests and tools use this instead of waiting).
    pub async fn run_until_idle(&self) -> sqlx::Result<usize> {
        let mut n = 0;
        while self.run_one().await? {
            n += 1;
        }
        Ok(n)
    }

    /// Fan-out-on-write: inserts a newsfeed row for every follower of the author, one batch of
    /// `batch_size` followers (one set-based insert) per transaction, then merges the entries
    /// into the followers' cached newsfeeds.
    ///
    /// Each batch locks its friendship rows (`for share`), so an unfollow of one of them waits
    /// for the batch to commit and its unmerge then sees the batch's rows; and the list
    /// generations are read under that lock, so a merge that lands after the unmerge invalidates
    /// the list instead of bringing the tweet back.
    async fn fanout(&self, job: &Job) -> sqlx::Result<()> {
        let Some(tweet_id) = job.tweet_id else {
            return Ok(());
        };
        let mut progress = job.progress;
        loop {
            let mut tx = self.db.begin().await?;
            // Also waits for, or excludes, a concurrent delete of the tweet.
            let tweet: Option<(i64, Timestamp)> = sqlx::query_as(
                "select user_id, created_at from tweets where id = $1 for key share",
            )
            .bind(tweet_id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((author, created_at)) = tweet else {
                return Ok(());
            };
            let batch: Vec<(i64, Timestamp)> = sqlx::query_as(
                "select from_user_id, created_at from friendships
                 where to_user_id = $1 and created_at > coalesce($2, '-infinity')
                 order by created_at limit $3
                 for share",
            )
            .bind(author)
            .bind(progress)
            .bind(self.batch_size as i64)
            .fetch_all(&mut *tx)
            .await?;
            let Some(&(_, last)) = batch.last() else {
                return Ok(());
            };
            let followers: Vec<i64> = batch.iter().map(|(f, _)| *f).collect();
            let lists: Vec<ListKey> = followers.iter().map(|f| ListKey::Newsfeed(*f)).collect();
            let generations = self.cache.generations(&lists).await.ok();
            let rows: Vec<(i64, i64)> = sqlx::query_as(
                "insert into newsfeeds (user_id, tweet_id, created_at)
                 select f, $2, $3 from unnest($1::bigint[]) as f
                 on conflict (user_id, created_at) do update set tweet_id = excluded.tweet_id
                 returning user_id, id",
            )
            .bind(&followers)
            .bind(tweet_id)
            .bind(created_at)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;

            let row_of: std::collections::HashMap<i64, i64> = rows.into_iter().collect();
            let score = time::to_micros(created_at);
            let updates = followers
                .iter()
                .enumerate()
                .filter_map(|(i, f)| {
                    let entry = ListEntry {
                        id: *row_of.get(f)?,
                        tweet_id,
                        author_id: author,
                        created_at,
                    };
                    let list = ListKey::Newsfeed(*f);
                    Some(guarded_merge(
                        list,
                        generations.as_ref().map(|g| g[i].clone()),
                        vec![(score, entry.newsfeed_member())],
                    ))
                })
                .collect();
            self.cache.apply(&self.db, updates).await;

            // Record progress only after the cache step, so a crash before it redoes both.
            sqlx::query(
                "update jobs set progress = $2, locked_until = now() + interval '30 seconds' where id = $1",
            )
            .bind(job.id)
            .bind(last)
            .execute(&self.db)
            .await?;
            progress = Some(last);
            if batch.len() < self.batch_size {
                return Ok(());
            }
        }
    }

    /// Follow backfill: copies the followee's newest `backfill_limit` tweets into the follower's
    /// newsfeed, if the friendship still exists, and merges them into the cached list.
    async fn backfill(&self, job: &Job) -> sqlx::Result<()> {
        let (Some(follower), Some(followee)) = (job.follower_id, job.followee_id) else {
            return Ok(());
        };
        let list = ListKey::Newsfeed(follower);
        let mut tx = self.db.begin().await?;
        let follows: Option<i32> = sqlx::query_scalar(
            "select 1 from friendships where from_user_id = $1 and to_user_id = $2 for share",
        )
        .bind(follower)
        .bind(followee)
        .fetch_optional(&mut *tx)
        .await?;
        if follows.is_none() {
            return Ok(()); // unfollowed meanwhile
        }
        let generation = self
            .cache
            .generations(&[list])
            .await
            .ok()
            .map(|mut g| g.pop().flatten());
        let rows: Vec<ListEntry> = sqlx::query_as(
            "insert into newsfeeds (user_id, tweet_id, created_at)
             select $1, t.id, t.created_at from tweets t
             where t.user_id = $2 order by t.created_at desc limit $3
             on conflict (user_id, created_at) do update set tweet_id = excluded.tweet_id
             returning id, tweet_id, $2::bigint as author_id, created_at",
        )
        .bind(follower)
        .bind(followee)
        .bind(self.backfill_limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        if !rows.is_empty() {
            let entries = rows
                .iter()
                .map(|e| (time::to_micros(e.created_at), e.newsfeed_member()))
                .collect();
            self.cache
                .apply(&self.db, vec![guarded_merge(list, generation, entries)])
                .await;
        }
        Ok(())
    }

    /// Unfollow unmerge: removes the followee's tweets from the follower's newsfeed, unless
    /// the follower follows again by now, and from the cached list.
    async fn unmerge(&self, job: &Job) -> sqlx::Result<()> {
        let (Some(follower), Some(followee)) = (job.follower_id, job.followee_id) else {
            return Ok(());
        };
        let rows: Vec<ListEntry> = sqlx::query_as(
            "delete from newsfeeds n using tweets t
             where n.user_id = $1 and t.user_id = $2
               and n.created_at = t.created_at and n.tweet_id = t.id
               and not exists (select 1 from friendships where from_user_id = $1 and to_user_id = $2)
             returning n.id, n.tweet_id, t.user_id as author_id, n.created_at",
        )
        .bind(follower)
        .bind(followee)
        .fetch_all(&self.db)
        .await?;
        if !rows.is_empty() {
            let members = rows.iter().map(ListEntry::newsfeed_member).collect();
            self.cache
                .apply(
                    &self.db,
                    vec![Update::Remove(ListKey::Newsfeed(follower), members)],
                )
                .await;
        }
        Ok(())
    }

    /// Runs `runners` job loops until `shutdown`; a job in progress finishes first. Wakes on
    /// `LISTEN chirp_jobs`, on in-process writes, and every second regardless.
    pub async fn run(self, runners: usize, shutdown: watch::Receiver<bool>) {
        let listener = tokio::spawn(listen(self.db.clone(), self.wake.clone(), shutdown.clone()));
        let mut tasks = Vec::new();
        for _ in 0..runners.max(1) {
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

fn guarded_merge(
    list: ListKey,
    generation: Option<Option<String>>,
    entries: Vec<crate::cache::Scored>,
) -> Update {
    match generation {
        // The list was never written: expect that it still was not.
        Some(g) => Update::Merge(list, Expect::Gen(g.unwrap_or_default()), entries),
        // The generation could not be read: invalidating is the safe update.
        None => Update::Invalidate(list),
    }
}

async fn listen(db: PgPool, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let mut listener = match PgListener::connect_with(&db).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN unavailable; polling");
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

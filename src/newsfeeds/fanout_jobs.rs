//! Fan-out-on-write of new tweets into their authors' followers' newsfeeds: one job per tweet
//! ([`fn@fanout`], cut into parts for large accounts) or many small ones in one batch
//! ([`fanout_batch`]).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use sqlx::PgConnection;

use crate::cache::{ListKey, Update};
use crate::error::ApiError;
use crate::hybrid;
use crate::jobs::{self, Worker};
use crate::model::TweetRecord;
use crate::replies;
use crate::streams;
use crate::time::Timestamp;
use crate::timeline::{ListEntry, Timeline};
use crate::tweets::{self, Tweet};

use super::{lock_heads, stamp, unstamp};

/// Fan-out-on-write: inserts a newsfeed row for every follower of the tweet's author, one batch
/// of `batch_size` followers (one set-based insert) per transaction, and merges the entries into
/// the followers' cached newsfeeds. `progress` is where an earlier run stopped; `until` bounds
/// a part (a [`jobs::Job::FanoutPart`]).
///
/// A fan-out of more than one batch is shared: the job cuts the followers into parts of
/// [`part_size`] (cut at friendship timestamps), queues a `fanout_part` job for every part but
/// the last (in one transaction with its own progress moved past them), wakes the runners and
/// runs the last part itself, so `CHIRP_FANOUT_PARTS` runners insert side by side (Twitter's
/// timeline service splits a celebrity's fan-out the same way). Two parts made the fan-out of
/// the most-followed imported account (3,383 followers) about a third faster on a 2-core
/// machine, measured before entries were stamped under head locks
/// (docs/decisions/0012-fan-out-parts.md). Followers
/// who follow later get the tweet from their follow's backfill.
///
/// Each batch holds the author's followers lock shared ([`lock_followers`]), so an unfollow of
/// the author waits for the batch to commit and its unmerge then sees the batch's rows; the
/// lists' removal generations are read under that lock, so a merge that lands after the unmerge
/// drops the list instead of bringing the tweet back. Merges of other fan-outs do not disturb
/// it. The batch's merges are applied after its commit to the lists that exist then
/// ([`crate::cache::Cache::stage_merges`]).
///
/// # Errors
/// Postgres failed; the job is retried from the last recorded batch.
#[tracing::instrument(name = "newsfeeds::fanout", skip(worker))]
pub async fn fanout(
    worker: &Worker,
    job_id: i64,
    tweet_id: i64,
    mut progress: Option<Timestamp>,
    until: Option<Timestamp>,
) -> anyhow::Result<()> {
    if until.is_none()
        && let Some(last) = split_fanout(worker, job_id, tweet_id, progress).await?
    {
        progress = Some(last);
    }
    // The tweet object the streams send with each batch (cache-aside; `None`: deleted, or the
    // cache is off and there are no streams).
    let load_object = async |version: i64| -> anyhow::Result<Option<Arc<(Tweet, TweetRecord)>>> {
        if !worker.cache.enabled() {
            return Ok(None);
        }
        let loaded = tweets::load_version(&worker.db, &worker.cache, tweet_id, version).await?;
        let Some((record, counts, author)) = loaded else {
            return Ok(None);
        };
        let tweet = Tweet::new(record.clone(), author.into(), &counts, false);
        // A retweet carries its retweeted tweet (gone: the retweet is being deleted too), a
        // tweet its mentioned users.
        let tweet = match crate::tweets::complete(&worker.db, &worker.cache, None, tweet).await {
            Ok(tweet) => tweet,
            Err(ApiError::NotFound) => return Ok(None),
            Err(e) => anyhow::bail!("completing the tweet object: {e}"),
        };
        Ok(Some(Arc::new((tweet, record))))
    };
    let mut object = load_object(0).await?;
    // The previous batch's cache step, overlapping this batch's insert.
    let mut cache_step: Option<tokio::task::JoinHandle<()>> = None;
    // Batches rolled back by the pull clock's check (see crate::hybrid).
    let mut conflicts = 0;
    loop {
        let mut tx = worker.db.begin().await?;
        // Also waits for, or excludes, a concurrent delete of the tweet.
        let tweet: Option<FannedOut> = sqlx::query_as(
            "select user_id, created_at, pulled, edit_version, in_reply_to_user_id,
                    retweeted_tweet_id
             from tweets where id = $1 for key share",
        )
        .bind(tweet_id)
        .fetch_optional(&mut *tx)
        .await
        .context("locking the tweet")?;
        let Some((author, created_at, pulled, version, reply_to, retweeted)) = tweet else {
            break; // deleted meanwhile
        };
        // Edited since the object was read: the streams get the text as it is now (from
        // Postgres if the edit's cache step has not run yet). An edit waits for this batch
        // (`for update`) and tells its readers after: an event of this batch that comes after
        // the edit's is replaced by each process's hub (crate::streams::Hub).
        if object.as_ref().is_some_and(|o| o.1.edit_version < version) {
            object = load_object(version).await?;
        }
        if pulled {
            break; // its readers pull it (see crate::hybrid)
        }
        lock_followers(&mut tx, author, false).await?;
        let batch: Vec<(i64, Timestamp)> = sqlx::query_as(
            "select from_user_id, created_at from friendships
             where to_user_id = $1 and created_at > coalesce($2, '-infinity')
               and created_at <= coalesce($4, 'infinity')
             order by created_at limit $3",
        )
        .bind(author)
        .bind(progress)
        .bind(worker.batch_size as i64)
        .bind(until)
        .fetch_all(&mut *tx)
        .await
        .context("locking a batch of followers")?;
        let Some(&(_, last)) = batch.last() else {
            break;
        };
        let mut followers: Vec<i64> = batch.iter().map(|(f, _)| *f).collect();
        // A reply goes to the followers who follow the replied-to user too (crate::replies).
        if let Some(to) = reply_to.filter(|_| !replies::reaches_all(author, reply_to)) {
            let kept = replies::reaching(&mut tx, to, &followers)
                .await
                .context("reading who follows the replied-to user")?;
            followers.retain(|f| kept.contains(f));
        }
        let lists: Vec<ListKey> = followers
            .iter()
            .map(|f| Timeline::Newsfeed(*f).key())
            .collect();
        // Each follower's entry time, under its newsfeed's head lock (ascending ids).
        let mut readers = followers.clone();
        readers.sort_unstable();
        readers.dedup();
        if conflicts >= hybrid::OPTIMISTIC_TRIES {
            // The heads, then the pull clock, held from before the stamps.
            lock_heads(&mut tx, &readers).await?;
            hybrid::lock_clock(&mut tx).await?;
        }
        let stamped = stamp(&mut tx, &readers, created_at)
            .await
            .context("stamping a batch of newsfeed entries")?;
        let times: Vec<Timestamp> = stamped.iter().map(|(_, at, _)| *at).collect();
        let prev_of: HashMap<i64, Option<Timestamp>> =
            stamped.iter().map(|(r, _, prev)| (*r, *prev)).collect();
        let readers: Vec<i64> = stamped.into_iter().map(|(r, _, _)| r).collect();
        // A follower whose newsfeed has the tweet already (a follow's backfill that ran first,
        // an unfollow and follow that moved a friendship between parts) gets no second row:
        // under the head locks, this statement's snapshot sees every row of the tweet in their
        // newsfeeds. Nor does one whose newsfeed shows the tweet a retweet retweets, by itself
        // or by another retweet (a status appears once: crate::retweets); a pulled original is
        // shown by the pull.
        // Their rows (a batch that committed before a crash, whose merges its outbox row has
        // not applied) are merged again: a merge is idempotent.
        let pulled_original = match retweeted {
            Some(status) => super::pulled_shows(&mut tx, status, &readers)
                .await
                .context("reading who pulls the retweeted tweet")?,
            None => Vec::new(),
        };
        let insert = sqlx::query_as(
            "with had as (
                 select user_id, id, created_at, tweet_id = $2 as same from newsfeeds
                 where user_id = any($1) and coalesce(status_id, tweet_id) = coalesce($4, $2)),
             ins as (
                 insert into newsfeeds (user_id, tweet_id, status_id, created_at, arrived_at)
                 select r, $2, $4, at, clock_timestamp()
                 from unnest($1::bigint[], $3::timestamptz[]) as x(r, at)
                 where r not in (select user_id from had) and r <> all($5)
                 returning user_id, id, created_at)
             select user_id, id, created_at, true, true from ins
             union all
             select user_id, id, created_at, false, same from had",
        )
        .bind(&readers)
        .bind(tweet_id)
        .bind(&times)
        .bind(retweeted)
        .bind(&pulled_original)
        .fetch_all(&mut *tx);
        // The guards are read under the followers lock, while the batch inserts.
        let (guards, rows) = tokio::join!(worker.cache.removal_generations(&lists), insert);
        let guards = guards.ok();
        let rows: Vec<(i64, i64, Timestamp, bool, bool)> =
            rows.context("inserting a batch of newsfeed rows")?;
        let mut had_it: Vec<i64> = rows.iter().filter(|r| !r.3).map(|r| r.0).collect();
        had_it.extend(&pulled_original);
        unstamp(&mut tx, &had_it)
            .await
            .context("putting back the heads of followers who had the tweet")?;
        // Rows of another tweet of the status (a retweet's original, another retweet) stay
        // as they are: not merged, not streamed.
        let rows: Vec<(i64, i64, Timestamp, bool)> = rows
            .into_iter()
            .filter(|r| r.4)
            .map(|(f, id, at, new, _)| (f, id, at, new))
            .collect();
        // Rows that were there already are streamed too: a follow's backfill that copied the
        // tweet first does not stream it (a stream skips a row it delivered).
        let arrivals: Vec<(i64, i64, Timestamp)> =
            rows.iter().map(|(f, id, at, _)| (*f, *id, *at)).collect();
        let row_of: HashMap<i64, (i64, Timestamp, bool)> = rows
            .into_iter()
            .map(|(f, id, at, new)| (f, (id, at, new)))
            .collect();
        let updates: Vec<Update> = followers
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let (id, at, new) = *row_of.get(f)?;
                let entry = ListEntry::stamped(id, tweet_id, author, created_at, at);
                let timeline = Timeline::Newsfeed(*f);
                let guard = guards.as_ref().and_then(|g| g.get(i).cloned());
                // A row merged again (it was there before this batch) follows no new head.
                let after = prev_of.get(f).copied().flatten().filter(|_| new);
                Some(timeline.guarded_merge(guard, after, &[entry]))
            })
            .collect();
        let staged = worker.cache.stage_merges(&mut tx, updates).await?;
        // The progress commits with the batch: a retry resumes exactly after it. A part's last
        // batch ends the part's job instead: its rows, its outbox row and the job's end commit
        // together, so the part is done when its last rows are (the cache step after the
        // commit is the outbox row's to repair, as for every batch).
        let done = batch.len() < worker.batch_size || until.is_some_and(|end| last >= end);
        if done && until.is_some() {
            jobs::finish(&mut *tx, job_id).await?;
        } else {
            jobs::save_progress(&mut *tx, job_id, jobs::Part::Followers, last).await?;
        }
        let new_times = row_of.values().filter(|r| r.2).map(|r| r.1);
        if !hybrid::check(&mut tx, new_times).await? {
            conflicts += 1;
            continue; // rolled back: stamp the batch again
        }
        tx.commit().await.context("committing a fan-out batch")?;
        // The streams (they only need the commit), then the cached newsfeeds, in a task of
        // their own while the next batch is inserted (its merges touch other followers' lists;
        // what a crash leaves undone, the batch's outbox row repairs). One such task at a time;
        // the publish used to hold the next batch back by about 1.5 ms.
        if let Some(previous) = cache_step.take() {
            let _ = previous.await;
        }
        let (cache, db, object) = (worker.cache.clone(), worker.db.clone(), object.clone());
        cache_step = Some(tokio::spawn(async move {
            if let Some(object) = object {
                let (tweet, record) = &*object;
                streams::publish_arrivals(&cache, tweet, record, &arrivals).await;
            }
            cache.finish(&db, staged).await
        }));
        progress = Some(last);
        if done {
            break;
        }
    }
    if let Some(last) = cache_step {
        let _ = last.await;
    }
    Ok(())
}

/// A tweet as a fan-out batch reads it: author, time, pulled, edit version, the author it
/// replies to, the tweet it retweets.
type FannedOut = (i64, Timestamp, bool, i64, Option<i64>, Option<i64>);

/// Takes the transaction-scoped advisory lock on `author`'s followers: shared by fan-out
/// batches (parts of one fan-out run side by side), exclusive for an unfollow of `author`, so
/// an unfollow and a batch that could list the follower never overlap. One lock instead of a
/// row lock on each of a batch's friendships: `FOR SHARE` wrote a lock into every friendship
/// tuple (and the WAL) of every batch.
///
/// # Errors
/// Postgres failed.
pub async fn lock_followers(
    tx: &mut PgConnection,
    author: i64,
    exclusive: bool,
) -> sqlx::Result<()> {
    let sql = if exclusive {
        "select pg_advisory_xact_lock(hashtextextended('followers:' || $1, 0))"
    } else {
        "select pg_advisory_xact_lock_shared(hashtextextended('followers:' || $1, 0))"
    };
    sqlx::query(sql).bind(author).execute(tx).await.map(|_| ())
}

/// Most batches in one part of a split fan-out (see [`fn@fanout`]).
pub const PART_BATCHES: usize = 8;

/// Followers per part of a fan-out to `followers` (see [`fn@fanout`]): an even share of
/// `parts` parts, but at least one batch (a smaller part is not worth its job) and at most
/// [`PART_BATCHES`] batches (a big account's parts stay short, so other jobs interleave).
pub fn part_size(followers: usize, batch_size: usize, parts: usize) -> usize {
    let batch = batch_size.max(1);
    followers
        .div_ceil(parts.max(1))
        .clamp(batch, PART_BATCHES * batch)
}

/// Splits what remains of a fan-out of more than one part ([`part_size`]) into `fanout_part`
/// jobs for all parts but the last (see [`fn@fanout`]); returns the friendship timestamp where
/// they end (the job's new progress: the job runs the last part), or `None` if it is small
/// enough to run alone (or the tweet is gone).
///
/// The author's `followers_count` decides whether to look at all, and the part size; the parts
/// are then cut by walking the `(to_user_id, created_at)` index one part at a time (a stale
/// count only moves followers between the last part and the others).
async fn split_fanout(
    worker: &Worker,
    job_id: i64,
    tweet_id: i64,
    progress: Option<Timestamp>,
) -> anyhow::Result<Option<Timestamp>> {
    let mut tx = worker.db.begin().await?;
    let author: Option<(i64, i64)> = sqlx::query_as(
        "select t.user_id, u.followers_count from tweets t join users u on u.id = t.user_id
         where t.id = $1 and not t.pulled for key share of t",
    )
    .bind(tweet_id)
    .fetch_optional(&mut *tx)
    .await
    .context("locking the tweet")?;
    let Some((author, followers)) = author else {
        return Ok(None); // deleted, or pulled (no newsfeed fan-out)
    };
    let followers = usize::try_from(followers).unwrap_or(0);
    let part = part_size(followers, worker.batch_size, worker.fanout_parts);
    // The last friendship of every part but the last.
    let mut ends: Vec<Timestamp> = Vec::new();
    let mut after = progress;
    for _ in 1..followers.div_ceil(part) {
        let end: Option<Timestamp> = sqlx::query_scalar(
            "select created_at from friendships
             where to_user_id = $1 and created_at > coalesce($2, '-infinity')
             order by created_at offset $3 limit 1",
        )
        .bind(author)
        .bind(after)
        .bind(part as i64 - 1)
        .fetch_optional(&mut *tx)
        .await
        .context("cutting a fan-out into parts")?;
        let Some(end) = end else { break };
        ends.push(end);
        after = Some(end);
    }
    let Some(&last) = ends.last() else {
        return Ok(None);
    };
    let mut start = progress;
    for &end in &ends {
        let job = jobs::Job::FanoutPart {
            tweet_id,
            progress: start,
            until: end,
        };
        jobs::enqueue(&mut tx, &job).await?;
        start = Some(end);
    }
    jobs::save_progress(&mut *tx, job_id, jobs::Part::Followers, last).await?;
    tx.commit()
        .await
        .context("queueing the parts of a fan-out")?;
    tracing::debug!(parts = ends.len() + 1, tweet_id, "fan-out split into parts");
    worker.announce();
    Ok(Some(last))
}

/// A fan-out job taken into a batch: its id and its tweet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fresh {
    pub job_id: i64,
    pub tweet_id: i64,
}

/// What [`fanout_batch`] left, in the order to run it: a job whose author has more followers
/// than one batch (when its tweet came first), the jobs after the batch's end (its rows would
/// have made the batch larger than two batches of followers, or a big account's tweet came
/// next), and jobs done with their newsfeeds whose author is in a list (their list timelines
/// are next).
#[derive(Debug, Default)]
pub struct Leftover {
    /// Jobs to run whole with [`fn@fanout`] (before `later`).
    pub whole: Vec<Fresh>,
    /// Jobs for the next call, in the order of their tweets.
    pub later: Vec<Fresh>,
    /// Jobs whose newsfeed part committed (their `progress` says so): the lists are left.
    pub lists: Vec<Fresh>,
}

/// Moves the heads of a fan-out batch's readers (`$1`) to their newest new entries (`$2`, in
/// the same order). `= any($1)` beside the join: the rows are found in the index whatever the
/// planner believes of the table's size. Joined only, with statistics from when the table held
/// one row, it scanned every head for each batch (100,001 of them, 13 ms, even for no reader:
/// BENCHMARKS.md, round 30). Public so a test can read its plan.
pub const MOVE_HEADS: &str = "update feed_heads h set head = x.head
     from unnest($1::bigint[], $2::timestamptz[]) as x(r, head)
     where h.user_id = any($1) and h.user_id = x.r";

/// Fan-out-on-write of many new tweets at once, for authors with at most one batch of
/// followers (almost every tweet): one transaction for all of them, with set-based statements
/// over every (follower, tweet) pair, instead of one job, four commits and about fifteen round
/// trips per tweet. Under a sustained write mix, the one-tweet path fell behind by six minutes
/// (issue 36; `scripts/fanout-lag`, decision 0003).
///
/// The guarantees of [`fn@fanout`] hold pair by pair: the authors' followers locks are taken
/// shared (ascending ids); every reader's head row is locked in one statement (ascending ids,
/// as [`stamp`] does, so batches and single writers never deadlock) and its new entries get
/// times above its head in the order of their tweets (`max(tweet time, previous + 1 µs)`);
/// a reader whose newsfeed has a tweet already gets no second row (the row is merged and
/// streamed again, as there); the heads end at each reader's newest entry; the lists' removal
/// generations are read under the locks; one outbox row holds every merge; the jobs of tweets
/// done (deleted ones included) end in the same commit. A job whose tweet's author is in a
/// list commits its newsfeed `progress` instead and is returned for its list part.
///
/// # Errors
/// Postgres failed: nothing of the batch committed, and its jobs are retried.
#[tracing::instrument(name = "newsfeeds::fanout_batch", skip_all, fields(jobs = jobs.len()))]
pub async fn fanout_batch(worker: &Worker, jobs: &[Fresh]) -> anyhow::Result<Leftover> {
    let mut tries = 0;
    loop {
        let lock_first = tries >= hybrid::OPTIMISTIC_TRIES;
        if let Some(left) = fanout_batch_once(worker, jobs, lock_first).await? {
            return Ok(left);
        }
        tries += 1; // rolled back by the pull clock's check: stamp the batch again
    }
}

/// A tweet of a batched fan-out: id, author, time, followers to write (0 if pulled), pulled,
/// edit version, the author it replies to, and whether it is a retweet.
type BatchTweet = (i64, i64, Timestamp, i64, bool, i64, Option<i64>, bool);

/// One try of [`fanout_batch`]: `None` if the pull clock's check rolled it back (a pulled tweet
/// newer than some of its entries committed meanwhile; see [`hybrid::check`]). `lock_first`:
/// hold the pull clock before stamping, so the check cannot fail.
async fn fanout_batch_once(
    worker: &Worker,
    jobs: &[Fresh],
    lock_first: bool,
) -> anyhow::Result<Option<Leftover>> {
    let mut left = Leftover::default();
    if jobs.is_empty() {
        return Ok(Some(left));
    }
    let tweet_ids: Vec<i64> = jobs.iter().map(|j| j.tweet_id).collect();
    let mut tx = worker.db.begin().await?;
    // Also waits for, or excludes, a concurrent delete of each tweet.
    // A pulled tweet (crate::hybrid) counts no followers: its readers pull it.
    let mut tweets: Vec<BatchTweet> = sqlx::query_as(
        "select t.id, t.user_id, t.created_at,
                case when t.pulled then 0 else u.followers_count end, t.pulled, t.edit_version,
                t.in_reply_to_user_id, t.retweeted_tweet_id is not null
         from tweets t join users u on u.id = t.user_id
         where t.id = any($1) for key share of t",
    )
    .bind(&tweet_ids)
    .fetch_all(&mut *tx)
    .await
    .context("locking the batch's tweets")?;
    let pulled: std::collections::HashSet<i64> =
        tweets.iter().filter(|t| t.4).map(|t| t.0).collect();
    tweets.sort_by_key(|&(id, _, at, ..)| (at, id));
    // Authors with more than a batch of followers go the one-tweet path (its parts and
    // per-batch progress); what would make this batch larger than two batches of followers'
    // rows waits for the next one.
    let job_of: HashMap<i64, i64> = jobs.iter().map(|j| (j.tweet_id, j.job_id)).collect();
    let (mut batch, mut pairs) = (Vec::new(), 0_usize);
    // The text each event must carry at least (an edit waits for this batch's lock).
    let version_of: HashMap<i64, i64> = tweets.iter().map(|t| (t.0, t.5)).collect();
    for &(id, author, at, followers, .., retweet) in &tweets {
        let followers = usize::try_from(followers).unwrap_or(usize::MAX);
        let job_id = job_of.get(&id).copied().unwrap_or_default();
        let fresh = Fresh {
            job_id,
            tweet_id: id,
        };
        if !left.later.is_empty() {
            left.later.push(fresh);
        } else if followers > worker.batch_size || retweet {
            // Run whole before any later tweet (the first of this batch: alone). A retweet
            // too: its rows skip the readers who show its tweet already (crate::retweets),
            // which the one-tweet path checks.
            if batch.is_empty() && left.whole.is_empty() {
                left.whole.push(fresh);
            } else {
                left.later.push(fresh);
            }
        } else if !left.whole.is_empty() || pairs + followers > 2 * worker.batch_size {
            // The next batch takes this and every later tweet, so that each reader gets its
            // entries in the order of their tweets.
            left.later.push(fresh);
        } else {
            pairs += followers;
            batch.push((id, author, at, job_id));
        }
    }
    let mut authors: Vec<i64> = batch.iter().map(|t| t.1).collect();
    authors.sort_unstable();
    authors.dedup();
    // The authors whose tweets here are fanned out (a pulled one's followers are not read).
    let mut pushing: Vec<i64> = batch
        .iter()
        .filter(|t| !pulled.contains(&t.0))
        .map(|t| t.1)
        .collect();
    pushing.sort_unstable();
    pushing.dedup();
    sqlx::query(
        "select pg_advisory_xact_lock_shared(hashtextextended('followers:' || a, 0))
         from (select a from unnest($1::bigint[]) as a order by a) s",
    )
    .bind(&authors)
    .execute(&mut *tx)
    .await
    .context("locking the authors' followers")?;
    let follows: Vec<(i64, i64, Timestamp)> = sqlx::query_as(
        "select to_user_id, from_user_id, created_at from friendships where to_user_id = any($1)",
    )
    .bind(&pushing)
    .fetch_all(&mut *tx)
    .await
    .context("reading the authors' followers")?;
    let mut followers_of: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut last_follow: HashMap<i64, Timestamp> = HashMap::new();
    for &(author, follower, at) in &follows {
        followers_of.entry(author).or_default().push(follower);
        let last = last_follow.entry(author).or_insert(at);
        *last = (*last).max(at);
    }
    // A stale count let a bigger account in: it goes the one-tweet path after all.
    batch.retain(|&(id, author, _, job_id)| {
        let fits = pulled.contains(&id)
            || followers_of.get(&author).map_or(0, Vec::len) <= worker.batch_size;
        if !fits {
            left.whole.push(Fresh {
                job_id,
                tweet_id: id,
            });
        }
        fits
    });
    // A reply goes to the followers who follow the replied-to user too (crate::replies).
    let reply_to: HashMap<i64, i64> = tweets
        .iter()
        .filter(|t| !replies::reaches_all(t.1, t.6))
        .filter_map(|t| Some((t.0, t.6?)))
        .collect();
    let mut reached: HashMap<i64, std::collections::HashSet<i64>> = HashMap::new();
    for &(id, author, ..) in &batch {
        let Some(&to) = reply_to.get(&id) else {
            continue;
        };
        let readers = followers_of.get(&author).map_or(&[][..], Vec::as_slice);
        let kept = replies::reaching(&mut tx, to, readers)
            .await
            .context("reading who follows the replied-to users")?;
        reached.insert(id, kept);
    }
    // Each reader's entries, in the order of their tweets.
    let mut wanted: HashMap<i64, Vec<(i64, i64, Timestamp)>> = HashMap::new();
    for &(id, author, at, _) in batch.iter().filter(|t| !pulled.contains(&t.0)) {
        for &reader in followers_of.get(&author).map_or(&[][..], Vec::as_slice) {
            if reached.get(&id).is_some_and(|kept| !kept.contains(&reader)) {
                continue;
            }
            wanted.entry(reader).or_default().push((id, author, at));
        }
    }
    let mut readers: Vec<i64> = wanted.keys().copied().collect();
    readers.sort_unstable();
    // Locks every reader's head (creating missing ones) in one statement, ascending; and reads
    // the pull clock (crate::hybrid): entries go above the newest pulled tweet.
    let heads: Vec<(i64, Option<Timestamp>, Option<Timestamp>)> = sqlx::query_as(
        "insert into feed_heads as h (user_id, head)
         select r, '-infinity' from unnest($1::bigint[]) with ordinality as x(r, i) order by i
         on conflict (user_id) do update set head = h.head
         returning user_id, nullif(head, '-infinity'),
                   (select nullif(at, '-infinity') from pull_clock)",
    )
    .bind(&readers)
    .fetch_all(&mut *tx)
    .await
    .context("locking the readers' heads")?;
    let mut pull_clock = heads.iter().filter_map(|h| h.2).max();
    if lock_first {
        // The pull clock after the heads, and read again under it.
        hybrid::lock_clock(&mut tx).await?;
        pull_clock = sqlx::query_scalar("select nullif(at, '-infinity') from pull_clock")
            .fetch_one(&mut *tx)
            .await
            .context("reading the pull clock")?;
    }
    let head_of: HashMap<i64, Option<Timestamp>> =
        heads.into_iter().map(|(r, head, _)| (r, head)).collect();
    let (mut pair_readers, mut pair_tweets, mut pair_times) = (Vec::new(), Vec::new(), Vec::new());
    for &reader in &readers {
        // Above the reader's head and the newest pulled tweet.
        let mut previous = head_of.get(&reader).copied().flatten().max(pull_clock);
        for &(tweet, _, at) in &wanted[&reader] {
            let time = match previous {
                Some(p) if p >= at => p + chrono::Duration::microseconds(1),
                _ => at,
            };
            pair_readers.push(reader);
            pair_tweets.push(tweet);
            pair_times.push(time);
            previous = Some(time);
        }
    }
    let keys: Vec<ListKey> = readers
        .iter()
        .map(|r| Timeline::Newsfeed(*r).key())
        .collect();
    // A reader whose newsfeed has a tweet already gets no second row (see [`fn@fanout`]), nor
    // one whose newsfeed shows it by a retweet (its row's tweet is the retweet, which this
    // batch does not merge or stream; crate::retweets); under the head locks this snapshot
    // sees every such row.
    let insert = sqlx::query_as(
        "with pairs as (
             select * from unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) as p(r, t, at)),
         had as (
             select n.user_id, n.tweet_id, n.id, n.created_at, p.t from newsfeeds n
             join pairs p on coalesce(n.status_id, n.tweet_id) = p.t and n.user_id = p.r),
         ins as (
             insert into newsfeeds (user_id, tweet_id, created_at, arrived_at)
             select p.r, p.t, p.at, clock_timestamp() from pairs p
             where not exists (select 1 from had where had.user_id = p.r and had.t = p.t)
             order by p.r, p.at
             returning user_id, tweet_id, id, created_at)
         select user_id, tweet_id, id, created_at, true from ins
         union all
         select user_id, tweet_id, id, created_at, false from had",
    )
    .bind(&pair_readers)
    .bind(&pair_tweets)
    .bind(&pair_times)
    .fetch_all(&mut *tx);
    let (guards, rows) = tokio::join!(worker.cache.removal_generations(&keys), insert);
    let guards = guards.ok();
    let rows: Vec<(i64, i64, i64, Timestamp, bool)> =
        rows.context("inserting the batch's newsfeed rows")?;
    // The heads end at each reader's newest new entry (a reader that got none keeps its head).
    let mut newest: HashMap<i64, Timestamp> = HashMap::new();
    let mut had_any: std::collections::HashSet<i64> = std::collections::HashSet::new();
    for &(reader, _, _, at, new) in &rows {
        if new {
            let n = newest.entry(reader).or_insert(at);
            *n = (*n).max(at);
        } else {
            had_any.insert(reader);
        }
    }
    let (moved, to): (Vec<i64>, Vec<Timestamp>) = newest.iter().map(|(r, t)| (*r, *t)).unzip();
    if !moved.is_empty() {
        sqlx::query(MOVE_HEADS)
            .bind(&moved)
            .bind(&to)
            .execute(&mut *tx)
            .await
            .context("moving the readers' heads")?;
    }
    // One merge per reader, of all its entries; it follows the reader's old head unless a row
    // was there before (merged again, it follows no new head).
    let author_of: HashMap<i64, (i64, Timestamp)> =
        batch.iter().map(|&(id, a, at, _)| (id, (a, at))).collect();
    let mut entries_of: HashMap<i64, Vec<ListEntry>> = HashMap::new();
    let mut arrivals: HashMap<i64, Vec<(i64, i64, Timestamp)>> = HashMap::new();
    for &(reader, tweet, id, at, _) in &rows {
        let Some(&(author, tweet_at)) = author_of.get(&tweet) else {
            continue;
        };
        entries_of
            .entry(reader)
            .or_default()
            .push(ListEntry::stamped(id, tweet, author, tweet_at, at));
        arrivals.entry(tweet).or_default().push((reader, id, at));
    }
    let updates: Vec<Update> = readers
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let mut entries = entries_of.remove(r)?;
            entries.sort_by_key(|e| e.created_at);
            let guard = guards.as_ref().and_then(|g| g.get(i).cloned());
            let after = head_of
                .get(r)
                .copied()
                .flatten()
                .filter(|_| !had_any.contains(r));
            Some(Timeline::Newsfeed(*r).guarded_merge(guard, after, &entries))
        })
        .collect();
    let staged = worker.cache.stage_merges(&mut tx, updates).await?;
    // Jobs: a deleted tweet's ends here; a tweet whose author is in a list keeps its job, with
    // its newsfeed part recorded as done, for the list part.
    let in_lists: Vec<i64> =
        sqlx::query_scalar("select distinct user_id from list_members where user_id = any($1)")
            .bind(&authors)
            .fetch_all(&mut *tx)
            .await
            .context("finding the authors in lists")?;
    let (mut ended, mut progressed, mut progress) = (Vec::new(), Vec::new(), Vec::new());
    for job in jobs {
        if left.whole.contains(job) || left.later.contains(job) {
            continue;
        }
        match author_of.get(&job.tweet_id) {
            Some((author, _)) if in_lists.contains(author) => {
                left.lists.push(*job);
                if let Some(at) = last_follow.get(author) {
                    progressed.push(job.job_id);
                    progress.push(*at);
                }
            }
            _ => ended.push(job.job_id),
        }
    }
    sqlx::query("delete from jobs where id = any($1)")
        .bind(&ended)
        .execute(&mut *tx)
        .await
        .context("ending the batch's jobs")?;
    if !progressed.is_empty() {
        // `= any($1)`: found in the index whatever the statistics say (see MOVE_HEADS).
        sqlx::query(
            "update jobs j set progress = x.at
             from unnest($1::bigint[], $2::timestamptz[]) as x(id, at)
             where j.id = any($1) and j.id = x.id",
        )
        .bind(&progressed)
        .bind(&progress)
        .execute(&mut *tx)
        .await
        .context("recording the batch's progress")?;
    }
    let new_times = rows.iter().filter(|r| r.4).map(|r| r.3);
    if !hybrid::check(&mut tx, new_times).await? {
        return Ok(None); // rolled back
    }
    tx.commit().await.context("committing a fan-out batch")?;
    // The streams, in the order of the tweets, then the cached newsfeeds (the outbox row
    // repairs what a crash leaves).
    if worker.cache.enabled() {
        let loads = batch
            .iter()
            .map(|&(id, ..)| id)
            .filter(|id| arrivals.contains_key(id))
            .map(|id| (id, version_of.get(&id).copied().unwrap_or_default()))
            .map(|(id, version)| async move {
                let loaded = tweets::load_version(&worker.db, &worker.cache, id, version).await;
                (id, loaded)
            });
        for (id, loaded) in futures_util::future::join_all(loads).await {
            if let (Ok(Some((record, counts, author))), Some(rows)) = (loaded, arrivals.get(&id)) {
                let mut tweet = Tweet::new(record.clone(), author.into(), &counts, false);
                // Without its mentioned users if Postgres fails now: the rows are committed.
                let _ = crate::mentions::complete(&worker.db, &worker.cache, &mut tweet).await;
                streams::publish_arrivals(&worker.cache, &tweet, &record, rows).await;
            }
        }
    }
    worker.cache.finish(&worker.db, staged).await;
    Ok(Some(left))
}

//! The job steps every fan-out-on-write timeline shares (newsfeeds and lists; Mastodon's
//! `FeedManager` merge / unmerge): when a (timeline, source) pair begins, **backfill** copies
//! the source's newest tweets into the timeline; when it ends, **unmerge** takes them out.
//!
//! Both steps of one pair take the same advisory lock and re-check the pair under it (the
//! unmerge once more in its delete: the pair's own writes do not take that lock), so
//! begin / end / begin in any job order ends with the timeline matching the last state. The
//! backfill's merge is guarded by the list's removal generation read under that lock; the
//! unmerge stages its removal in the delete's transaction, so a crash after the commit (when a
//! re-run would find nothing to delete) is still repaired by the outbox relay.

use anyhow::Context;
use sqlx::PgConnection;

use crate::cache::Update;
use crate::jobs::Worker;
use crate::timeline::{ListEntry, Timeline};

/// A (timeline, source) pair and the SQL that keeps its rows: a follower's newsfeed and a
/// followee, or a list and a member. Every statement binds `$1` = `owner`, `$2` = `source`.
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    /// The timeline that gains or loses the rows (of `owner`).
    pub timeline: Timeline,
    /// The follower or the list.
    pub owner: i64,
    /// The followee or the member, whose tweets move.
    pub source: i64,
    /// The advisory lock's name (`newsfeed-pair`, `list-member`).
    pub lock: &'static str,
    /// Whether the timeline's entries are ordered with pulled tweets (a newsfeed): the
    /// backfill ends with the pull clock's check ([`crate::hybrid::check`]).
    pub pull_clock: bool,
    /// `select exists (…)`: does the pair exist now?
    pub exists: &'static str,
    /// A statement the backfill runs first (binds as `copy`) that locks the rows `copy` will
    /// read `for key share`: tweet rows before the timeline's head, the lock order of every
    /// writer. (The copy locks them again; a tweet posted in between is locked late.)
    pub lock_source: Option<&'static str>,
    /// A statement the backfill runs before `copy` that returns the timeline's newest entry
    /// time, if any (a newsfeed takes its head lock: [`crate::newsfeeds::stamp`]): the
    /// predecessor that guards the backfill's cache merge. A timeline with a head (a newsfeed)
    /// also has its unmerge mark the removal there ([`crate::newsfeeds::mark_removals`]), so
    /// no later merge lands on a cached list this removal has not reached.
    pub head: Option<&'static str>,
    /// The backfill's `insert … returning` [`ListEntry`] columns (`$3` = how many tweets; the
    /// arrival time is Postgres's `clock_timestamp()`).
    pub copy: &'static str,
    /// The unmerge's `delete … returning` [`ListEntry`] columns. It deletes nothing if the pair
    /// exists (`exists`, repeated in the delete): the unmerge's check and its delete are two
    /// statements, and a pair begun again in between (a follow that came back while the
    /// unmerge waited for a lock) would otherwise lose entries fanned out to it since, which
    /// its backfill then brought back on top (a client's refresh returned them again).
    pub remove: &'static str,
    /// A newsfeed's: `select` of the statuses (tweets, by themselves or by a retweet) that the
    /// unmerge's rows show and that another entry may show next (a retweet by another
    /// followee, or the tweet itself), run before `remove`: after it, each gets
    /// [`crate::retweets::reveal`]ed (a status stays in a newsfeed while a followee still
    /// brings it).
    pub reveals: Option<&'static str>,
}

impl Pair {
    async fn lock_and_check(&self, tx: &mut PgConnection) -> anyhow::Result<bool> {
        sqlx::query(
            "select pg_advisory_xact_lock(hashtextextended($3 || ':' || $1 || ':' || $2, 0))",
        )
        .bind(self.owner)
        .bind(self.source)
        .bind(self.lock)
        .execute(&mut *tx)
        .await
        .context("locking the pair")?;
        Ok(sqlx::query_scalar(self.exists)
            .bind(self.owner)
            .bind(self.source)
            .fetch_one(&mut *tx)
            .await?)
    }
}

/// Backfill: if the pair still exists, copies the source's newest `backfill_limit` tweets into
/// the timeline and merges them into its cached list.
///
/// # Errors
/// Postgres failed; the job is retried.
pub async fn backfill(worker: &Worker, pair: &Pair) -> anyhow::Result<()> {
    // Tries rolled back by the pull clock's check (crate::hybrid::check).
    let mut conflicts = 0;
    loop {
        let mut tx = worker.db.begin().await?;
        if !pair.lock_and_check(&mut tx).await? {
            return Ok(()); // ended meanwhile
        }
        if let Some(sql) = pair.lock_source {
            sqlx::query(sql)
                .bind(pair.owner)
                .bind(pair.source)
                .bind(worker.backfill_limit as i64)
                .execute(&mut *tx)
                .await
                .context("locking the tweets to copy")?;
        }
        let guard = worker
            .cache
            .removal_generations(&[pair.timeline.key()])
            .await
            .ok()
            .and_then(|mut g| g.pop());
        let after: Option<crate::time::Timestamp> = match pair.head {
            Some(head) => sqlx::query_scalar(head)
                .bind(pair.owner)
                .fetch_one(&mut *tx)
                .await
                .context("locking the timeline's head")?,
            None => None,
        };
        if pair.pull_clock && conflicts >= crate::hybrid::OPTIMISTIC_TRIES {
            // After the head's lock, before the copy reads the clock.
            crate::hybrid::lock_clock(&mut tx).await?;
        }
        let rows: Vec<ListEntry> = sqlx::query_as(pair.copy)
            .bind(pair.owner)
            .bind(pair.source)
            .bind(worker.backfill_limit as i64)
            .fetch_all(&mut *tx)
            .await
            .context("inserting the backfill")?;
        if rows.is_empty() {
            return Ok(());
        }
        let staged = worker
            .cache
            .stage(&mut tx, &[pair.timeline.guarded_merge(guard, after, &rows)])
            .await?;
        let times = rows.iter().map(|r| r.created_at);
        if pair.pull_clock && !crate::hybrid::check(&mut tx, times).await? {
            conflicts += 1;
            continue; // rolled back: copy again
        }
        tx.commit().await.context("committing the backfill")?;
        worker.cache.finish(&worker.db, staged).await;
        return Ok(());
    }
}

/// Unmerge: unless the pair exists again by now, removes the source's tweets from the timeline
/// and from its cached list; in a newsfeed, a status they showed that another followee still
/// brings (a retweet of it, or the tweet itself) comes back as a new entry on top
/// ([`Pair::reveals`]).
///
/// # Errors
/// Postgres failed; the job is retried.
pub async fn unmerge(worker: &Worker, pair: &Pair) -> anyhow::Result<()> {
    let mut tx = worker.db.begin().await?;
    if pair.lock_and_check(&mut tx).await? {
        return Ok(()); // begun again: its backfill keeps the rows
    }
    let statuses: Vec<i64> = match pair.reveals {
        Some(sql) => sqlx::query_scalar(sql)
            .bind(pair.owner)
            .bind(pair.source)
            .fetch_all(&mut *tx)
            .await
            .context("reading the statuses to reveal")?,
        None => Vec::new(),
    };
    // Before any newsfeed row is taken (see lock_for_reveal).
    crate::retweets::lock_for_reveal(&mut tx, &statuses)
        .await
        .context("locking the statuses to reveal")?;
    let rows: Vec<ListEntry> = sqlx::query_as(pair.remove)
        .bind(pair.owner)
        .bind(pair.source)
        .fetch_all(&mut *tx)
        .await
        .context("deleting the rows")?;
    if rows.is_empty() {
        return Ok(());
    }
    // The next entries of the statuses the rows took away: merged before the removal, whose
    // removal generation would refuse them (they are other members).
    let mut updates = Vec::new();
    for status in statuses {
        let Some(next) =
            crate::retweets::reveal(&mut tx, &worker.cache, status, &[pair.owner]).await?
        else {
            anyhow::bail!("a new retweet's author is being unfollowed: the unmerge is retried");
        };
        updates.extend(next);
    }
    // After the reveals, whose merges name the head before it as their predecessor.
    let mark = match pair.head {
        Some(_) => crate::newsfeeds::mark_removals(&mut tx, &[pair.owner])
            .await
            .context("marking the removal")?
            .first()
            .map(|(_, at)| crate::time::to_micros(*at)),
        None => None,
    };
    updates.push(Update::Remove {
        list: pair.timeline.key(),
        members: rows.iter().map(|e| pair.timeline.member(e)).collect(),
        mark,
    });
    let staged = worker.cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the unmerge")?;
    worker.cache.finish(&worker.db, staged).await;
    Ok(())
}

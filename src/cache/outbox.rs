//! The outbox relay, and the monitor that brings Redis (back) into use.
//!
//! Every write records the repairs of its cache updates in `cache_outbox` inside its own
//! transaction (see [`super::update`]); the post-commit step deletes the row once Redis confirmed
//! the updates. Rows that remain (the process died after the commit, Redis failed or timed out)
//! are applied here by whichever process gets to them first: each relay pass claims rows with
//! `FOR UPDATE SKIP LOCKED` (one process per row), applies their repairs to Redis and deletes
//! them in the same transaction.
//!
//! The monitor, in every `chirp serve` and `chirp worker` process: while Redis is marked down, every
//! 500 ms it tries [`recover`] (ping, verify the [`super::epoch`], relay every row, then use Redis
//! again); while Redis is in use, every second it verifies the epoch and relays rows older than
//! [`RELAY_AFTER`] (younger ones are still being handled by their writer). It also starts the
//! process's hand-off listener ([`super::handoff`]), which applies at once the rows of writers
//! that lost Redis.

use std::time::Duration;

use anyhow::Context;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::watch;

use crate::cache::{Cache, CacheUnavailable, MarkUp, Repair, epoch, tokens};

/// Age after which the relay takes over a row from the writer's own post-commit step.
pub const RELAY_AFTER: Duration = Duration::from_secs(5);
/// Most repairs sent to Redis in one pipeline by the relay.
const REPAIRS_PER_PIPELINE: usize = 2000;

/// The outbox's size ([`backlog`]): rows not yet applied, and the oldest one's age.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct Backlog {
    pub rows: i64,
    /// Milliseconds; `None` with no rows.
    pub oldest_age_ms: Option<i64>,
}

/// Reads the outbox's [`Backlog`]: a count, and the oldest row by id (ids follow insertion).
///
/// # Errors
/// Postgres failed.
pub async fn backlog(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<Backlog> {
    sqlx::query_as(
        "select (select count(*) from cache_outbox) as rows,
                (select (extract(epoch from now() - created_at) * 1000)::bigint
                 from cache_outbox order by id limit 1) as oldest_age_ms",
    )
    .fetch_one(db)
    .await
}

/// Applies and deletes the outbox rows at least `min_age` old that exist when it starts (rows
/// written meanwhile wait for the next pass, so a pass ends even under a stream of writes);
/// returns how many rows. A row this version can not read is left in place and logged.
///
/// # Errors
/// Redis or Postgres failed; the rows not yet applied stay in the table.
pub async fn relay(cache: &Cache, db: &PgPool, min_age: Duration) -> anyhow::Result<usize> {
    Ok(relay_rows(cache, db, min_age, None).await?.deleted)
}

/// Applies and deletes outbox row `id` at once, even while Redis is marked down (as the relay
/// does): what a writer does when its own cache step failed or was not tried, before it
/// answers. Until then a reader's load that began before the write's commit could still store
/// what the write replaced (the repairs bump the generations that refuse it), and another
/// process could answer from its memory for the seconds until the relay took the row. Returns
/// whether the row was applied (or is gone: another process's relay took it). A row applied
/// but kept for a replica's acknowledgement counts as applied: Redis's master and every
/// process's memory hold the write; only its durability waits (see `super::conn`).
pub async fn relay_one(cache: &Cache, db: &PgPool, id: i64) -> bool {
    match relay_rows(cache, db, Duration::ZERO, Some(id)).await {
        Ok(relayed) if relayed.deleted + relayed.kept > 0 => true,
        Ok(_) => {
            let left: Result<bool, _> =
                sqlx::query_scalar("select exists (select 1 from cache_outbox where id = $1)")
                    .bind(id)
                    .fetch_one(db)
                    .await;
            matches!(left, Ok(false))
        }
        Err(e) => {
            tracing::debug!(error = %e, outbox_id = id, "outbox row left to the relay");
            false
        }
    }
}

/// Most applied rows one delete takes; a writer that finds this many waiting deletes its own
/// row itself (back-pressure while Postgres is slow, and the pending list stays bounded).
pub const FORGET_BATCH: usize = 4096;

/// The applied outbox rows of this process's writers, waiting for their delete, and whether a
/// delete is running: a write's cache step hands its row here ([`Cache::forget_applied`])
/// instead of deleting it on its answer's path, and one delete at a time takes every row handed
/// in meanwhile, as a group commit takes every transaction that waits for the log: one
/// statement per burst of writes instead of one per write (decision 0032).
#[derive(Default)]
pub struct Forgets {
    state: std::sync::Mutex<ForgetState>,
    /// Woken after each delete ([`Cache::forgotten`]).
    deleted: tokio::sync::Notify,
}

#[derive(Default)]
struct ForgetState {
    /// Rows handed in and not taken yet, in the order they came.
    pending: Vec<i64>,
    /// A deleter is running (it takes every row pushed while this is set).
    running: bool,
    /// Rows handed in since the process started.
    handed: u64,
    /// Of those, the first `done` were deleted (or their delete failed).
    done: u64,
}

impl Forgets {
    fn lock(&self) -> std::sync::MutexGuard<'_, ForgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Marks the deleter stopped if its task ends before its work (its runtime shut down): the
/// rows it held or left pending are left to the relay, and waiters are released.
struct Running<'a> {
    forgets: &'a Forgets,
    stopped: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.stopped {
            let mut s = self.forgets.lock();
            s.pending.clear();
            (s.running, s.done) = (false, s.handed);
            drop(s);
            self.forgets.deleted.notify_waiters();
        }
    }
}

impl Cache {
    /// Hands outbox row `id`, whose writer applied it, to this process's deleter
    /// ([`Forgets`]): the last step of a write's cache step ([`Cache::finish`]), which does not
    /// wait for the delete. Never fails: a row left behind (the delete failed, the process
    /// stopped first) is re-applied by the relay after [`RELAY_AFTER`], harmlessly (its repairs
    /// are late-safe), and a repeated write's [`settle`] waits for this process's deletes
    /// first.
    pub(crate) fn forget_applied(&self, db: &PgPool, id: i64) {
        let Some(forgets) = self.forgets() else {
            return;
        };
        let start = {
            let mut s = forgets.lock();
            if s.pending.len() >= FORGET_BATCH {
                None
            } else {
                s.pending.push(id);
                s.handed += 1;
                Some(!std::mem::replace(&mut s.running, true))
            }
        };
        match start {
            // Too many waiting: this writer's own delete, on its own task.
            None => drop(tokio::spawn(delete_applied(
                self.clone(),
                db.clone(),
                vec![id],
            ))),
            Some(true) => drop(tokio::spawn(forget_pending(self.clone(), db.clone()))),
            Some(false) => {} // the running deleter takes it with its next batch
        }
    }

    /// Waits until every row handed to [`Cache::forget_applied`] before the call was deleted
    /// (or its delete failed): at most two deletes' time, however many writes follow. A row
    /// its writer deleted on its own task (more than [`FORGET_BATCH`] were waiting) is not
    /// waited for. What [`settle`], a graceful shutdown and tests wait for. Returns at once
    /// with the cache off.
    pub async fn forgotten(&self) {
        let Some(forgets) = self.forgets() else {
            return;
        };
        let target = forgets.lock().handed;
        loop {
            let deleted = forgets.deleted.notified();
            tokio::pin!(deleted);
            deleted.as_mut().enable();
            if forgets.lock().done >= target {
                return;
            }
            deleted.await;
        }
    }
}

/// The deleter: takes every pending row, deletes them in one statement, and again until none
/// is left. It stops under the lock that writers push under: a writer either pushed before
/// the last look (and its row is taken) or finds the deleter stopped and starts another.
async fn forget_pending(cache: Cache, db: PgPool) {
    let Some(forgets) = cache.forgets() else {
        return;
    };
    let mut running = Running {
        forgets,
        stopped: false,
    };
    loop {
        let (ids, upto) = {
            let mut s = forgets.lock();
            if s.pending.is_empty() {
                s.running = false;
                running.stopped = true;
                return;
            }
            let take = s.pending.len().min(FORGET_BATCH);
            let ids = s.pending.drain(..take).collect::<Vec<_>>();
            (ids, s.handed - s.pending.len() as u64)
        };
        delete_applied(cache.clone(), db.clone(), ids).await;
        let mut s = forgets.lock();
        s.done = s.done.max(upto);
        drop(s);
        forgets.deleted.notify_waiters();
    }
}

/// Deletes the applied outbox rows `ids`. The delete commits asynchronously (`SET LOCAL
/// synchronous_commit = off`, in the same message, so one round trip): it is visible to every
/// session at once, but its commit does not wait for the WAL to reach the disk. Its durability
/// buys nothing (a delete lost in a Postgres crash only brings the rows back for the relay;
/// decision 0031).
async fn delete_applied(cache: Cache, db: PgPool, ids: Vec<i64>) {
    // Integers from our own rows: nothing a client wrote reaches this text.
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let sql = format!(
        "set local synchronous_commit = off; delete from cache_outbox where id in ({list})"
    );
    match sqlx::raw_sql(AssertSqlSafe(sql)).execute(&db).await {
        Ok(_) => {
            if let Some(stats) = cache.stats() {
                let ordering = std::sync::atomic::Ordering::Relaxed;
                stats.outbox_deletes.fetch_add(1, ordering);
                stats.outbox_forgotten.fetch_add(ids.len() as u64, ordering);
            }
        }
        // Harmless: the relay re-applies the repairs later.
        Err(e) => {
            tracing::warn!(error = %e, rows = ids.len(), "could not delete applied outbox rows")
        }
    }
}

/// How long [`settle`] waits for the writers of the rows it found to delete them themselves
/// before it applies what is left.
pub const SETTLE_WAIT: Duration = Duration::from_millis(50);

/// Makes every outbox row that exists now applied before it returns: what a write that found
/// its effect already made (a follow, a like or a retweet asked for again; an undo with
/// nothing left to delete) does before it answers. The write that made it may have committed
/// on a process that stopped before its cache step (a client's retry on another process after
/// a timeout is just that); the repeated write's answer promises its effect, so every process
/// must show it from then on, not only once the relay takes the row (read-your-writes through
/// a crash: found by the history checker's 10-minute run, seed 13287291949698396313).
///
/// It first waits for this process's own applied rows to be deleted ([`Cache::forgotten`]).
/// Most rows found then belong to writes in flight, whose writers delete them within
/// milliseconds: `settle` waits up to [`SETTLE_WAIT`] for those (one indexed read every 5 ms),
/// then applies what is left as the relay does (late-safe repairs: a row whose writer is only
/// slow is applied twice, harmlessly) and waits for rows another relay holds. With no row, one
/// read. Returns whether every such row was applied (false: Redis or Postgres failed; the relay
/// applies them later).
pub async fn settle(cache: &Cache, db: &PgPool) -> bool {
    if !cache.enabled() {
        return true;
    }
    match settle_rows(cache, db).await {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "outbox not settled");
            false
        }
    }
}

async fn settle_rows(cache: &Cache, db: &PgPool) -> anyhow::Result<()> {
    // This process's applied rows still waiting for their delete: gone first, so they are
    // not waited for below, nor applied again.
    cache.forgotten().await;
    // At most a relay pass's worth: more rows than that mean the relay is behind (Redis was
    // down), and the passes below take them all anyway.
    let mut pending: Vec<i64> =
        sqlx::query_scalar("select id from cache_outbox order by id limit 1000")
            .fetch_all(db)
            .await?;
    let Some(&upto) = pending.last() else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    while !pending.is_empty() && pending.len() < 1000 && started.elapsed() < SETTLE_WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
        pending = sqlx::query_scalar("select id from cache_outbox where id = any($1) order by id")
            .bind(&pending)
            .fetch_all(db)
            .await?;
    }
    if pending.is_empty() {
        return Ok(());
    }
    // Twice: the first pass skips rows another process's relay holds; waiting for their
    // locks, then passing again, applies what that relay left (it failed, or kept them).
    for _ in 0..2 {
        relay_rows(cache, db, Duration::ZERO, None).await?;
        let mut tx = db.begin().await?;
        let left: Vec<i64> =
            sqlx::query_scalar("select id from cache_outbox where id <= $1 for update")
                .bind(upto)
                .fetch_all(&mut *tx)
                .await?;
        tx.rollback().await?;
        if left.is_empty() {
            break;
        }
    }
    // Rows still there were applied and kept for a replica's acknowledgement (see
    // `super::conn`): Redis's master and every process's memory hold them.
    Ok(())
}

/// What a relay pass did: rows applied and deleted, rows applied and kept (a replica did not
/// acknowledge them in time).
#[derive(Debug, Default, Clone, Copy)]
struct Relayed {
    deleted: usize,
    kept: usize,
}

/// [`relay`] of the rows at least `min_age` old, or of row `only` alone.
async fn relay_rows(
    cache: &Cache,
    db: &PgPool,
    min_age: Duration,
    only: Option<i64>,
) -> anyhow::Result<Relayed> {
    let mut done = Relayed::default();
    let Some(ttl) = cache.ttl() else {
        return Ok(done);
    };
    let upto: Option<i64> = sqlx::query_scalar("select max(id) from cache_outbox")
        .fetch_one(db)
        .await
        .context("reading the outbox")?;
    let Some(upto) = upto else { return Ok(done) };
    let mut after = 0_i64;
    loop {
        let mut tx = db.begin().await.context("starting an outbox relay pass")?;
        let rows: Vec<(i64, Json<serde_json::Value>)> = sqlx::query_as(
            "select id, repairs from cache_outbox
             where id > $1 and id <= $2 and created_at <= now() - make_interval(secs => $3)
               and ($4::bigint is null or id = $4)
             order by id limit 100
             for update skip locked",
        )
        .bind(after)
        .bind(upto)
        .bind(min_age.as_secs_f64())
        .bind(only)
        .fetch_all(&mut *tx)
        .await
        .context("claiming outbox rows")?;
        let Some(&(last, _)) = rows.last() else {
            return Ok(done);
        };
        after = last;
        let mut pipe = redis::pipe();
        let mut queued = 0;
        let mut replicated = true;
        let mut short = Vec::new();
        let mut applied = Vec::with_capacity(rows.len());
        let mut revoked = Vec::new();
        let mut evicted = Vec::new();
        for (id, Json(raw)) in &rows {
            let repairs: Vec<Repair> = match serde_json::from_value(raw.clone()) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, outbox_id = id, "outbox row this version can not read; left in place");
                    continue;
                }
            };
            for r in &repairs {
                r.pipe(&mut pipe, ttl, true);
                if let Repair::Tombstone { key } = r
                    && let Some(hex) = tokens::hex_of_token_key(key)
                {
                    revoked.push(hex.to_owned());
                }
            }
            evicted.extend(super::update::near_evictions(&repairs));
            queued += repairs.iter().map(Repair::commands).sum::<usize>();
            applied.push(*id);
            if queued >= REPAIRS_PER_PIPELINE {
                replicated &= flush(cache, &mut pipe, &mut queued, &mut short).await?;
            }
        }
        replicated &= flush(cache, &mut pipe, &mut queued, &mut short).await?;
        if replicated && let Err(e) = epoch::distrust_replicas(cache, db, &short).await {
            tracing::warn!(error = %e, "could not take replicas out of the epoch's record");
            replicated = false;
        }
        // Deletes and profile changes whose process died before announcing them: every
        // process's near cache of objects.
        if let Some(near) = cache.near_objects() {
            near.evict_everywhere(cache, &evicted)
                .await
                .map_err(|CacheUnavailable| anyhow::anyhow!("redis unavailable"))?;
        }
        // Logouts whose process died before announcing them: every process's token memory.
        for hex in revoked.drain(..) {
            tokens::broadcast(cache, &hex)
                .await
                .map_err(|CacheUnavailable| anyhow::anyhow!("redis unavailable"))?;
        }
        if !replicated {
            // Applied, but a replica may lack them and is still trusted (a shortfall that could
            // not be put on a master, or whose replicas could not leave the epoch's record):
            // keep the rows for the next pass, so a failover can not lose them (see
            // `super::conn`).
            tx.commit().await.context("ending an outbox relay pass")?;
            done.kept += applied.len();
            tracing::warn!(
                rows = applied.len(),
                "outbox rows applied but not acknowledged by a replica; kept for the next pass"
            );
            continue;
        }
        sqlx::query("delete from cache_outbox where id = any($1)")
            .bind(&applied)
            .execute(&mut *tx)
            .await
            .context("deleting relayed outbox rows")?;
        tx.commit()
            .await
            .context("committing an outbox relay pass")?;
        done.deleted += applied.len();
        tracing::info!(rows = applied.len(), "outbox rows relayed to redis");
    }
}

/// Sends the queued repairs; returns false if a shortfall of acknowledgements could not be put
/// on a master, and adds the masters whose replicas did not acknowledge to `short` (their
/// replicas must leave the epoch's record before the rows go, see `super::conn`).
async fn flush(
    cache: &Cache,
    pipe: &mut redis::Pipeline,
    queued: &mut usize,
    short: &mut Vec<(String, u16)>,
) -> anyhow::Result<bool> {
    if *queued == 0 {
        return Ok(true);
    }
    let acks = cache
        .run_relay(pipe, *queued)
        .await
        .map_err(|CacheUnavailable| anyhow::anyhow!("redis unavailable"))?;
    *pipe = redis::pipe();
    *queued = 0;
    let placed = acks.is_some();
    for master in acks.into_iter().flatten() {
        if !short.contains(&master) {
            short.push(master);
        }
    }
    Ok(placed)
}

/// If Redis answers (and this process's subscription, if it started one, stands again: see
/// [`Cache::subscription_broken`]), verifies its epoch (clearing the prefix if it came back
/// with other data), relays every outbox row and marks Redis usable; returns whether it is
/// usable.
pub async fn recover(cache: &Cache, db: &PgPool) -> bool {
    let failure = try_recover(cache, db).await.err();
    let recovered = failure.is_none();
    cache.recovered(failure);
    recovered
}

/// [`recover`]'s steps; `Err` says why Redis stays out of use ([`Cache::recovery_failure`]).
async fn try_recover(cache: &Cache, db: &PgPool) -> Result<(), String> {
    if !cache.enabled() {
        return Err("the cache is off".into());
    }
    if cache.subscription_broken() {
        return Err("the pub/sub subscription is broken (the process is stopping)".into());
    }
    let downs = cache.downs();
    if !cache.ping().await {
        return Err("redis did not answer PING".into());
    }
    if let Err(e) = epoch::verify(cache, db).await {
        tracing::warn!(error = %e, "redis epoch check failed");
        return Err(format!("epoch check: {e}"));
    }
    if let Err(e) = relay(cache, db, Duration::ZERO).await {
        tracing::warn!(error = %e, "outbox relay failed");
        return Err(format!("outbox relay: {e}"));
    }
    match cache.mark_up(downs) {
        MarkUp::CameBack => {
            // Writers that saw Redis down may have left rows during the first pass.
            if let Err(e) = relay(cache, db, Duration::ZERO).await {
                cache.mark_down(&e);
                return Err(format!("outbox relay after marking up: {e}"));
            }
            tracing::info!("redis available; cache in use");
            cache.check_listpack_setting().await;
            Ok(())
        }
        MarkUp::AlreadyUp => Ok(()),
        // Marked down meanwhile (a hand-off this pass may not have seen): the next tick.
        MarkUp::Stale => Err("marked down again while it ran".into()),
    }
}

/// Runs until `shutdown`: every 500 ms while Redis is marked down, tries to [`recover`]; every
/// second while it is up, verifies the epoch (marking Redis down if it changed, so the next tick
/// fences it) and relays rows older than [`RELAY_AFTER`]. Starts [`super::handoff::listen`]:
/// from then on this process uses Redis only while it holds its hand-off lease.
pub async fn monitor(cache: Cache, db: PgPool, mut shutdown: watch::Receiver<bool>) {
    if !cache.enabled() {
        return;
    }
    tokio::spawn(super::handoff::listen(
        cache.clone(),
        db.clone(),
        shutdown.clone(),
    ));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        n += 1;
        if !cache.marked_up() {
            recover(&cache, &db).await;
            continue;
        }
        if !n.is_multiple_of(2) {
            continue;
        }
        // Redis that can not be verified is not used: the next tick's recovery verifies it.
        match epoch::is_trusted(&cache, &db).await {
            Ok(true) => {}
            Ok(false) => {
                cache.mark_down(&"redis epoch changed (restart, failover or flush)");
                continue;
            }
            Err(e) => {
                cache.mark_down(&format!("redis epoch check failed: {e:#}"));
                continue;
            }
        }
        if let Err(e) = relay(&cache, &db, RELAY_AFTER).await {
            tracing::warn!(error = %e, "outbox relay failed");
        }
    }
}

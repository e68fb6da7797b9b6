//! Reads from a Postgres streaming replica (`DATABASE_REPLICA_URL`).
//!
//! Only reads that are never cached go there (followers and followings pages, comment pages):
//! a cache fill from a lagging replica would store stale data, and a tweet missing on the
//! replica must never be tombstoned, so fills, token checks, writes and everything the worker
//! does stay on the primary. A read goes to the replica only when both hold:
//! - the replica is **fresh**: every 500 ms [`monitor`] compares the replica's replay position
//!   with the primary's WAL position of the previous tick; a replica that has not replayed
//!   what the primary had written half a second to a second ago (paused, cut off, overloaded)
//!   is not used until it has;
//! - the caller has **not written** in the last [`READ_YOUR_WRITES`], through any process
//!   (a user reads their own writes, also from a second device, after a re-login, or when the
//!   load balancer sends them elsewhere): each write marks its user in this process's memory
//!   and in Redis (`{p}:{u42}:wrote`, [`crate::cache::writers`]), and a read checks both. If
//!   Redis does not answer, the read stays on the primary; with the cache off
//!   (`CHIRP_CACHE=off`) only this process's memory is asked, so route each user to one
//!   process then (HAProxy `balance hdr(Authorization)`).
//!
//! Together: a write acknowledged more than [`READ_YOUR_WRITES`] ago was in the primary's WAL
//! before the position a fresh replica has replayed, so the replica shows it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::watch;

use crate::cache::Cache;
use crate::config::Config;

/// How long a user's reads stay on the primary after they wrote.
pub const READ_YOUR_WRITES: Duration = Duration::from_secs(5);
/// How often the replica's replay position is compared with the primary's.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// Writers remembered at most (older ones are dropped first; a dropped writer only loses
/// stickiness after [`READ_YOUR_WRITES`] anyway).
const WRITERS: usize = 100_000;

/// The replica pool (if configured), its freshness and this process's recent writers.
#[derive(Default)]
pub struct Replica {
    pool: Option<PgPool>,
    /// Where every process marks its writers (`None`, or a disabled cache: memory only).
    cache: Option<Cache>,
    fresh: AtomicBool,
    writers: Mutex<HashMap<i64, Instant>>,
    /// Reads sent to the replica, and reads kept on the primary although a replica is set.
    pub reads: AtomicU64,
    pub kept_on_primary: AtomicU64,
}

impl Replica {
    /// The replica of `DATABASE_REPLICA_URL` (none if unset). Connects lazily: chirp starts
    /// while the replica is down, and reads stay on the primary until the monitor finds it
    /// fresh.
    ///
    /// # Errors
    /// A malformed URL.
    pub fn new(config: &Config, cache: &Cache) -> anyhow::Result<Self> {
        let pool = match &config.database_replica_url {
            Some(url) => Some(
                crate::db::pool_options(config.db_pool_size())
                    .acquire_timeout(Duration::from_secs(2))
                    .connect_lazy(url)
                    .map_err(|e| anyhow::anyhow!("invalid DATABASE_REPLICA_URL: {e}"))?,
            ),
            None => None,
        };
        Ok(Replica {
            pool,
            cache: cache.enabled().then(|| cache.clone()),
            ..Replica::default()
        })
    }

    /// Whether a replica is configured.
    pub fn configured(&self) -> bool {
        self.pool.is_some()
    }

    /// Whether the replica is fresh now (see the module docs).
    pub fn fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    /// The pool for a never-cached read by `caller`: the replica if it is fresh and the caller
    /// did not write recently (in this process's memory, then in Redis: one round trip, and
    /// the primary if Redis does not answer), else `primary`.
    pub async fn for_read<'a>(&'a self, primary: &'a PgPool, caller: Option<i64>) -> &'a PgPool {
        let Some(pool) = &self.pool else {
            return primary;
        };
        let mut wrote_recently = caller.is_some_and(|user| {
            self.lock()
                .get(&user)
                .is_some_and(|at| at.elapsed() < READ_YOUR_WRITES)
        });
        if let (Some(user), Some(cache), false, true) =
            (caller, &self.cache, wrote_recently, self.fresh())
        {
            wrote_recently = cache.wrote_recently(user).await.unwrap_or(true);
        }
        if self.fresh() && !wrote_recently {
            self.reads.fetch_add(1, Ordering::Relaxed);
            pool
        } else {
            self.kept_on_primary.fetch_add(1, Ordering::Relaxed);
            primary
        }
    }

    /// Runs a never-cached read `read(pool)` on the pool [`Replica::for_read`] picks; if the
    /// replica fails it (a recovery conflict, the replica gone since the last check), marks it
    /// stale until the monitor finds it fresh again and runs the read on the primary.
    ///
    /// # Errors
    /// What the read returns (on the primary).
    pub async fn read_with<T, F, Fut>(
        &self,
        primary: &PgPool,
        caller: Option<i64>,
        read: F,
    ) -> crate::error::ApiResult<T>
    where
        F: Fn(PgPool) -> Fut,
        Fut: Future<Output = crate::error::ApiResult<T>>,
    {
        let pool = self.for_read(primary, caller).await;
        if std::ptr::eq(pool, primary) {
            return read(primary.clone()).await;
        }
        match read(pool.clone()).await {
            Err(crate::error::ApiError::Internal(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "a replica read failed; reading the primary");
                self.fresh.store(false, Ordering::Release);
                self.kept_on_primary.fetch_add(1, Ordering::Relaxed);
                read(primary.clone()).await
            }
            other => other,
        }
    }

    /// Marks the replica fresh or not (a test hook; the monitor does it in production).
    #[doc(hidden)]
    pub fn set_fresh(&self, fresh: bool) {
        self.fresh.store(fresh, Ordering::Release);
    }

    /// Records that `user` is writing (called before every authenticated non-GET request),
    /// in this process's memory: its reads here stay on the primary meanwhile. Costs nothing
    /// without a replica.
    pub fn writing(&self, user: i64) {
        if self.pool.is_none() {
            return;
        }
        let mut writers = self.lock();
        if writers.len() >= WRITERS {
            writers.retain(|_, at| at.elapsed() < READ_YOUR_WRITES);
        }
        writers.insert(user, Instant::now());
    }

    /// Records that `user` wrote (called once the request's handler returned), here and, for
    /// the other processes, in Redis (one round trip): every read that follows the answer
    /// stays on the primary for [`READ_YOUR_WRITES`]. Costs nothing without a replica.
    pub async fn wrote(&self, user: i64) {
        if self.pool.is_none() {
            return;
        }
        self.writing(user);
        if let Some(cache) = &self.cache
            && cache.mark_writer(user, READ_YOUR_WRITES).await.is_err()
        {
            tracing::debug!(
                user,
                "could not mark a writer in Redis; other processes keep reading the replica"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Instant>> {
        self.writers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A WAL position (`16/B374D848`) as a number.
fn lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

async fn position(pool: &PgPool, sql: &'static str) -> Option<u64> {
    let text: Option<String> =
        tokio::time::timeout(CHECK_EVERY, sqlx::query_scalar(sql).fetch_one(pool))
            .await
            .ok()?
            .ok()?;
    lsn(&text?)
}

/// Runs until `shutdown`: every [`CHECK_EVERY`], the replica is fresh iff it has replayed
/// the primary's WAL position of the previous tick.
pub async fn monitor(
    replica: std::sync::Arc<Replica>,
    primary: PgPool,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(pool) = replica.pool.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(CHECK_EVERY);
    let mut previous: Option<u64> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = position(&primary, "select pg_current_wal_lsn()::text").await;
        let replayed = position(&pool, "select pg_last_wal_replay_lsn()::text").await;
        let fresh = matches!((previous, replayed), (Some(p), Some(r)) if r >= p);
        if replica.fresh.swap(fresh, Ordering::AcqRel) != fresh {
            if fresh {
                tracing::info!("postgres replica caught up; never-cached reads use it");
            } else {
                tracing::warn!(
                    "postgres replica lags or is unreachable; reads stay on the primary"
                );
            }
        }
        previous = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_positions_compare_as_numbers() {
        assert_eq!(lsn("0/16B3748"), Some(0x16B_3748));
        assert!(lsn("1/0").unwrap() > lsn("0/FFFFFFFF").unwrap());
        assert_eq!(lsn("x"), None);
    }
}

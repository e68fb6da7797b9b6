//! The cache-aside layer's Redis mechanics: typed keys, Lua scripts and primitives for lists,
//! objects and counters, the transactional outbox and the epoch fence. A leaf: it imports no
//! feature module; the features (e.g. [`crate::timeline`]) own their cache-aside logic.
//!
//! Postgres is the source of truth; Redis only makes reads fast. The rules:
//! - **Reads** use [`Cache::range`], [`Cache::fill`] and the object getters; any Redis error or
//!   timeout is [`CacheUnavailable`] and the caller falls back to Postgres.
//! - **Writes** describe their cache effects as [`Update`]s. [`Cache::stage`] records their
//!   repairs in the `cache_outbox` table *inside the write's transaction*; after the commit
//!   [`Cache::finish`] applies them and deletes the row. Whatever is left (a crash, a timeout, Redis down) the [`outbox`] relay
//!   repairs: lists invalidated, tombstones written, versioned values set.
//! - **Races** between a load and a write are settled by per-list generations (see [`scripts`]).
//! - **Stale Redis** (restarted from a snapshot, failed over to a lagging replica, flushed) is
//!   fenced by the [`epoch`]: a mismatch clears every key under the prefix before Redis is used.

pub mod backlog;
pub mod counts;
pub mod epoch;
pub mod keys;
pub mod limits;
pub mod lists;
pub mod objects;
pub mod outbox;
pub mod pubsub;
pub mod rank;
pub mod scripts;
pub mod streams;
pub mod tokens;
pub mod update;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, Pipeline, ServerErrorKind};

use crate::config::{CacheMode, Config};
pub use keys::{Keys, ListKey, Owner};
pub use lists::{Generation, Scored, Window};
pub use update::{Guard, Repair, Staged, Update};

/// Redis could not be used for this operation (down, timed out, disabled, or marked down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("cache unavailable")]
pub struct CacheUnavailable;

/// Counters of the cache's work since start, for tests, `/healthz` and benchmarks.
#[derive(Debug, Default)]
pub struct Stats {
    /// List reads answered (at least partly) by a cached list.
    pub hits: AtomicU64,
    /// List reads that found no cached list.
    pub misses: AtomicU64,
    /// Lists loaded from Postgres to fill the cache.
    pub loads: AtomicU64,
    /// Pages (or page tails) read from Postgres because they lie past the cached window.
    pub fallbacks: AtomicU64,
    /// Redis operations that failed.
    pub errors: AtomicU64,
    /// Times the epoch fence cleared the prefix (Redis came back with other data).
    pub fences: AtomicU64,
    /// Times Redis came back into use after being marked down.
    pub recoveries: AtomicU64,
}

/// What the post-commit step does: a test hook to simulate a crash between a Postgres commit and
/// its cache update, or a client that goes away meanwhile.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub enum AfterCommit {
    /// Apply the staged updates (production).
    #[default]
    Apply,
    /// Skip them, as a process killed right after the commit would.
    Crash,
    /// Wait for this lock before applying (the test holds it to force an interleaving).
    Gate(Arc<tokio::sync::Mutex<()>>),
}

struct Inner {
    conn: ConnectionManager,
    /// For dedicated connections (pub/sub subscribers).
    client: redis::Client,
    keys: Keys,
    ttl_secs: u64,
    list_limit: usize,
    timeout: Duration,
    healthy: AtomicBool,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    stats: Stats,
    after_commit: Mutex<AfterCommit>,
}

/// Handle to the Redis cache; cheap to clone. With `CHIRP_CACHE=off` it is disabled and every
/// operation reports [`CacheUnavailable`] without contacting Redis.
#[derive(Clone)]
pub struct Cache {
    inner: Option<Arc<Inner>>,
}

impl Cache {
    /// A cache that never contacts Redis.
    pub fn disabled() -> Self {
        Cache { inner: None }
    }

    /// A cache over `config.redis_url`. Does not connect yet: chirp starts and serves (from
    /// Postgres) while Redis is down.
    ///
    /// # Errors
    /// A malformed `REDIS_URL` or `CHIRP_REDIS_PREFIX`.
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        if config.cache == CacheMode::Off {
            return Ok(Self::disabled());
        }
        let keys = Keys::new(&config.redis_prefix)?;
        let client = redis::Client::open(config.redis_url.as_str())
            .map_err(|e| anyhow::anyhow!("invalid REDIS_URL: {e}"))?;
        let timeout = Duration::from_millis(config.redis_timeout_ms.max(1));
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)?;
        Ok(Cache {
            inner: Some(Arc::new(Inner {
                conn,
                client,
                keys,
                ttl_secs: config.cache_ttl_secs,
                list_limit: config.cache_list_limit as usize,
                timeout,
                // Assume down until the first successful check (see `outbox::recover`), so that
                // the epoch is verified and an outbox left by an earlier outage is relayed before
                // the first cached read.
                healthy: AtomicBool::new(false),
                flights: Mutex::new(HashMap::new()),
                stats: Stats::default(),
                after_commit: Mutex::new(AfterCommit::Apply),
            })),
        })
    }

    /// Whether `CHIRP_CACHE` is on.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether reads may use Redis now (enabled and not marked down).
    pub fn available(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.healthy.load(Ordering::Acquire))
    }

    /// The key builder (`None` when disabled).
    pub fn keys(&self) -> Option<&Keys> {
        self.inner.as_ref().map(|i| &i.keys)
    }

    /// Length cap of cached lists (`CHIRP_CACHE_LIST_LIMIT`).
    pub fn list_limit(&self) -> usize {
        self.inner.as_ref().map_or(0, |i| i.list_limit)
    }

    /// TTL of cached lists and objects in seconds (`None` when disabled).
    pub fn ttl(&self) -> Option<u64> {
        self.inner.as_ref().map(|i| i.ttl_secs)
    }

    /// Work counters (`None` when disabled).
    pub fn stats(&self) -> Option<&Stats> {
        self.inner.as_ref().map(|i| &i.stats)
    }

    /// Sets what the post-commit step does (a test hook; see [`AfterCommit`]).
    #[doc(hidden)]
    pub fn set_after_commit(&self, mode: AfterCommit) {
        if let Some(inner) = &self.inner {
            *inner.after_commit.lock().unwrap_or_else(|p| p.into_inner()) = mode;
        }
    }

    fn after_commit(&self) -> AfterCommit {
        self.inner.as_ref().map_or(AfterCommit::Apply, |i| {
            i.after_commit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// Marks Redis usable; returns whether it was marked down before.
    pub(crate) fn mark_up(&self) -> bool {
        let came_back = self
            .inner
            .as_ref()
            .is_some_and(|i| !i.healthy.swap(true, Ordering::AcqRel));
        if let (true, Some(stats)) = (came_back, self.stats()) {
            stats.recoveries.fetch_add(1, Ordering::AcqRel);
        }
        came_back
    }

    fn live(&self) -> Result<&Arc<Inner>, CacheUnavailable> {
        match &self.inner {
            Some(i) if i.healthy.load(Ordering::Acquire) => Ok(i),
            _ => Err(CacheUnavailable),
        }
    }

    /// Marks Redis unusable until [`outbox::recover`] succeeds.
    pub(crate) fn mark_down(&self, err: &dyn std::fmt::Display) {
        let Some(inner) = &self.inner else { return };
        inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        if inner.healthy.swap(false, Ordering::AcqRel) {
            tracing::warn!(error = %err, "redis unavailable; serving from postgres until it answers");
        }
    }

    /// Runs a pipeline with the short Redis timeout. A script missing from Redis's script cache
    /// is loaded and the pipeline retried once. Any other failure marks Redis down.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, CacheUnavailable> {
        let inner = self.live()?;
        self.run_on(inner, pipe, inner.timeout, true).await
    }

    /// [`Cache::run`] for writes sized by their work: the timeout grows by 50 µs per item on
    /// top of the base timeout, and a timeout does not mark Redis down (one slow bulk write says
    /// little about the next small read; its outbox row repairs what it did not do).
    pub(crate) async fn run_bulk<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        items: usize,
    ) -> Result<T, CacheUnavailable> {
        let inner = self.live()?;
        self.run_on(inner, pipe, inner.timeout + per_item(items), false)
            .await
    }

    /// [`Cache::run`] even while Redis is marked down (for the outbox relay and recovery), with a
    /// timeout of five base timeouts plus 50 µs per item. Does not mark Redis down: the caller
    /// decides.
    pub(crate) async fn run_unchecked<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        items: usize,
    ) -> Result<T, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        query(inner, pipe, inner.timeout * 5 + per_item(items))
            .await
            .map_err(|_| CacheUnavailable)
    }

    async fn run_on<T: FromRedisValue>(
        &self,
        inner: &Inner,
        pipe: &Pipeline,
        timeout: Duration,
        timeout_marks_down: bool,
    ) -> Result<T, CacheUnavailable> {
        match query(inner, pipe, timeout).await {
            Ok(v) => Ok(v),
            Err(Some(e)) => {
                self.mark_down(&e);
                Err(CacheUnavailable)
            }
            Err(None) if timeout_marks_down => {
                self.mark_down(&"timed out");
                Err(CacheUnavailable)
            }
            Err(None) => {
                inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    ?timeout,
                    "bulk redis write timed out; the outbox relay repairs it"
                );
                Err(CacheUnavailable)
            }
        }
    }

    /// `PING` with the short timeout, regardless of the health flag (for `/healthz` and the
    /// monitor). Always false when disabled.
    pub async fn ping(&self) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        let mut conn = inner.conn.clone();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut conn);
        matches!(tokio::time::timeout(inner.timeout, ping).await, Ok(Ok(_)))
    }

    /// Deletes every key under the prefix (after a bulk import, whose writes bypass the cache,
    /// and when the [`epoch`] fence trips). Works while Redis is marked down; returns how many
    /// keys were deleted.
    pub async fn clear(&self) -> Result<usize, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        let pattern = format!("{}:*", inner.keys.prefix());
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let mut scan = redis::pipe();
            scan.cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let ((next, keys),): ((u64, Vec<String>),) = self.run_unchecked(&scan, 1).await?;
            if !keys.is_empty() {
                let mut del = redis::pipe();
                del.cmd("UNLINK").arg(&keys).ignore();
                self.run_unchecked::<()>(&del, keys.len()).await?;
                deleted += keys.len();
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// The single-flight lock of one list: concurrent misses of the same list wait for the first
    /// loader instead of each querying Postgres (cache stampede protection, per process).
    pub fn flight(&self, list: ListKey) -> Option<FlightGuard> {
        let inner = self.inner.as_ref()?;
        let key = inner.keys.list(list);
        let lock = {
            let mut flights = inner.flights.lock().unwrap_or_else(|p| p.into_inner());
            flights.entry(key.clone()).or_default().clone()
        };
        Some(FlightGuard {
            inner: inner.clone(),
            key,
            lock,
        })
    }
}

/// The extra time a bulk pipeline gets: 50 µs per item.
fn per_item(items: usize) -> Duration {
    Duration::from_micros(50).saturating_mul(u32::try_from(items).unwrap_or(u32::MAX))
}

/// Runs a pipeline within `timeout`; a script missing from Redis's script cache (restart,
/// `SCRIPT FLUSH`) is loaded and the pipeline retried once. `Err(None)`: timed out.
async fn query<T: FromRedisValue>(
    inner: &Inner,
    pipe: &Pipeline,
    timeout: Duration,
) -> Result<T, Option<redis::RedisError>> {
    let mut conn = inner.conn.clone();
    match query_once(&mut conn, pipe, timeout).await {
        Err(Some(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            for script in scripts::all() {
                script.load_async(&mut conn).await.map_err(Some)?;
            }
            query_once(&mut conn, pipe, timeout).await
        }
        other => other,
    }
}

async fn query_once<T: FromRedisValue>(
    conn: &mut ConnectionManager,
    pipe: &Pipeline,
    timeout: Duration,
) -> Result<T, Option<redis::RedisError>> {
    match tokio::time::timeout(timeout, pipe.query_async::<T>(conn)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}

/// Holds the single-flight lock of one list; see [`Cache::flight`].
pub struct FlightGuard {
    inner: Arc<Inner>,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl FlightGuard {
    /// Waits for the lock; the returned guard releases it when dropped.
    pub async fn acquire(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        let mut flights = self.inner.flights.lock().unwrap_or_else(|p| p.into_inner());
        // The map and this guard hold the last two references: nobody else waits for the key.
        if Arc::strong_count(&self.lock) <= 2 {
            flights.remove(&self.key);
        }
    }
}

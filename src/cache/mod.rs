//! The cache-aside layer: everything chirp keeps in Redis, and how it stays correct.
//!
//! Postgres is the source of truth; Redis only makes reads fast. The rules:
//! - **Reads** ([`timeline`]) try Redis first. A missing list is loaded from Postgres once (one
//!   load per key per process even under a stampede) and stored atomically; pages past the cached
//!   window continue in Postgres with the same cursor. Any Redis error or timeout falls back to
//!   Postgres for that request.
//! - **Writes** commit to Postgres first, then apply [`Update`]s to Redis: merge new entries into
//!   lists that are cached (never creating a partial list), remove entries, invalidate. If Redis
//!   can not be reached, the updates become rows of a durable invalidation [`outbox`] that is
//!   replayed before Redis is used again, so no cached list silently misses a committed write.
//! - **Races** between a load and a write are settled by a per-list generation counter: a load
//!   stores its result only if no write happened since it started, and a merge that was planned
//!   under an older generation invalidates the list instead of applying (see [`scripts`]).

pub mod counts;
pub mod keys;
pub mod objects;
pub mod outbox;
pub mod scripts;
pub mod timeline;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, Pipeline, ServerErrorKind};
use sqlx::PgPool;

use crate::config::{CacheMode, Config};
pub use keys::{Keys, ListKey};

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
}

/// How a merge is guarded against races (see [`scripts::MERGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Apply whatever happened meanwhile (entries nobody else can remove concurrently).
    Any,
    /// Apply only if the list's generation is still this value (read before the Postgres
    /// transaction); otherwise invalidate the list.
    Gen(String),
}

/// A list entry to merge: `(score = created_at in µs, member)`.
pub type Scored = (i64, String);

/// One change to apply to Redis after a Postgres commit.
#[derive(Debug, Clone)]
pub enum Update {
    /// Merge entries into a list if it is cached.
    Merge(ListKey, Expect, Vec<Scored>),
    /// Remove members from a list.
    Remove(ListKey, Vec<String>),
    /// Drop a list.
    Invalidate(ListKey),
    /// Cache a new tweet object (unless a tombstone is there already).
    TweetCreated(crate::tweets::TweetRecord),
    /// Replace a tweet object by its tombstone.
    TweetDeleted(i64),
    /// Drop a user object (its profile changed).
    UserChanged(i64),
    /// Write through counts committed with this version (see [`counts`]).
    Counts(counts::CountsOf, counts::Counts),
    /// Drop the counts of a deleted object.
    DropCounts(counts::CountsOf),
    /// A bearer token was revoked (by its hash): tombstone it.
    TokenRevoked(Vec<u8>),
    /// `user` liked (`true`) or stopped liking a tweet: update the user's liked set if cached.
    Liked(i64, i64, bool),
}

struct Inner {
    conn: ConnectionManager,
    keys: Keys,
    ttl_secs: u64,
    list_limit: usize,
    timeout: Duration,
    healthy: AtomicBool,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    stats: Stats,
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
    /// Postgres) while Redis is down. Errors only on a malformed URL.
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        if config.cache == CacheMode::Off {
            return Ok(Self::disabled());
        }
        let client = redis::Client::open(config.redis_url.as_str())
            .map_err(|e| anyhow::anyhow!("invalid REDIS_URL: {e}"))?;
        let timeout = Duration::from_millis(config.redis_timeout_ms.max(1));
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config)?;
        Ok(Cache {
            inner: Some(Arc::new(Inner {
                conn,
                keys: Keys::new(&config.redis_prefix),
                ttl_secs: config.cache_ttl_secs,
                list_limit: config.cache_list_limit as usize,
                timeout,
                // Assume down until the first successful ping (see `outbox::monitor`), so that an
                // outbox left by an earlier outage is replayed before the first cached read.
                healthy: AtomicBool::new(false),
                flights: Mutex::new(HashMap::new()),
                stats: Stats::default(),
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

    fn live(&self) -> Result<&Arc<Inner>, CacheUnavailable> {
        match &self.inner {
            Some(i) if i.healthy.load(Ordering::Acquire) => Ok(i),
            _ => Err(CacheUnavailable),
        }
    }

    fn mark_down(&self, inner: &Inner, err: &dyn std::fmt::Display) {
        inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        if inner.healthy.swap(false, Ordering::AcqRel) {
            tracing::warn!(error = %err, "redis unavailable; serving from postgres until it answers");
        }
    }

    /// Runs a pipeline with the short Redis timeout. A script missing from Redis's script cache
    /// is loaded and the pipeline retried once. Any other failure marks Redis down.
    async fn run<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, CacheUnavailable> {
        let inner = self.live()?;
        self.run_on(inner, pipe).await
    }

    /// [`Cache::run`] even while Redis is marked down (for the outbox replay and recovery).
    async fn run_unchecked<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        self.run_on(inner, pipe).await
    }

    async fn run_on<T: FromRedisValue>(
        &self,
        inner: &Inner,
        pipe: &Pipeline,
    ) -> Result<T, CacheUnavailable> {
        let mut conn = inner.conn.clone();
        let mut result = self.run_once(inner, &mut conn, pipe).await;
        if let Err(Some(e)) = &result
            && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        {
            for script in scripts::all() {
                if let Err(e) = script.load_async(&mut conn).await {
                    self.mark_down(inner, &e);
                    return Err(CacheUnavailable);
                }
            }
            result = self.run_once(inner, &mut conn, pipe).await;
        }
        match result {
            Ok(v) => Ok(v),
            Err(Some(e)) => {
                self.mark_down(inner, &e);
                Err(CacheUnavailable)
            }
            Err(None) => {
                self.mark_down(inner, &"timed out");
                Err(CacheUnavailable)
            }
        }
    }

    async fn run_once<T: FromRedisValue>(
        &self,
        inner: &Inner,
        conn: &mut ConnectionManager,
        pipe: &Pipeline,
    ) -> Result<T, Option<redis::RedisError>> {
        match tokio::time::timeout(inner.timeout, pipe.query_async::<T>(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Some(e)),
            Err(_) => Err(None),
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

    /// Deletes every key under the prefix (after a bulk import, whose writes bypass the cache).
    /// Works while Redis is marked down; returns how many keys were deleted.
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
            let ((next, keys),): ((u64, Vec<String>),) = self.run_unchecked(&scan).await?;
            if !keys.is_empty() {
                let mut del = redis::pipe();
                del.cmd("UNLINK").arg(&keys).ignore();
                self.run_unchecked::<()>(&del).await?;
                deleted += keys.len();
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    // ----- lists -------------------------------------------------------------------------

    /// Reads the newest `count` entries strictly between `gt` and `lt` (µs) of a cached list.
    /// `Ok(None)`: the list is not cached.
    pub async fn range(
        &self,
        list: ListKey,
        lt: Option<i64>,
        gt: Option<i64>,
        count: usize,
    ) -> Result<Option<Window>, CacheUnavailable> {
        let key = self.live()?.keys.list(list);
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            scripts::RANGE
                .key(&key)
                .arg(lt.map_or("+inf".to_owned(), |v| v.to_string()))
                .arg(gt.map_or("-inf".to_owned(), |v| v.to_string()))
                .arg(count),
        );
        let (raw,): (Option<Vec<String>>,) = self.run(&pipe).await?;
        Ok(raw.and_then(Window::parse))
    }

    /// Current generations of lists (`None` entries: never written), read before a Postgres
    /// transaction whose result will be merged with [`Expect::Gen`].
    pub async fn generations(
        &self,
        lists: &[ListKey],
    ) -> Result<Vec<Option<String>>, CacheUnavailable> {
        let inner = self.live()?;
        if lists.is_empty() {
            return Ok(Vec::new());
        }
        let gens: Vec<String> = lists
            .iter()
            .map(|l| Keys::gen_of(&inner.keys.list(*l)))
            .collect();
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(&gens);
        let (values,): (Vec<Option<String>>,) = self.run(&pipe).await?;
        Ok(values)
    }

    /// Stores a list loaded from Postgres (newest first, at most the limit) unless it is cached
    /// already or was written since `generation` was read. `complete`: nothing older exists.
    pub async fn fill(
        &self,
        list: ListKey,
        generation: Option<&str>,
        complete: bool,
        entries: &[Scored],
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut inv = scripts::FILL.key(&key);
        inv.key(Keys::gen_of(&key))
            .arg(generation.unwrap_or(""))
            .arg(inner.ttl_secs)
            .arg(if complete { "1" } else { "0" });
        for (score, member) in entries {
            inv.arg(*score).arg(member);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let (stored,): (i64,) = self.run(&pipe).await?;
        inner.stats.loads.fetch_add(1, Ordering::Relaxed);
        Ok(stored == 1)
    }

    /// The single-flight lock of one list: concurrent misses of the same list wait for the first
    /// loader instead of each querying Postgres (cache stampede protection, per process).
    pub(crate) fn flight(&self, list: ListKey) -> Option<FlightGuard> {
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

    // ----- writes ------------------------------------------------------------------------

    /// Applies updates after a Postgres commit, in one pipeline. If Redis is unavailable, every
    /// affected key is written to the outbox instead (see [`outbox`]), to be invalidated as
    /// soon as Redis answers. Never fails: a cache problem must not fail a committed write.
    pub async fn apply(&self, db: &PgPool, updates: Vec<Update>) {
        let Some(inner) = &self.inner else { return };
        if updates.is_empty() {
            return;
        }
        let ttl = inner.ttl_secs;
        let limit = inner.list_limit;
        let mut pipe = redis::pipe();
        for update in &updates {
            match update {
                Update::Merge(list, expect, entries) => {
                    let key = inner.keys.list(*list);
                    let mut inv = scripts::MERGE.key(&key);
                    inv.key(Keys::gen_of(&key));
                    match expect {
                        Expect::Any => inv.arg("*"),
                        Expect::Gen(g) => inv.arg(g.as_str()),
                    };
                    inv.arg(ttl).arg(limit);
                    for (score, member) in entries {
                        inv.arg(*score).arg(member);
                    }
                    pipe.invoke_script(&inv).ignore();
                }
                Update::Remove(list, members) => {
                    let key = inner.keys.list(*list);
                    let mut inv = scripts::REMOVE.key(&key);
                    inv.key(Keys::gen_of(&key)).arg(ttl);
                    for m in members {
                        inv.arg(m);
                    }
                    pipe.invoke_script(&inv).ignore();
                }
                Update::Invalidate(list) => {
                    let key = inner.keys.list(*list);
                    let mut inv = scripts::INVALIDATE.key(&key);
                    inv.key(Keys::gen_of(&key)).arg(ttl);
                    pipe.invoke_script(&inv).ignore();
                }
                Update::TweetCreated(tweet) => {
                    let Ok(json) = serde_json::to_string(tweet) else {
                        continue;
                    };
                    pipe.cmd("SET")
                        .arg(inner.keys.tweet(tweet.id))
                        .arg(json)
                        .arg("NX")
                        .arg("EX")
                        .arg(ttl)
                        .ignore();
                }
                Update::TweetDeleted(id) => {
                    pipe.cmd("SET")
                        .arg(inner.keys.tweet(*id))
                        .arg(objects::TOMBSTONE)
                        .arg("EX")
                        .arg(ttl)
                        .ignore();
                }
                Update::UserChanged(id) => {
                    pipe.cmd("DEL").arg(inner.keys.user(*id)).ignore();
                }
                Update::Counts(of, counts) => self.pipe_put_counts(&mut pipe, *of, counts),
                Update::DropCounts(of) => {
                    pipe.cmd("DEL").arg(self.counts_key(*of)).ignore();
                }
                Update::TokenRevoked(hash) => {
                    let key = inner.keys.token(hash);
                    pipe.cmd("SET")
                        .arg(key)
                        .arg(objects::TOMBSTONE)
                        .arg("EX")
                        .arg(ttl)
                        .ignore();
                }
                Update::Liked(user, tweet, liked) => {
                    let key = inner.keys.liked(*user);
                    let mut inv = scripts::SET_CHANGE.key(&key);
                    inv.key(Keys::gen_of(&key))
                        .arg(if *liked { "add" } else { "rem" })
                        .arg(ttl)
                        .arg(*tweet);
                    pipe.invoke_script(&inv).ignore();
                }
            }
        }
        if self.run::<()>(&pipe).await.is_err() {
            let keys: Vec<(String, bool)> = updates
                .iter()
                .map(|u| match u {
                    Update::Merge(l, ..) | Update::Remove(l, _) | Update::Invalidate(l) => {
                        (inner.keys.list(*l), true)
                    }
                    Update::TweetCreated(t) => (inner.keys.tweet(t.id), false),
                    Update::TweetDeleted(id) => (inner.keys.tweet(*id), false),
                    Update::UserChanged(id) => (inner.keys.user(*id), false),
                    Update::Counts(of, _) | Update::DropCounts(of) => {
                        (self.counts_key(*of).unwrap_or_default(), false)
                    }
                    Update::TokenRevoked(hash) => (inner.keys.token(hash), false),
                    Update::Liked(user, ..) => (inner.keys.liked(*user), true),
                })
                .collect();
            outbox::record(db, &keys).await;
        }
    }
}

/// Holds the single-flight lock of one list; see [`Cache::flight`].
pub(crate) struct FlightGuard {
    inner: Arc<Inner>,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl FlightGuard {
    /// Waits for the lock; the returned guard releases it when dropped.
    pub(crate) async fn acquire(&self) -> tokio::sync::MutexGuard<'_, ()> {
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

/// What a cached list says about a range: see [`Cache::range`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// The list holds every item, not only the newest window.
    pub complete: bool,
    /// The lowest score (µs) an incomplete list holds: it has every item at or above it.
    pub floor: Option<i64>,
    /// `(member, score)` newest first, strictly inside the requested bounds.
    pub items: Vec<(String, i64)>,
}

impl Window {
    fn parse(raw: Vec<String>) -> Option<Self> {
        let mut it = raw.into_iter();
        let complete = it.next()? == "1";
        let floor = it.next().and_then(|f| parse_score(&f));
        let mut items = Vec::new();
        while let (Some(member), Some(score)) = (it.next(), it.next()) {
            items.push((member, parse_score(&score)?));
        }
        Some(Window {
            complete,
            floor,
            items,
        })
    }
}

fn parse_score(s: &str) -> Option<i64> {
    // Scores are µs timestamps, exact in a double (< 2^53).
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| f as i64)
}

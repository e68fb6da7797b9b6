//! The cache-aside layer's Redis mechanics: typed keys, Lua scripts and primitives for lists,
//! objects and counters, the transactional outbox and the epoch fence. A leaf: it imports no
//! feature module; the features (e.g. [`crate::timeline`]) own their cache-aside logic.
//!
//! Postgres is the source of truth; Redis only makes reads fast. The rules:
//! - **Reads** use [`Cache::range`], [`Cache::fill`] and the object getters; any Redis error or
//!   timeout is [`CacheUnavailable`] and the caller falls back to Postgres.
//! - **Writes** describe their cache effects as [`Update`]s. [`Cache::stage`] records their
//!   repairs in the `cache_outbox` table *inside the write's transaction*; after the commit
//!   [`Cache::finish`] applies them and hands the row to the process's deleter
//!   ([`outbox::Forgets`]: one delete per burst of writes, off the answer's path). Whatever
//!   is left (a crash, a timeout, Redis down) the [`outbox`] relay repairs: lists
//!   invalidated, tombstones written, versioned values set.
//! - **Races** between a load and a write are settled by per-list generations (see [`scripts`]).
//! - **Stale Redis** (restarted from a snapshot, failed over to a lagging replica, flushed) is
//!   fenced by the [`epoch`]: a mismatch clears every key under the prefix before Redis is used.

pub mod backlog;
pub mod conn;
pub mod counts;
pub mod deferred;
pub mod entries;
pub mod epoch;
pub mod handoff;
pub mod held;
pub mod hidden;
pub mod hydration;
pub mod keys;
pub mod lease;
pub mod liked;
pub mod limits;
pub mod lists;
pub mod near;
pub mod objects;
pub mod outbox;
pub mod pages;
pub mod piggyback;
pub mod pubsub;
pub mod rank;
pub mod scripts;
pub mod streams;
pub mod threads;
pub mod tokens;
mod transport;
pub mod trends;
pub mod update;
pub mod writers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Pipeline};

use crate::config::{CacheMode, Config};
pub use conn::{Conn, Session, Wait};
pub use keys::{Keys, ListKey, Owner};
pub use lists::{BegunLoad, Generation, PageGuess, Range, Scored, Window};
pub(crate) use transport::Scan;
use transport::{RESPONSE_TIMEOUTS, per_item, query, query_noting_acks, session};
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
    /// Cached lists grown downwards after their page-sized first fill (see
    /// [`crate::timeline`]'s miss path).
    pub extensions: AtomicU64,
    /// Pages (or page tails) read from Postgres because they lie past the cached window.
    pub fallbacks: AtomicU64,
    /// Redis operations that failed.
    pub errors: AtomicU64,
    /// Times the epoch fence cleared the prefix (Redis came back with other data).
    pub fences: AtomicU64,
    /// Times Redis came back into use after being marked down.
    pub recoveries: AtomicU64,
    /// Times this process's epoch check found a new epoch in Redis (another process fenced):
    /// the near caches forget what they held (their values may come from before the fence).
    pub epoch_changes: AtomicU64,
    /// Durable writes that stood on a cluster master without its replicas' acknowledgement and
    /// took those replicas out of the epoch's record ([`epoch::distrust_replicas`]).
    pub replicas_distrusted: AtomicU64,
    /// The epoch this process last found in Redis (0: none yet).
    pub epoch_seen: AtomicI64,
    /// Timeline pages hydrated without a second Redis round trip: every counter they needed came
    /// with the range read, prefetched from this process's page memory ([`pages`]).
    pub prefetched: AtomicU64,
    /// Newsfeed pages of readers of pull sources merged from cached lists
    /// ([`crate::newsfeeds::read`]).
    pub merged: AtomicU64,
    /// Such pages read from Postgres instead: a list lagged behind the snapshot, or held more
    /// entries past it than the page.
    pub merge_fallbacks: AtomicU64,
    /// Tweet and user objects hydration asked of Redis and found there.
    pub object_hits: AtomicU64,
    /// Such objects Redis did not hold (hydration reads them from Postgres).
    pub object_misses: AtomicU64,
    /// Tweet counters hydration asked of Redis and found there.
    pub counter_hits: AtomicU64,
    /// Such counters Redis did not hold.
    pub counter_misses: AtomicU64,
    /// Bearer tokens looked up in Redis and answered there (a user or a revocation).
    pub token_hits: AtomicU64,
    /// Such lookups Redis could not answer (Postgres is asked).
    pub token_misses: AtomicU64,
    /// Objects (tweets, counters, authors) of cold fills not sent to Redis: this process held
    /// them at the fill's version or a newer one ([`Cache::fill_hydrated`], decision 0039).
    pub fill_objects_held: AtomicU64,
    /// Applied outbox rows this process's writers deleted ([`outbox::Forgets`]).
    pub outbox_forgotten: AtomicU64,
    /// The statements that deleted them (one per burst of writes).
    pub outbox_deletes: AtomicU64,
    /// Round-trip histograms, once `GET /metrics` is set up ([`crate::metrics::Metrics::new`]).
    pub round_trips: std::sync::OnceLock<crate::metrics::RoundTrips>,
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

/// What chirp talks to: one Redis server, or a Redis Cluster (`CHIRP_REDIS_CLUSTER`).
enum Backend {
    Single {
        conn: ConnectionManager,
        /// A connection of its own for durable writes: a `WAIT` blocks the connection it is
        /// sent on, and reads must not queue behind it.
        durable: ConnectionManager,
        /// For dedicated connections (pub/sub subscribers).
        client: redis::Client,
    },
    Cluster {
        client: Box<ClusterClient>,
        /// Connected at first use (chirp starts while the cluster is down); it then follows
        /// the topology and reconnects by itself.
        conn: tokio::sync::OnceCell<ClusterConnection>,
        /// Connections of their own for durable writes (see `Single::durable`).
        durable: tokio::sync::OnceCell<ClusterConnection>,
        /// Which master serves which slot, for splitting pipelines per master.
        slots: std::sync::RwLock<Option<Arc<conn::SlotMap>>>,
        /// Set when a reply showed the map out of date; the next session reads it again.
        stale: Arc<AtomicBool>,
        /// When the map was last read (it is read again every [`transport::SLOT_MAP_EVERY`]).
        read_at: std::sync::Mutex<std::time::Instant>,
    },
}

struct Inner {
    backend: Backend,
    /// `WAIT` for durable writes (see [`conn`]).
    wait: Wait,
    /// Cluster masters whose replicas fell short of a `WAIT` a moment ago (see [`conn`]).
    short_masters: Arc<conn::ShortMasters>,
    keys: Keys,
    ttl_secs: u64,
    list_limit: usize,
    timeout: Duration,
    /// Whether Redis is in use (bit 0: marked up) and how many times it was marked down (the
    /// other bits): a recovery marks it up only if nothing marked it down since the recovery
    /// began ([`Cache::mark_up`]).
    state: AtomicU64,
    /// Hand-offs through Postgres and their lease ([`handoff`]).
    hand_offs: Arc<handoff::HandOffs>,
    /// This process's pub/sub subscription: 0 never started, 1 standing, 2 broken (see
    /// [`Cache::subscription_broken`]).
    subscription: std::sync::atomic::AtomicU8,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Permits for background loads that grow cold lists (`CHIRP_CACHE_EXTENSIONS`).
    extensions: Arc<tokio::sync::Semaphore>,
    stats: Stats,
    after_commit: Mutex<AfterCommit>,
    /// A test hook: the subscriber connection to the cluster master at this address goes to
    /// this URL instead (a fault proxy in front of it; [`Cache::route_subscriber`]).
    subscriber_route: Mutex<Option<((String, u16), String)>>,
    /// Tweet and user objects in this process's memory ([`near`]).
    objects: Arc<near::Near<held::NearId, held::NearObject>>,
    /// The tweets of the timeline pages this process served last ([`pages`]).
    pages: pages::PageMemory,
    /// Applied outbox rows waiting for their delete ([`outbox::Forgets`]).
    forgets: outbox::Forgets,
    /// Why the monitor's last recovery left Redis out of use (`None`: it marked Redis up, or
    /// none ran yet); [`Cache::recovery_failure`].
    recovery_failure: Mutex<Option<String>>,
}

impl Inner {
    /// Whether Redis and memory may be used now ([`Cache::available`]). The lease is read
    /// before the mark: a listener that renews its lease after marking Redis down (see
    /// [`handoff`]) is never seen renewed and still marked up.
    fn in_use(&self) -> bool {
        self.hand_offs.hearing() && self.marked_up()
    }

    fn marked_up(&self) -> bool {
        self.state.load(Ordering::Acquire) & 1 == 1
    }

    /// Counts a mark down and clears the mark; returns whether Redis was marked up.
    fn mark_down(&self) -> bool {
        let before = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(((v >> 1) + 1) << 1)
            })
            .unwrap_or(0);
        before & 1 == 1
    }
}

/// What [`Cache::mark_up`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkUp {
    /// Redis was marked down and is in use again.
    CameBack,
    /// It was marked up already.
    AlreadyUp,
    /// It was marked down since the recovery began: not marked up.
    Stale,
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
        let timeout = Duration::from_millis(config.redis_timeout_ms.max(1));
        // Every call sets its own budget (`run`: the timeout; `run_unchecked`, `run_relay`,
        // bulk writes: several times it), enforced here around each call. The client's own
        // response timeout only catches a connection that stopped answering: above every
        // budget, or it would cap them all at the short one (and redis-rs would retry, sending
        // a pipeline twice; review of 2026-11-26, finding 8).
        let response = timeout * RESPONSE_TIMEOUTS;
        let backend = if config.redis_cluster.is_empty() {
            let client = redis::Client::open(config.redis_url.as_str())
                .map_err(|e| anyhow::anyhow!("invalid REDIS_URL: {e}"))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(response))
                .set_connection_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            let conn =
                ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())?;
            let durable = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)?;
            Backend::Single {
                conn,
                durable,
                client,
            }
        } else {
            let client = ClusterClient::builder(config.redis_cluster.iter().map(String::as_str))
                .connection_timeout(timeout)
                .response_timeout(response)
                // chirp decides what goes again, and where (see `conn`'s module docs).
                .retries(0)
                .build()
                .map_err(|e| anyhow::anyhow!("invalid CHIRP_REDIS_CLUSTER: {e}"))?;
            Backend::Cluster {
                client: Box::new(client),
                conn: tokio::sync::OnceCell::new(),
                durable: tokio::sync::OnceCell::new(),
                slots: std::sync::RwLock::new(None),
                stale: Arc::new(AtomicBool::new(true)),
                read_at: std::sync::Mutex::new(std::time::Instant::now()),
            }
        };
        let replicas = config
            .redis_wait_replicas
            .unwrap_or(u32::from(!config.redis_cluster.is_empty()));
        Ok(Cache {
            inner: Some(Arc::new(Inner {
                backend,
                wait: Wait {
                    replicas,
                    timeout_ms: (config.redis_timeout_ms / 2).max(1),
                },
                short_masters: Arc::default(),
                keys,
                ttl_secs: config.cache_ttl_secs,
                list_limit: config.cache_list_limit as usize,
                timeout,
                // Assume down until the first successful check (see `outbox::recover`), so that
                // the epoch is verified and an outbox left by an earlier outage is relayed before
                // the first cached read.
                state: AtomicU64::new(0),
                hand_offs: Arc::new(handoff::HandOffs::new(Duration::from_millis(
                    config.near_lease_ms,
                ))),
                subscription: std::sync::atomic::AtomicU8::new(0),
                flights: Mutex::new(HashMap::new()),
                extensions: Arc::new(tokio::sync::Semaphore::new(
                    config.cache_extensions as usize,
                )),
                stats: Stats::default(),
                after_commit: Mutex::new(AfterCommit::Apply),
                subscriber_route: Mutex::new(None),
                objects: near::Near::new(
                    held::OBJECTS_TOPIC,
                    Duration::from_secs(config.object_cache_secs),
                    usize::try_from(config.near_capacity).unwrap_or(usize::MAX),
                ),
                pages: pages::PageMemory::default(),
                forgets: outbox::Forgets::default(),
                recovery_failure: Mutex::new(None),
            })),
        })
    }

    /// Whether `CHIRP_CACHE` is on.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether reads may use Redis now: enabled, not marked down, and (in a process that
    /// listens for hand-offs) holding the hand-off lease ([`handoff`]).
    pub fn available(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.in_use())
    }

    /// Whether Redis is marked up (whatever the hand-off lease): the monitor recovers while not.
    pub fn marked_up(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.marked_up())
    }

    /// Why the monitor's last recovery ([`outbox::recover`]) left Redis out of use, e.g.
    /// `"outbox relay: …"`; `None` once a recovery marked it up (or before any ran). For
    /// operators and the history checker's report: a process that stays off Redis says why.
    pub fn recovery_failure(&self) -> Option<String> {
        let inner = self.inner.as_ref()?;
        inner
            .recovery_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the outcome of a recovery: `None` when it marked Redis up (or found it up).
    pub(crate) fn recovered(&self, failure: Option<String>) {
        if let Some(inner) = &self.inner {
            *inner
                .recovery_failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = failure;
        }
    }

    /// How many times Redis was marked down so far: what a recovery reads before it relays
    /// the outbox, and gives back to [`Cache::mark_up`].
    pub(crate) fn downs(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.state.load(Ordering::Acquire) >> 1)
    }

    /// This process's hand-offs ([`handoff`]); `None` with the cache off.
    pub fn hand_offs(&self) -> Option<Arc<handoff::HandOffs>> {
        self.inner.as_ref().map(|i| i.hand_offs.clone())
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

    /// Durable writes that sent no `WAIT` to a cluster master whose replicas had fallen short
    /// within [`conn::ShortMasters::HELD`] (each still took those replicas out of the epoch's
    /// record): `/healthz` `cache.waits_skipped`.
    pub fn waits_skipped(&self) -> u64 {
        self.inner.as_ref().map_or(0, |i| i.short_masters.skipped())
    }

    /// The near cache of tweet and user objects (`None` with the cache off).
    pub fn near_objects(&self) -> Option<&near::Near<held::NearId, held::NearObject>> {
        self.inner.as_ref().map(|i| &*i.objects)
    }

    /// Applied outbox rows waiting for their delete (`None` when disabled).
    fn forgets(&self) -> Option<&outbox::Forgets> {
        self.inner.as_ref().map(|i| &i.forgets)
    }

    /// The page memory of timeline reads (`None` with the cache off).
    pub fn pages(&self) -> Option<&pages::PageMemory> {
        self.inner.as_ref().map(|i| &i.pages)
    }

    /// Lets the near cache of objects listen for evictions on this process's subscriber (call
    /// once, while the state is built).
    pub fn attach_near_objects(
        &self,
        subscriber: &Arc<pubsub::Subscriber>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        if let Some(inner) = &self.inner {
            inner.objects.attach(subscriber, self, stop);
        }
    }

    /// Sets what the post-commit step does (a test hook; see [`AfterCommit`]).
    #[doc(hidden)]
    pub fn set_after_commit(&self, mode: AfterCommit) {
        if let Some(inner) = &self.inner {
            *inner.after_commit.lock().unwrap_or_else(|p| p.into_inner()) = mode;
        }
    }

    /// Sends the subscriber connection, from its next connect on, to `via` (a `redis://` URL)
    /// whenever the `{bus}` slot's master is at `master` (`(host, port)`): a test hook that
    /// puts a fault proxy in front of the one connection of a cluster process that pub/sub
    /// faults break. One Redis: no effect (point `CHIRP_REDIS_URL` at the proxy instead).
    #[doc(hidden)]
    pub fn route_subscriber(&self, master: (String, u16), via: String) {
        if let Some(inner) = &self.inner {
            *inner
                .subscriber_route
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some((master, via));
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

    /// Records whether this process's pub/sub subscription stands (`pubsub`'s subscriber task).
    pub(crate) fn set_subscribed(&self, standing: bool) {
        if let Some(inner) = &self.inner {
            inner
                .subscription
                .store(if standing { 1 } else { 2 }, Ordering::Release);
        }
    }

    /// Whether this process started a subscription that does not stand now. A broken
    /// subscription is what a Redis restart (maybe from an older snapshot) looks like from
    /// here, while the data connection reconnects silently: Redis is not used again until the
    /// subscription stands and the epoch is verified after it ([`outbox::recover`]), or a
    /// restart between two reconnection attempts would go unnoticed until the next epoch check
    /// (history checker seed 14660894705925068959: a like unseen on a process that read the
    /// liked set from a Redis restarted from an older snapshot).
    pub fn subscription_broken(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.subscription.load(Ordering::Acquire) == 2)
    }

    /// Marks Redis usable, unless it was marked down after the recovery that calls this read
    /// [`Cache::downs`] (`since`): that recovery may have missed what the new mark is about.
    pub(crate) fn mark_up(&self, since: u64) -> MarkUp {
        let Some(inner) = &self.inner else {
            return MarkUp::Stale;
        };
        let down = since << 1;
        match inner
            .state
            .compare_exchange(down, down | 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                inner.stats.recoveries.fetch_add(1, Ordering::AcqRel);
                MarkUp::CameBack
            }
            Err(now) if now == down | 1 => MarkUp::AlreadyUp,
            Err(_) => MarkUp::Stale,
        }
    }

    fn live(&self) -> Result<&Arc<Inner>, CacheUnavailable> {
        match &self.inner {
            Some(i) if i.in_use() => Ok(i),
            _ => Err(CacheUnavailable),
        }
    }

    /// Marks Redis unusable until [`outbox::recover`] succeeds.
    pub(crate) fn mark_down(&self, err: &dyn std::fmt::Display) {
        let Some(inner) = &self.inner else { return };
        inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        if inner.mark_down() {
            tracing::warn!(error = %err, "redis unavailable; serving from postgres until it answers");
        }
    }

    /// Marks Redis unusable until a recovery that starts from now has relayed every outbox
    /// row (hand-offs this process may have missed; [`handoff`]). Not an error of Redis's.
    pub(crate) fn require_recovery(&self, why: &str) {
        if let Some(inner) = &self.inner
            && inner.mark_down()
        {
            tracing::info!(why, "redis not used until the outbox is relayed");
        }
    }

    /// Runs a pipeline with the short Redis timeout, with the request's deferred cache fill if
    /// it has one ([`deferred`]). A script missing from Redis's script cache is loaded and the
    /// pipeline retried once. Any other failure marks Redis down.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, CacheUnavailable> {
        let inner = self.live()?;
        // The request's deferred cache fill, if it has one, goes along (`deferred`).
        let fill = deferred::Deferred::take_for(pipe);
        let with = fill.as_ref().map(|f| f.appended_to(pipe));
        let read = self.run_on(
            inner,
            with.as_ref().unwrap_or(pipe),
            inner.timeout,
            Mode::Read,
        );
        let (value, _) = read.await?;
        if let Some(fill) = fill {
            fill.done(self);
        }
        Ok(value)
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
        self.run_on(inner, pipe, inner.timeout + per_item(items), Mode::Bulk)
            .await
            .map(|(v, _)| v)
    }

    /// [`Cache::run_bulk`] for the cache writes of committed changes (the post-commit step):
    /// each master's commands end with `WAIT` when `CHIRP_REDIS_WAIT_REPLICAS` is above 0.
    /// Returns the replies and the masters (`host`, `port`) whose replicas did not acknowledge
    /// in time: the write stands there, and the caller must take their replicas out of the
    /// epoch's record ([`epoch::distrust_replicas`]) before it deletes the outbox row. A
    /// shortfall that can not be put on a master counts as a failure (the row stays for the
    /// relay).
    pub(crate) async fn run_durable<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        items: usize,
    ) -> Result<(T, Vec<(String, u16)>), CacheUnavailable> {
        let inner = self.live()?;
        let timeout = inner.timeout + per_item(items) + inner.wait_time();
        self.run_on(inner, pipe, timeout, Mode::Durable).await
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

    /// [`Cache::run_unchecked`] for the outbox relay's writes (all ignored), durable like
    /// [`Cache::run_durable`]: `Ok(Some(masters))` names the masters whose replicas did not
    /// acknowledge in time (see there); `Ok(None)`: applied, but a shortfall could not be put
    /// on a master (the relay keeps the rows and applies them again on its next pass).
    pub(crate) async fn run_relay(
        &self,
        pipe: &Pipeline,
        items: usize,
    ) -> Result<Option<Vec<(String, u16)>>, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        let timeout = inner.timeout * 5 + per_item(items) + inner.wait_time();
        match query_noting_acks::<()>(inner, pipe, timeout, true).await {
            Ok(((), short)) => Ok(Some(short)),
            Err(Some(e)) if conn::is_not_replicated(&e) => Ok(None),
            Err(_) => Err(CacheUnavailable),
        }
    }

    /// Runs `pipe` and judges a failure by `mode`; returns the replies and, for a durable
    /// write, the masters whose replicas did not acknowledge it (see [`Cache::run_durable`]).
    async fn run_on<T: FromRedisValue>(
        &self,
        inner: &Inner,
        pipe: &Pipeline,
        timeout: Duration,
        mode: Mode,
    ) -> Result<(T, Vec<(String, u16)>), CacheUnavailable> {
        // Nothing to send (a write that changed nothing, such as a chat send refused for a
        // non-member): no round trip. redis-rs refuses an empty pipeline with a client error,
        // which must not mark Redis down for every request of the process.
        if pipe.is_empty() {
            let none = T::from_redis_value(redis::Value::Array(Vec::new()));
            return none.map(|v| (v, Vec::new())).map_err(|e| {
                tracing::error!(error = %e, "an empty cache pipeline whose caller wants replies");
                CacheUnavailable
            });
        }
        let started = std::time::Instant::now();
        let result = query_noting_acks(inner, pipe, timeout, mode == Mode::Durable).await;
        if let Some(round_trips) = inner.stats.round_trips.get() {
            round_trips.redis.observe(started.elapsed().as_secs_f64());
        }
        match result {
            Ok(v) => Ok(v),
            Err(Some(e)) if conn::is_not_replicated(&e) => {
                inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    replicas = inner.wait.replicas,
                    "cache write not acknowledged by a replica in time; the outbox relay repeats it"
                );
                Err(CacheUnavailable)
            }
            Err(Some(e)) => {
                self.mark_down(&e);
                Err(CacheUnavailable)
            }
            Err(None) if mode == Mode::Read => {
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

    /// Runs `query`, a Postgres read of the cache-aside path (`read`: `first_fill`, `page`,
    /// `extension`, `hydration`), and records how long it took, failed or not, in
    /// `chirp_postgres_round_trip_seconds`. Records nothing with `CHIRP_CACHE=off` or before
    /// [`crate::metrics::Metrics::new`].
    pub async fn time_postgres<T>(&self, read: &'static str, query: impl Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let out = query.await;
        if let Some(round_trips) = self.stats().and_then(|s| s.round_trips.get()) {
            (round_trips.postgres)
                .with_label_values(&[read])
                .observe(started.elapsed().as_secs_f64());
        }
        out
    }

    /// A session on the connection (connecting to a cluster at first use), within the short
    /// timeout. `durable`: with `WAIT` (see [`conn`]).
    ///
    /// # Errors
    /// Off, or the cluster could not be reached.
    pub async fn session(&self, durable: bool) -> Result<Session, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        session(inner, durable, inner.timeout * 5)
            .await
            .map_err(|_| CacheUnavailable)
    }

    /// Whether chirp talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| matches!(i.backend, Backend::Cluster { .. }))
    }

    /// `PING` with the short timeout, regardless of the health flag (for `/healthz` and the
    /// monitor): on a cluster, every master must answer. Always false when disabled.
    pub async fn ping(&self) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        let ping = async {
            let mut s = session(inner, false, inner.timeout).await.ok()?;
            s.on_every_master(&redis::cmd("PING")).await.ok()
        };
        matches!(tokio::time::timeout(inner.timeout, ping).await, Ok(Some(_)))
    }

    /// Every key under `pattern`, in batches: `SCAN` on the one server, or on every master of
    /// a cluster in turn. Works while Redis is marked down.
    ///
    /// # Errors
    /// Off, or a node failed.
    pub(crate) async fn scan(&self, pattern: String) -> Result<Scan, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        let mut session = session(inner, false, inner.timeout * 5)
            .await
            .map_err(|_| CacheUnavailable)?;
        let nodes = match tokio::time::timeout(inner.timeout * 5, session.masters()).await {
            Ok(Ok(Some(masters))) => masters.into_iter().map(|m| Some(m.addr)).collect(),
            Ok(Ok(None)) => vec![None],
            _ => return Err(CacheUnavailable),
        };
        Ok(Scan {
            session,
            nodes,
            cursor: 0,
            pattern,
            timeout: inner.timeout * 5,
        })
    }

    /// Deletes every key under the prefix (after a bulk import, whose writes bypass the cache,
    /// and when the [`epoch`] fence trips). Works while Redis is marked down; returns how many
    /// keys were deleted. On a cluster, every master is scanned.
    pub async fn clear(&self) -> Result<usize, CacheUnavailable> {
        let inner = self.inner.as_ref().ok_or(CacheUnavailable)?;
        let mut scan = self.scan(inner.keys.everything_pattern()).await?;
        let mut deleted = 0;
        while let Some(keys) = scan.next().await? {
            let mut del = redis::pipe();
            if self.is_cluster() {
                // Each `UNLINK` in its own key's slot (see `conn::split`).
                for key in &keys {
                    del.cmd("UNLINK").arg(key).ignore();
                }
            } else {
                del.cmd("UNLINK").arg(&keys).ignore();
            }
            self.run_unchecked::<()>(&del, keys.len()).await?;
            deleted += keys.len();
        }
        Ok(deleted)
    }

    /// A permit to grow a cold list's window in the background (`CHIRP_CACHE_EXTENSIONS` run
    /// at once per process); `None` when all are taken (the list then stays as it is, and a
    /// later read below its window asks again) or the cache is off.
    pub fn extension_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let inner = self.inner.as_ref()?;
        inner.extensions.clone().try_acquire_owned().ok()
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

/// How a failure of [`Cache::run_on`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A read: a timeout marks Redis down.
    Read,
    /// A bulk write: a timeout is logged, the outbox repairs it.
    Bulk,
    /// A bulk write of a committed change, with `WAIT`.
    Durable,
}

impl Inner {
    /// How long a durable write may wait for its replicas.
    fn wait_time(&self) -> Duration {
        if self.wait.replicas == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(self.wait.timeout_ms)
        }
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

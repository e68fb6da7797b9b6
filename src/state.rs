//! The state every handler shares.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};

use crate::cache::Cache;
use crate::cache::limits::LocalGcra;
use crate::cache::pubsub::Subscriber;
use crate::cache::tokens::TokenCache;
use crate::chat::{ChatState, Hub, SendQueue};
use crate::config::Config;
use crate::jobs::Worker;
use crate::media::Media;
use crate::streams;

/// Tokens one process keeps in memory at most (about 100 bytes each).
const TOKEN_CACHE_CAPACITY: usize = 200_000;

/// Postgres, the cache, the job worker handle and the configuration, shared by every handler
/// and middleware. One `Arc`: a clone (each layer clones it per request) is one atomic
/// increment; fields are reached through `Deref` (`state.db`).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    pub db: PgPool,
    pub cache: Cache,
    pub worker: Worker,
    pub config: Arc<Config>,
    /// Photos and avatars.
    pub media: Media,
    /// Chat: the long-poll waiters of this process and the shutdown signal that ends them.
    pub chat: ChatState,
    /// Turned true when the process shuts down (ends long-polls and the chat subscriber).
    pub shutdown: Arc<watch::Sender<bool>>,
    /// The per-process rate limiter used while Redis is down.
    pub limiter: Arc<LocalGcra>,
    /// The bounded pool every password hash (signup, login) runs on: its bound is this
    /// process's cores and memory.
    pub hashing: crate::accounts::HashPool,
    /// Clients whose token lookups this process refuses for now (failed authentications).
    pub refused: crate::http::limits::Refused,
    /// `/healthz`'s probe of Postgres and Redis, run at most once per interval.
    pub health: crate::http::health::Probe,
    /// This process's stream clients.
    pub streams: Arc<streams::Hub>,
    /// This process's one pub/sub subscription (chat wake-ups, stream events, revocations).
    pub subscriber: Arc<Subscriber>,
    /// Recently seen bearer tokens, in this process's memory (`CHIRP_TOKEN_CACHE_SECS`).
    pub tokens: Arc<TokenCache>,
    /// The Postgres replica for never-cached reads (`DATABASE_REPLICA_URL`), if any.
    pub replica: Arc<crate::replica::Replica>,
    /// Compose back-pressure: how far behind the fan-out is (`CHIRP_FANOUT_MAX_WAIT_MS`).
    pub backlog: Arc<crate::jobs::Backlog>,
    /// Hybrid timelines: which composes are pulled instead of fanned out
    /// (`CHIRP_FANOUT_PULL_ABOVE`, see [`crate::hybrid`]).
    pub pull: crate::hybrid::PullPolicy,
    /// The authors whose tweets newsfeed reads pull, as this process last read them.
    pub pull_authors: Arc<crate::hybrid::PullAuthors>,
    /// This process's Prometheus registry (`GET /metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The trends as this process last read them (`GET /api/trends/`).
    pub trends: Arc<crate::hashtags::Trends>,
    /// Hashtag ids by name, as this process read them.
    pub tag_ids: crate::hashtags::TagIds,
}

impl AppState {
    /// State over an open pool. Builds the cache from `config` (no connection is made yet).
    ///
    /// # Errors
    /// A malformed `REDIS_URL`, or a media store that can not be opened.
    pub fn new(db: PgPool, config: Config) -> anyhow::Result<Self> {
        let cache = Cache::new(&config)?;
        let worker = Worker {
            db: db.clone(),
            cache: cache.clone(),
            batch_size: config.fanout_batch_size as usize,
            fanout_parts: config.fanout_parts as usize,
            batch_jobs: config.fanout_batch_jobs as usize,
            backfill_limit: config.cache_list_limit as usize,
            wake: Arc::new(Notify::new()),
            origin: rand::random(),
        };
        let (shutdown, stopped) = watch::channel(false);
        let subscriber = Arc::new(Subscriber::new(std::time::Duration::from_millis(
            config.near_lease_ms,
        )));
        let (wake, origin) = (worker.wake.clone(), worker.origin);
        subscriber.route(
            crate::jobs::TOPIC,
            move |message| {
                if crate::jobs::wakes(origin, message) {
                    wake.notify_one();
                }
            },
            || {},
        );
        let streams = streams::Hub::new(&subscriber, db.clone());
        cache.attach_near_objects(&subscriber, stopped.clone());
        let tokens = TokenCache::new(
            &subscriber,
            &cache,
            stopped.clone(),
            std::time::Duration::from_secs(config.token_cache_secs),
            TOKEN_CACHE_CAPACITY,
        );
        let chat = ChatState {
            db: db.clone(),
            cache: cache.clone(),
            hub: Hub::new(&subscriber),
            subscriber: subscriber.clone(),
            sends: Arc::new(SendQueue::default()),
            stop: stopped,
            backlog: config.chat_backlog as usize,
            idle: std::time::Duration::from_secs(config.chat_idle_secs),
        };
        let config_replica = config.clone();
        let cache_replica = cache.clone();
        let pull = crate::hybrid::PullPolicy::from_config(&config);
        let metrics = Arc::new(crate::metrics::Metrics::new(&cache)?);
        Ok(AppState(Arc::new(Shared {
            metrics,
            chat,
            shutdown: Arc::new(shutdown),
            db,
            cache,
            worker,
            media: Media::new(&config)?,
            config: Arc::new(config),
            limiter: Arc::new(LocalGcra::default()),
            hashing: crate::accounts::HashPool::new(),
            refused: crate::http::limits::Refused::default(),
            health: crate::http::health::Probe::default(),
            streams,
            subscriber,
            tokens,
            replica: Arc::new(crate::replica::Replica::new(
                &config_replica,
                &cache_replica,
            )?),
            backlog: Arc::new(crate::jobs::Backlog::new(config_replica.fanout_max_wait_ms)),
            pull,
            pull_authors: Arc::new(crate::hybrid::PullAuthors::new(&pull)),
            trends: Arc::default(),
            tag_ids: crate::hashtags::TagIds::default(),
        })))
    }
}

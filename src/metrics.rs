//! Prometheus metrics of one process, served at `GET /metrics` in the text exposition format
//! (version 0.0.4), on a registry of this process's own (as crates.io keeps per-instance
//! metrics): two servers in one test process keep separate figures.
//!
//! Three sources:
//! - **Recorded as they happen** ([`Metrics::request_series`]): `http_requests_total` by
//!   method, route (the router's matched path, `unmatched` for none) and status, and
//!   `http_request_duration_seconds` by method and route (until the response's head: a
//!   stream's duration is its start).
//! - **Round trips** ([`RoundTrips`], observed by the cache layer): every Redis pipeline of
//!   the cache (`chirp_redis_round_trip_seconds`) and the Postgres reads of the cache-aside
//!   path (`chirp_postgres_round_trip_seconds{read}`: `first_fill`, `page`, `extension`,
//!   `hydration`).
//! - **Read at each scrape** ([`Metrics::render`]): the cache's counters since start
//!   ([`crate::cache::Stats`], the near caches' [`crate::cache::near::NearStats`]) and the
//!   state of queues and connections, two Postgres counts included (the fan-out queue and the
//!   outbox, each over a small index; cancelled by Postgres past 1 s, and then left out of
//!   that scrape).
//!
//! The names follow docs/API.md "Observability"; docs/ops/ holds alert rules over them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
    Registry, TextEncoder,
};

use crate::state::AppState;

/// Latency buckets in seconds: 250 µs to 10 s (a warm page takes about a millisecond, a
/// request's limit is 10 s).
const BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How long a scrape waits for Postgres's counts.
const SCRAPE_QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// The round-trip histograms the cache layer observes ([`crate::cache::Stats::round_trips`]).
#[derive(Clone, Debug)]
pub struct RoundTrips {
    /// `chirp_redis_round_trip_seconds`: each pipeline of the cache, failures and timeouts
    /// included.
    pub redis: Histogram,
    /// `chirp_postgres_round_trip_seconds{read}`: the cache-aside path's Postgres reads.
    pub postgres: HistogramVec,
}

/// This process's registry and the metrics recorded as they happen.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    durations: HistogramVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with the request metrics and the round-trip histograms, which it hands to
    /// `cache` (a disabled cache records none).
    ///
    /// # Errors
    /// A metric that could not be built or registered (a programming error: a bad name or
    /// label, or the same name twice).
    pub fn new(cache: &crate::cache::Cache) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests answered."),
            &["method", "route", "status"],
        )?;
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time to answer an HTTP request (to the response's head), in seconds.",
            )
            .buckets(BUCKETS.to_vec()),
            &["method", "route"],
        )?;
        let round_trips = RoundTrips {
            redis: Histogram::with_opts(
                HistogramOpts::new(
                    "chirp_redis_round_trip_seconds",
                    "Redis pipelines of the cache, in seconds.",
                )
                .buckets(BUCKETS.to_vec()),
            )?,
            postgres: HistogramVec::new(
                HistogramOpts::new(
                    "chirp_postgres_round_trip_seconds",
                    "Postgres reads of the cache-aside path, in seconds.",
                )
                .buckets(BUCKETS.to_vec()),
                &["read"],
            )?,
        };
        // Every read from the start, so the family is there before its first observation.
        for read in ["first_fill", "page", "extension", "hydration"] {
            round_trips.postgres.with_label_values(&[read]);
        }
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(durations.clone()))?;
        registry.register(Box::new(round_trips.redis.clone()))?;
        registry.register(Box::new(round_trips.postgres.clone()))?;
        if let Some(stats) = cache.stats() {
            // A cache reports to the registry of the state built with it (set once).
            let _ = stats.round_trips.set(round_trips);
        }
        Ok(Metrics {
            registry,
            requests,
            durations,
        })
    }

    /// The series that count and time requests of `method` on `route` (the matched path;
    /// `None`: no route matched) answered with `status`. Looking them up hashes the labels; a
    /// caller that records many such requests keeps them ([`crate::http`]'s `Observe` layer
    /// does, per route).
    pub fn request_series(
        &self,
        method: &str,
        route: Option<&str>,
        status: u16,
    ) -> (IntCounter, Histogram) {
        let route = route.unwrap_or("unmatched");
        let mut code = itoa::Buffer::new();
        (
            self.requests
                .with_label_values(&[method, route, code.format(status)]),
            self.durations.with_label_values(&[method, route]),
        )
    }

    /// The text exposition of every metric of this process, read now.
    ///
    /// # Errors
    /// Encoding failed (a programming error).
    pub async fn render(&self, state: &AppState) -> prometheus::Result<String> {
        let mut families = self.registry.gather();
        families.extend(scraped(state).await?);
        // A family without samples (no near cache on, say) is an encoding error.
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut text = Vec::new();
        TextEncoder::new().encode(&families, &mut text)?;
        String::from_utf8(text).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// Counters read from atomics at scrape time, with labels.
struct Counters(IntCounterVec);

impl Counters {
    fn new(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        Ok(Counters(IntCounterVec::new(Opts::new(name, help), labels)?))
    }

    fn set(&self, labels: &[&str], value: u64) {
        self.0.with_label_values(labels).inc_by(value);
    }
}

/// Gauges read at scrape time, with labels.
struct Gauges(GaugeVec);

impl Gauges {
    fn new(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        Ok(Gauges(GaugeVec::new(Opts::new(name, help), labels)?))
    }

    fn set(&self, labels: &[&str], value: f64) {
        self.0.with_label_values(labels).set(value);
    }
}

fn get(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The fan-out queue ([`crate::jobs::lag`]) and the outbox ([`crate::cache::outbox::backlog`])
/// from Postgres, in one transaction whose statements Postgres itself cancels after
/// [`SCRAPE_QUERY_TIMEOUT`] (a count over a huge backlog must not pile up behind scrapes).
async fn queues(
    db: &sqlx::PgPool,
) -> sqlx::Result<(crate::jobs::Lag, crate::cache::outbox::Backlog)> {
    let mut tx = db.begin().await?;
    // `SET` takes no parameters; `set_config` does (its `true`: for this transaction only).
    sqlx::query("select set_config('statement_timeout', $1, true)")
        .bind(SCRAPE_QUERY_TIMEOUT.as_millis().to_string())
        .execute(&mut *tx)
        .await?;
    let lag = crate::jobs::lag(&mut *tx).await?;
    let outbox = crate::cache::outbox::backlog(&mut *tx).await?;
    tx.commit().await?;
    Ok((lag, outbox))
}

/// The families read at scrape time.
async fn scraped(state: &AppState) -> prometheus::Result<Vec<MetricFamily>> {
    let mut families = Vec::new();
    let hits = Counters::new(
        "chirp_cache_hits_total",
        "Lookups a cache answered, by kind: timeline (cached lists), object (tweets and \
         users in Redis), counter (tweet counters in Redis), token (bearer tokens in Redis), \
         near_object and near_token (this process's memory).",
        &["kind"],
    )?;
    let misses = Counters::new(
        "chirp_cache_misses_total",
        "Lookups a cache could not answer, by kind (as chirp_cache_hits_total).",
        &["kind"],
    )?;
    let cache = Counters::new(
        "chirp_cache_events_total",
        "Cache events: loads (lists filled from Postgres), extensions (lists grown), \
         fallbacks (pages past the cached window read from Postgres), errors (failed Redis \
         operations), recoveries (Redis back in use), epoch_changes, replicas_distrusted, \
         waits_skipped (durable writes that did not WAIT on a master just found short), \
         prefetched (pages hydrated without a second round trip), merged and \
         merge_fallbacks (newsfeed pages of readers of pulled authors), near_evictions, \
         near_unconfirmed (evictions that waited out a lease), fill_objects_held (objects \
         of cold fills not sent to Redis: this process held them at that version), \
         outbox_forgotten (applied outbox rows deleted by their writers' process) and \
         outbox_deletes (the statements that deleted them, one per burst of writes).",
        &["event"],
    )?;
    let fences = Counters::new(
        "chirp_cache_fences_total",
        "Times the epoch fence cleared the cache (Redis came back with other data).",
        &[],
    )?;
    let trusted = Gauges::new(
        "chirp_near_cache_trusted",
        "1 while this process answers from its near cache (subscription standing, lease \
         held, Redis in use), else 0.",
        &["cache"],
    )?;
    let redis_up = Gauges::new(
        "chirp_redis_up",
        "1 while Redis is in use (marked up and, in a process that listens for hand-offs, its \
         hand-off lease held), 0 while it is marked down, the lease has lapsed, or it is off.",
        &[],
    )?;
    let hand_off_lease = Gauges::new(
        "chirp_hand_off_lease_held",
        "1 while this process holds its hand-off lease (it hears, through Postgres, the \
         outbox rows of writers that lost Redis), 0 while not; absent where nothing listens.",
        &[],
    )?;
    if let Some(h) = state.cache.hand_offs().filter(|h| h.listening()) {
        hand_off_lease.set(&[], f64::from(u8::from(h.lease().held())));
    }
    if let Some(stats) = state.cache.stats() {
        for (kind, hit, miss) in [
            ("timeline", &stats.hits, &stats.misses),
            ("object", &stats.object_hits, &stats.object_misses),
            ("counter", &stats.counter_hits, &stats.counter_misses),
            ("token", &stats.token_hits, &stats.token_misses),
        ] {
            hits.set(&[kind], get(hit));
            misses.set(&[kind], get(miss));
        }
        for (event, n) in [
            ("loads", &stats.loads),
            ("extensions", &stats.extensions),
            ("fallbacks", &stats.fallbacks),
            ("errors", &stats.errors),
            ("recoveries", &stats.recoveries),
            ("epoch_changes", &stats.epoch_changes),
            ("replicas_distrusted", &stats.replicas_distrusted),
            ("prefetched", &stats.prefetched),
            ("merged", &stats.merged),
            ("merge_fallbacks", &stats.merge_fallbacks),
            ("fill_objects_held", &stats.fill_objects_held),
            ("outbox_forgotten", &stats.outbox_forgotten),
            ("outbox_deletes", &stats.outbox_deletes),
        ] {
            cache.set(&[event], get(n));
        }
        cache.set(&["waits_skipped"], state.cache.waits_skipped());
    }
    let stats = state.cache.stats();
    fences.set(&[], stats.map_or(0, |s| get(&s.fences)));
    let mut near_evictions = 0;
    let mut near_unconfirmed = 0;
    // Trust is reported for the near caches that are on (a zero TTL or capacity turns one off).
    let trust = |n: bool, t: bool| n.then_some(t);
    let objects = (state.cache.near_objects())
        .map(|n| (&n.stats, trust(n.enabled(), n.is_trusted(&state.cache))));
    let tokens = Some((
        &state.tokens.stats,
        trust(
            state.tokens.enabled(),
            state.tokens.is_trusted(&state.cache),
        ),
    ));
    for (kind, near) in [("near_object", objects), ("near_token", tokens)] {
        let Some((stats, is_trusted)) = near else {
            continue;
        };
        hits.set(&[kind], get(&stats.hits));
        misses.set(&[kind], get(&stats.misses));
        near_evictions += get(&stats.evictions);
        near_unconfirmed += get(&stats.unconfirmed);
        let name = kind.trim_start_matches("near_");
        if let Some(is_trusted) = is_trusted {
            trusted.set(&[name], f64::from(u8::from(is_trusted)));
        }
    }
    cache.set(&["near_evictions"], near_evictions);
    cache.set(&["near_unconfirmed"], near_unconfirmed);
    redis_up.set(&[], f64::from(u8::from(state.cache.available())));

    let clients = Gauges::new(
        "chirp_stream_clients",
        "Open streams of this process: user (streaming/user) and public (statuses/*).",
        &["stream"],
    )?;
    let (user, public) = state.streams.counts();
    clients.set(&["user"], user as f64);
    clients.set(&["public"], public as f64);
    let polls = Gauges::new(
        "chirp_long_poll_clients",
        "Chat long-polls of this process waiting now.",
        &[],
    )?;
    polls.set(&[], state.chat.hub.waiting() as f64);
    let stream_events = Counters::new(
        "chirp_stream_events_total",
        "Stream work: messages received from the subscription, events queued for clients, \
         clients cut off as falling behind, new pulled tweets left to the streams' next settle.",
        &["event"],
    )?;
    let s = &state.streams.stats;
    stream_events.set(&["messages"], get(&s.messages));
    stream_events.set(&["queued"], get(&s.queued));
    stream_events.set(&["fell_behind"], get(&s.fell_behind));
    stream_events.set(&["pulled_deferred"], get(&s.pulled_deferred));

    let fanout_waiting = Gauges::new(
        "chirp_fanout_waiting_seconds",
        "How long the oldest fan-out job that no runner has taken has waited, as this \
         process last saw it (composes are refused past CHIRP_FANOUT_MAX_WAIT_MS).",
        &[],
    )?;
    fanout_waiting.set(&[], state.backlog.wait_ms() as f64 / 1000.0);
    let pull_sources = Gauges::new(
        "chirp_fanout_pull_sources",
        "Authors whose tweets their followers pull instead of a fan-out (hybrid timelines, \
         CHIRP_FANOUT_PULL_ABOVE), as this process last read them (0 before it has).",
        &[],
    )?;
    let pulled = state.pull_authors.last_read().unwrap_or(0);
    pull_sources.set(&[], pulled as f64);
    let queues_read = Gauges::new(
        "chirp_queues_read",
        "1 if this scrape read the fan-out queue and the outbox from Postgres (within 1 s), \
         else 0 (their gauges are then left out).",
        &[],
    )?;
    // In a task of its own: a scrape that stops waiting must not drop the transaction
    // between two statements (see `http::run_to_completion`); the statement timeout ends it.
    let db = state.db.clone();
    let read = tokio::spawn(async move { queues(&db).await });
    let queues = match tokio::time::timeout(2 * SCRAPE_QUERY_TIMEOUT, read).await {
        Ok(Ok(Ok(queues))) => Some(queues),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "metrics: reading the queues failed");
            None
        }
        Ok(Err(_)) | Err(_) => None,
    };
    queues_read.set(&[], f64::from(u8::from(queues.is_some())));
    if let Some((lag, outbox)) = queues {
        let seconds = |ms: Option<i64>| ms.unwrap_or(0) as f64 / 1000.0;
        let gauges = [
            (
                "chirp_fanout_queue_depth",
                "Jobs queued and not failed (fan-outs and their parts, backfills, unmerges, \
                 list jobs), running ones included.",
                lag.queued_jobs as f64,
            ),
            (
                "chirp_fanout_oldest_job_age_seconds",
                "Age of the oldest such job (0 with none): a big account's fan-out runs for \
                 a while; chirp_fanout_waiting_seconds is the wait for a runner.",
                seconds(lag.oldest_job_age_ms),
            ),
            (
                "chirp_outbox_rows",
                "Rows of the cache outbox (cache steps not yet applied).",
                outbox.rows as f64,
            ),
            (
                "chirp_outbox_oldest_age_seconds",
                "Age of the oldest outbox row (0 with none).",
                seconds(outbox.oldest_age_ms),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = Gauges::new(name, help, &[])?;
            gauge.set(&[], value);
            families.extend(gauge.0.collect());
        }
    }
    for c in [hits, misses, cache, fences, stream_events] {
        families.extend(c.0.collect());
    }
    for g in [
        trusted,
        redis_up,
        hand_off_lease,
        clients,
        polls,
        fanout_waiting,
        pull_sources,
        queues_read,
    ] {
        families.extend(g.0.collect());
    }
    Ok(families)
}

//! `/healthz` (dependencies) and `/livez` (the process only).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(livez))
        .routes(routes!(metrics))
}

/// This process's metrics in the Prometheus text format.
///
/// Rendered by [`crate::metrics`]; docs/API.md "Extra endpoints and fields" lists them.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, body = String, content_type = "text/plain",
        description = "The Prometheus text format (`text/plain; version=0.0.4`)")))]
async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = state
        .metrics
        .render(&state)
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!(e).context("rendering the metrics")))?;
    Ok(([(CONTENT_TYPE, prometheus::TEXT_FORMAT)], text))
}

/// The health of this process and its dependencies.
///
/// 200 if Postgres answers (503 if not); `redis` is `ok`, `down`, or `off` with
/// `CHIRP_CACHE=off`. Also reports the cache's counters since start, and this process's chat
/// send transactions and the messages they stored (their ratio: the group commit's batch size),
/// and its streams: open `streaming/user` and `statuses/*` streams, whether the pub/sub
/// subscription stands, messages received, events queued, and clients cut off as
/// FALLING_BEHIND; the Postgres replica (`off`, or whether it is fresh and how many
/// reads went to it or stayed on the primary); and the fan-out lag (`fanout`: jobs queued and
/// the oldest one's age in ms, [`crate::jobs::lag`]; how long the oldest job no runner has
/// taken has waited, and whether composes are refused for it, [`crate::jobs::Backlog`]; how
/// many authors are pull sources, [`crate::hybrid::PullAuthors::last_read`]; `null` if
/// Postgres does not answer).
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, body = Object, description = "Postgres answers. `{\"status\": \"ok\", \
            \"postgres\": \"ok\", \"redis\": \"ok\" | \"down\" | \"off\", \"fanout\", \"cache\", \
            \"chat\", \"streams\", \"replica\", \"lease\", \"tokens\", \"near_objects\"}` \
            (docs/API.md, \"Extra endpoints and fields\")"),
        (status = 503, body = Object, description = "Postgres does not answer: the same body \
            with `\"status\": \"error\"`, `\"postgres\": \"down\"` and `\"fanout\": null`"),
    ))]
async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let probed = state.health.probe(&state).await;
    let (pg_ok, fanout) = match probed.lag {
        Some(lag) => {
            let mut fanout = json!(lag);
            fanout["waiting_ms"] = json!(state.backlog.wait_ms());
            fanout["refusing_composes"] = json!(state.backlog.refuse().is_some());
            fanout["pull_sources"] = json!(state.pull_authors.last_read());
            (true, fanout)
        }
        None => (false, Value::Null),
    };
    let redis = probed.redis;
    let cache = state.cache.stats().map(|s| {
        json!({
            "hits": s.hits.load(Ordering::Relaxed),
            "misses": s.misses.load(Ordering::Relaxed),
            "loads": s.loads.load(Ordering::Relaxed),
            "extensions": s.extensions.load(Ordering::Relaxed),
            "fallbacks": s.fallbacks.load(Ordering::Relaxed),
            "errors": s.errors.load(Ordering::Relaxed),
            "fences": s.fences.load(Ordering::Relaxed),
            "recoveries": s.recoveries.load(Ordering::Relaxed),
            "replicas_distrusted": s.replicas_distrusted.load(Ordering::Relaxed),
            "waits_skipped": state.cache.waits_skipped(),
            "prefetched": s.prefetched.load(Ordering::Relaxed),
            "merged": s.merged.load(Ordering::Relaxed),
            "merge_fallbacks": s.merge_fallbacks.load(Ordering::Relaxed),
        })
    });
    let status = if pg_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let (user_streams, public_streams) = state.streams.counts();
    let body = json!({
        "status": if pg_ok { "ok" } else { "error" },
        "postgres": if pg_ok { "ok" } else { "down" },
        "redis": redis,
        "fanout": fanout,
        "cache": cache,
        "chat": {
            "send_batches": state.chat.sends.batches.load(Ordering::Relaxed),
            "messages_sent": state.chat.sends.messages.load(Ordering::Relaxed),
        },
        "streams": {
            "user": user_streams,
            "public": public_streams,
            "subscribed": state.subscriber.subscribed(),
            "messages": state.streams.stats.messages.load(Ordering::Relaxed),
            "events_queued": state.streams.stats.queued.load(Ordering::Relaxed),
            "fell_behind": state.streams.stats.fell_behind.load(Ordering::Relaxed),
            "pulled_deferred": state.streams.stats.pulled_deferred.load(Ordering::Relaxed),
        },
        "replica": if state.replica.configured() {
            json!({
                "fresh": state.replica.fresh(),
                "reads": state.replica.reads.load(Ordering::Relaxed),
                "kept_on_primary": state.replica.kept_on_primary.load(Ordering::Relaxed),
            })
        } else {
            json!("off")
        },
        "lease": {
            "process": state.subscriber.lease().id().to_string(),
            "held": state.subscriber.lease().held(),
            "remaining_ms": state.subscriber.lease().remaining().as_millis() as u64,
            "length_ms": state.subscriber.lease().length().as_millis() as u64,
            "terms": state.subscriber.lease().term(),
        },
        "hand_off_lease": match state.cache.hand_offs().filter(|h| h.listening()) {
            Some(h) => json!({
                "held": h.lease().held(),
                "remaining_ms": h.lease().remaining().as_millis() as u64,
                "terms": h.lease().term(),
            }),
            None => json!("off"),
        },
        "tokens": {
            "held": state.tokens.len(),
            "answered": state.tokens.stats.hits.load(Ordering::Relaxed),
            "revocations": state.tokens.stats.evictions.load(Ordering::Relaxed),
            "unconfirmed": state.tokens.stats.unconfirmed.load(Ordering::Relaxed),
        },
        "near_objects": match state.cache.near_objects() {
            Some(near) => json!({
                "held": near.len(),
                "answered": near.stats.hits.load(Ordering::Relaxed),
                "missed": near.stats.misses.load(Ordering::Relaxed),
                "evictions": near.stats.evictions.load(Ordering::Relaxed),
                "unconfirmed": near.stats.unconfirmed.load(Ordering::Relaxed),
            }),
            None => json!("off"),
        },
    });
    (status, Json(body))
}

/// `/healthz`'s probe of its dependencies (the fan-out lag query on Postgres, a `PING` on
/// Redis), run at most once per [`Probe::INTERVAL`]: the requests of one interval share it
/// (those that arrive while it runs wait for it), so polling `/healthz` however fast costs
/// Postgres and Redis at most ten round trips a second. It is not rate-limited: load
/// balancers poll it.
#[derive(Debug, Default)]
pub struct Probe {
    last: tokio::sync::Mutex<Option<(Instant, Probed)>>,
    /// Probes run since start.
    pub runs: AtomicU64,
}

/// What one probe found.
#[derive(Debug, Clone)]
struct Probed {
    /// `None`: Postgres did not answer within 2 s.
    lag: Option<crate::jobs::Lag>,
    redis: &'static str,
}

impl Probe {
    /// How long one probe's result is reused.
    pub const INTERVAL: Duration = Duration::from_millis(100);

    async fn probe(&self, state: &AppState) -> Probed {
        let mut last = self.last.lock().await;
        if let Some((at, probed)) = last.as_ref()
            && at.elapsed() < Self::INTERVAL
        {
            return probed.clone();
        }
        self.runs.fetch_add(1, Ordering::Relaxed);
        // One statement: Postgres answers, and how far the fan-out lags.
        let lag = tokio::time::timeout(Duration::from_secs(2), crate::jobs::lag(&state.db))
            .await
            .ok()
            .and_then(Result::ok);
        let redis = if !state.cache.enabled() {
            "off"
        } else if state.cache.available() && state.cache.ping().await {
            "ok"
        } else {
            "down"
        };
        let probed = Probed { lag, redis };
        *last = Some((Instant::now(), probed.clone()));
        probed
    }
}

/// `{"status": "ok"}`.
#[derive(Serialize, ToSchema)]
pub struct Live {
    pub status: LiveStatus,
}

/// Always `ok`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LiveStatus {
    Ok,
}

/// Whether the process answers (a liveness probe).
///
/// Always 200 without touching Postgres or Redis: the HTTP stack's ceiling in benchmarks.
#[utoipa::path(get, path = "/livez", tag = "operations",
    responses((status = 200, body = Live, description = "The process answers")))]
async fn livez() -> Json<Live> {
    Json(Live {
        status: LiveStatus::Ok,
    })
}

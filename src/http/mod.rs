//! The HTTP API: one router per module, merged here, with the layers every route shares.

pub mod accounts;
pub mod blocks;
pub mod chat;
pub mod circles;
pub mod client_ip;
pub mod comments;
pub mod extract;
pub mod friendships;
pub mod hashtags;
pub mod health;
pub mod likes;
pub mod limits;
pub mod lists;
pub mod media;
pub mod newsfeeds;
pub mod notifications;
pub mod openapi;
pub mod serve;
pub mod streams;
pub mod timeline;
pub mod tweets;
pub mod users;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use prometheus::{Histogram, IntCounter};
use tokio::task::futures::TaskLocalFuture;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::normalize_path::{NormalizePath, NormalizePathLayer};
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::trace::TraceId;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest body of the routes that take uploads (9 photos of 5 MiB and the text fields).
pub const UPLOAD_BODY_BYTES: usize = 10 * crate::media::MAX_FILE_BYTES;
/// Time limit of one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time limit of a chat request (a long-poll waits up to 30 s).
pub const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(crate::chat::MAX_WAIT_SECS + 5);

/// The API as a service: every route with and without its trailing slash.
pub fn app(state: AppState) -> NormalizePath<Router> {
    NormalizePathLayer::trim_trailing_slash().layer(router(state))
}

/// Every route, each with its OpenAPI operation ([`openapi`]).
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(<openapi::ApiDoc as utoipa::OpenApi>::openapi())
        .merge(accounts::router())
        .merge(users::router())
        .merge(blocks::router())
        .merge(tweets::router())
        .merge(newsfeeds::router())
        .merge(friendships::router())
        .merge(comments::router())
        .merge(likes::router())
        .merge(lists::router())
        .merge(circles::router())
        .merge(hashtags::router())
        .merge(notifications::router())
        .merge(media::router())
        .merge(health::router())
        .merge(chat::router())
        .merge(streams::router())
        .merge(openapi::router())
}

/// Every route and layer (paths without the trailing slash; see [`app`]).
pub fn router(state: AppState) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(|| async { ApiError::NotFound })
        // One `Router::layer` of the whole stack, outermost first: axum wraps each route in a
        // boxed `Route` per `layer` call and clones that box on every request, so eleven calls
        // cost eleven clones and futures per request (decision 0019; docs/benchmarks-journal.md has the count).
        .layer(
            ServiceBuilder::new()
                // Outermost: hand-written, as a `from_fn` layer boxes and clones the whole
                // stack inside it on every request (decision 0019).
                .layer(Observe {
                    metrics: state.metrics.clone(),
                })
                .layer(cors(&state.config.cors_origins))
                .layer(middleware::from_fn(json_errors))
                // 5xx are logged once, by ApiError (with the error chain), not again here.
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_failure(()),
                )
                .layer(CatchPanicLayer::new())
                .layer(middleware::from_fn(time_limit))
                .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
                .layer(middleware::from_fn(run_to_completion))
                .layer(middleware::from_fn_with_state(
                    state.clone(),
                    client_ip::resolve,
                ))
                .layer(middleware::from_fn_with_state(
                    state.clone(),
                    extract::authenticate,
                ))
                .layer(middleware::from_fn_with_state(state.clone(), limits::limit)),
        )
        .with_state(state)
}

/// The outermost layer: gives each request its trace id ([`crate::trace`]) and records it in
/// the metrics ([`crate::metrics`]).
///
/// The trace id is the caller's W3C `traceparent` trace-id if it sent exactly one valid one,
/// else a random one; it is [`TraceId::current`] while the inner layers are called and polled
/// (for the request's span and its handler's task) and goes in the `x-trace-id` response
/// header. The request counts in `http_requests_total`
/// and `http_request_duration_seconds` by its route's pattern (never its path: ids would make a
/// series per tweet) and its method (only the standard ones: any token is a method to hyper).
/// Applied with `Router::layer`, so it runs once the route has matched ([`MatchedPath`]), and
/// each route's handler of each method gets its own service, which keeps the series of the
/// first (method, status) it answers ([`Series`]) instead of looking them up every time.
#[derive(Clone)]
struct Observe {
    metrics: Arc<Metrics>,
}

impl<S> Layer<S> for Observe {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            metrics: self.metrics.clone(),
            series: Arc::new(OnceLock::new()),
        }
    }
}

/// The service of [`Observe`].
#[derive(Clone)]
struct Observed<S> {
    inner: S,
    metrics: Arc<Metrics>,
    series: Arc<OnceLock<Series>>,
}

/// The request series of one (method, route, status), kept by the service of one route.
struct Series {
    method: &'static str,
    route: Option<MatchedPath>,
    status: u16,
    count: IntCounter,
    duration: Histogram,
}

impl<S> Service<Request> for Observed<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ObservedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let started = Instant::now();
        // Several `traceparent` headers are invalid (W3C Trace Context): a trace of our own.
        let mut parents = req.headers().get_all("traceparent").iter();
        let trace = match (parents.next(), parents.next()) {
            (Some(v), None) => v.to_str().ok().and_then(TraceId::from_traceparent),
            _ => None,
        }
        .unwrap_or_else(TraceId::random);
        const STANDARD: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
        let method = (STANDARD.iter().copied())
            .find(|m| *m == req.method().as_str())
            .unwrap_or("other");
        let route = req.extensions().get::<MatchedPath>().cloned();
        // The inner layers' `call`s (the span is made there) and polls see the trace id as
        // `TraceId::current`: a task-local, not the request's extensions (whose map grows).
        let inner = TraceId::sync_scope(Some(trace), || self.inner.call(req));
        ObservedFuture {
            inner: TraceId::scope(Some(trace), inner),
            started,
            trace,
            method,
            route,
            metrics: self.metrics.clone(),
            series: self.series.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of an [`Observed`] request: records it when the inner service answers.
    struct ObservedFuture<F> {
        #[pin]
        inner: TaskLocalFuture<Option<TraceId>, F>,
        started: Instant,
        trace: TraceId,
        method: &'static str,
        route: Option<MatchedPath>,
        metrics: Arc<Metrics>,
        series: Arc<OnceLock<Series>>,
    }
}

impl<F, E> Future for ObservedFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        let took = this.started.elapsed().as_secs_f64();
        let (method, status) = (*this.method, res.status().as_u16());
        let route = this.route.as_ref().map(MatchedPath::as_str);
        let kept = this.series.get().filter(|s| {
            s.method == method
                && s.status == status
                && s.route.as_ref().map(MatchedPath::as_str) == route
        });
        match kept {
            Some(series) => {
                series.count.inc();
                series.duration.observe(took);
            }
            None => {
                let (count, duration) = this.metrics.request_series(method, route, status);
                count.inc();
                duration.observe(took);
                let _ = this.series.set(Series {
                    method,
                    route: this.route.take(),
                    status,
                    count,
                    duration,
                });
            }
        }
        if let Some(value) = this.trace.header_value() {
            res.headers_mut()
                .insert(HeaderName::from_static("x-trace-id"), value);
        }
        Poll::Ready(Ok(res))
    }
}

/// The span of a request (debug level, as tower-http's default): method, URI, trace id.
fn request_span(req: &Request) -> tracing::Span {
    let trace = TraceId::current();
    tracing::debug_span!(
        "request",
        method = %req.method(),
        uri = %req.uri(),
        trace_id = trace.map(tracing::field::display),
    )
}

/// CORS for browser front ends on the configured origins (`CHIRP_CORS_ORIGINS`); with none, no
/// CORS headers at all (a browser on another origin is then refused).
fn cors(origins: &[String]) -> tower::util::Either<CorsLayer, tower::layer::util::Identity> {
    if origins.is_empty() {
        return tower::util::Either::Right(tower::layer::util::Identity::new());
    }
    // Origins were checked when the configuration was parsed.
    let allowed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    let exposed = [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-trace-id",
    ]
    .map(HeaderName::from_static);
    tower::util::Either::Left(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(allowed))
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers([AUTHORIZATION, CONTENT_TYPE])
            .expose_headers(exposed)
            .max_age(Duration::from_secs(3600)),
    )
}

/// Runs the handler in its own task, so that a client that disconnects (hyper then drops the
/// request's future) or the request timeout can not cancel it halfway: a transaction is never
/// abandoned between two statements (sqlx 0.9 can return such a connection to the pool still
/// inside its transaction), and the post-commit cache step always runs. The client just does
/// not get the answer. A panic in the handler is a 500.
async fn run_to_completion(req: Request, next: Next) -> Response {
    // A spawned task does not inherit task-locals: the trace id goes along explicitly.
    let trace = TraceId::current();
    match tokio::spawn(TraceId::scope(trace, next.run(req))).await {
        Ok(res) => res,
        Err(e) => {
            let trace_id = trace.map(tracing::field::display);
            tracing::error!(error = %e, trace_id, "request handler panicked");
            ApiError::Detail(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal server error.".into(),
            )
            .into_response()
        }
    }
}

/// The time limit of a request: [`REQUEST_TIMEOUT`], or [`LONG_POLL_TIMEOUT`] for chat (whose
/// polls may wait 30 s); past it the client gets a 503. Outside [`run_to_completion`], so the
/// handler itself still runs to its end.
async fn time_limit(req: Request, next: Next) -> Response {
    let limit = if req.uri().path().starts_with("/api/chat/") {
        LONG_POLL_TIMEOUT
    } else {
        REQUEST_TIMEOUT
    };
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(res) => res,
        Err(_) => ApiError::Detail(StatusCode::SERVICE_UNAVAILABLE, "Request timed out.".into())
            .into_response(),
    }
}

/// Gives every error that a layer or axum itself produced (405, 413, timeouts, panics) the JSON
/// body of docs/API.md.
async fn json_errors(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let detail = match status {
        StatusCode::NOT_FOUND => return ApiError::NotFound.into_response(),
        StatusCode::METHOD_NOT_ALLOWED => return ApiError::MethodNotAllowed.into_response(),
        StatusCode::PAYLOAD_TOO_LARGE => "Request body is too large.",
        StatusCode::SERVICE_UNAVAILABLE => "Request timed out.",
        StatusCode::INTERNAL_SERVER_ERROR => "Internal server error.",
        s => s.canonical_reason().unwrap_or("Error."),
    };
    ApiError::Detail(status, detail.to_owned()).into_response()
}

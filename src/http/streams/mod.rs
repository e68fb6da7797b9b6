//! `/api/streaming/`: server-sent events (or NDJSON with `?format=ndjson`) of new tweets:
//! `statuses/sample`, `statuses/filter` and the caller's live newsfeed `user`. The delivery
//! and resume logic is in [`crate::streams`]; this module parses parameters (400 before a
//! stream starts), takes the per-user lease (429), and writes the stream.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HeaderMap, HeaderValue};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cache::Cache;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{Auth, Fields, QueryMap};
use crate::http::serve::ConnectionHandle;
use crate::state::AppState;
use crate::streams::{self, Cursor, Ended, Filter, Predicates, Token};
use crate::time;

mod session;

use session::{Catch, Session};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sample))
        .routes(routes!(filter_get, filter_post))
        .routes(routes!(user))
        .routes(routes!(demo))
}

/// The `format` parameter of every stream.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // read by the handlers from [`QueryMap`] ([`format`]); this is its schema
struct FormatParam {
    /// `sse` (server-sent events; also when absent or empty) or `ndjson` (one JSON object per
    /// line).
    #[param(inline)]
    format: Option<Format>,
}

/// The predicates of `statuses/filter`: at least one; a tweet that matches any is sent.
#[derive(IntoParams, ToSchema)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // read by the handlers as [`QueryMap`] or [`Fields`]; this is their schema
struct FilterParams {
    /// At most 400 comma-separated phrases of at most 60 characters; a phrase matches when all
    /// its space-separated words occur in the text (any case). In a JSON body, also an array.
    track: Option<String>,
    /// At most 5000 comma-separated positive user ids: tweets by them. In a JSON body, also an
    /// array.
    follow: Option<String>,
    /// At most 25 boxes `sw_lon,sw_lat,ne_lon,ne_lat,...` (lon -180–180, lat -90–90, sw not
    /// north or east of ne): tweets whose coordinates fall in a box, or whose place's bbox
    /// overlaps one. In a JSON body, also an array.
    locations: Option<String>,
}

/// A page that shows the caller's live timeline in a browser.
///
/// `/demo/`: it reads `streaming/user` with a token pasted into it.
#[utoipa::path(get, path = "/demo", tag = "streams",
    responses((status = 200, body = String, content_type = "text/html",
        description = "An HTML page")))]
async fn demo() -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        include_str!("demo.html"),
    )
}

/// Most `track` phrases, `follow` ids and `locations` boxes of one filter (Twitter v1.1's).
pub const MAX_TRACK: usize = 400;
pub const MAX_FOLLOW: usize = 5000;
pub const MAX_BOXES: usize = 25;
/// Most characters of one `track` phrase.
pub const MAX_PHRASE_CHARS: usize = 60;

/// What every stream's 200 answers.
const STREAM: &str = "A stream: server-sent events, or NDJSON with `format=ndjson`. Events: \
    `{\"event\": \"tweet\", \"tweet\": Tweet}`, `{\"event\": \"delete\", \"tweet_id\", \
    \"user_id\"}`, and last `{\"event\": \"warning\", \"code\": \"FALLING_BEHIND\", \
    \"message\"}` or `{\"event\": \"disconnect\", \"code\": \"UNAVAILABLE\" | \"SHUTDOWN\", \
    \"message\"}`; `:` heartbeats (empty lines in NDJSON). SSE `id:` is the tweet id, or the \
    resume token on `streaming/user` (whose NDJSON tweet lines carry it as `\"id\"`).";

/// How long a new stream waits for this process's subscription to stand before a 503.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(3);

/// Chunks a stream's body holds for a client that is not reading.
const BODY_CHUNKS: usize = 16;

/// Deletes a stream remembers, to drop a tweet event that arrives after its delete (the two
/// are published by different writers).
const DELETES_KEPT: usize = 256;

/// How far back a resume token or `since` may reach.
const MAX_RESUME_AGE: chrono::TimeDelta = chrono::TimeDelta::days(30);

/// How the events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[schema(as = StreamFormat, rename_all = "lowercase")]
enum Format {
    Sse,
    Ndjson,
}

fn format(params: &HashMap<String, String>) -> ApiResult<Format> {
    match params.get("format").map(|f| f.trim()) {
        None | Some("" | "sse") => Ok(Format::Sse),
        Some("ndjson") => Ok(Format::Ndjson),
        Some(_) => Err(ApiError::field("format", "Use sse or ndjson.")),
    }
}

/// A sample of all new tweets.
///
/// Deterministic per caller: a tweet is sent when `id mod 100` is one of the `percent`
/// consecutive residues from `(caller_id × 37) mod 100`; deletes of sent tweets too.
#[utoipa::path(get, path = "/api/streaming/statuses/sample", tag = "streams",
    params(
        FormatParam,
        ("percent" = Option<i32>, Query, minimum = 1, maximum = 100,
            description = "How many hundredths of the tweets to send (default 1)"),
    ),
    security(("bearer" = [])),
    responses((status = 200, description = STREAM,
        content((String = "text/event-stream"), (String = "application/x-ndjson")))))]
async fn sample(
    State(state): State<AppState>,
    auth: Auth,
    conn: ConnectionHandle,
    query: QueryMap,
) -> ApiResult<Response> {
    let format = format(&query.0)?;
    let percent = match query.0.get("percent").map(|p| p.trim()) {
        None | Some("") => 1,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| ApiError::field("percent", "An integer from 1 to 100 is required."))?,
    };
    open(
        &state,
        &auth,
        conn,
        Some(Filter::sample(auth.user_id, percent)),
        format,
        None,
    )
    .await
}

/// New tweets that match a filter.
///
/// Tweets that match any of the predicates, as they are posted, and deletes of tweets that
/// matched.
#[utoipa::path(get, path = "/api/streaming/statuses/filter", tag = "streams",
    params(FormatParam, FilterParams),
    security(("bearer" = [])),
    responses((status = 200, description = STREAM,
        content((String = "text/event-stream"), (String = "application/x-ndjson")))))]
async fn filter_get(
    State(state): State<AppState>,
    auth: Auth,
    conn: ConnectionHandle,
    query: QueryMap,
) -> ApiResult<Response> {
    open_filter(&state, &auth, conn, &query.0).await
}

/// New tweets that match a filter given in the body.
///
/// As `GET`, with the predicates in a form or JSON body (lists may be JSON arrays); a body
/// field wins over the query parameter of the same name.
#[utoipa::path(post, path = "/api/streaming/statuses/filter", tag = "streams",
    params(FormatParam),
    request_body(content = FilterParams,
        description = "The predicates (the query may carry them too; a body field wins)"),
    security(("bearer" = [])),
    responses((status = 200, description = STREAM,
        content((String = "text/event-stream"), (String = "application/x-ndjson")))))]
async fn filter_post(
    State(state): State<AppState>,
    auth: Auth,
    conn: ConnectionHandle,
    query: QueryMap,
    fields: Fields,
) -> ApiResult<Response> {
    let mut params = query.0;
    for (name, value) in fields.0 {
        let text = match value {
            Value::String(s) => s,
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
            Value::Null => continue,
            other => other.to_string(),
        };
        params.insert(name, text);
    }
    open_filter(&state, &auth, conn, &params).await
}

/// Opens `statuses/filter` with `params` (from the query, and for POST the body).
async fn open_filter(
    state: &AppState,
    auth: &Auth,
    conn: ConnectionHandle,
    params: &HashMap<String, String>,
) -> ApiResult<Response> {
    let format = format(params)?;
    let filter = predicates(params)?;
    open(state, auth, conn, Some(Filter::Match(filter)), format, None).await
}

/// `track`, `follow` and `locations`, validated; at least one is required.
fn predicates(params: &HashMap<String, String>) -> ApiResult<Predicates> {
    let list = |name: &str| -> Vec<String> {
        params
            .get(name)
            .map(|v| {
                v.split(',')
                    .map(|p| p.trim().to_owned())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut p = Predicates::default();
    let track = list("track");
    if track.len() > MAX_TRACK {
        return Err(ApiError::field(
            "track",
            format!("At most {MAX_TRACK} phrases."),
        ));
    }
    for phrase in track {
        if phrase.chars().count() > MAX_PHRASE_CHARS {
            return Err(ApiError::field(
                "track",
                format!("A phrase has at most {MAX_PHRASE_CHARS} characters."),
            ));
        }
        let words: Vec<String> = streams::words(&phrase).collect();
        if words.is_empty() {
            return Err(ApiError::field(
                "track",
                format!("The phrase {phrase:?} has no words."),
            ));
        }
        p.track.push(words);
    }
    let follow = list("follow");
    if follow.len() > MAX_FOLLOW {
        return Err(ApiError::field(
            "follow",
            format!("At most {MAX_FOLLOW} user ids."),
        ));
    }
    let ids: Option<HashSet<i64>> = follow
        .iter()
        .map(|id| id.parse::<i64>().ok().filter(|id| *id > 0))
        .collect();
    p.follow = ids.ok_or_else(|| ApiError::field("follow", "User ids are positive integers."))?;
    let numbers: Option<Vec<f64>> = list("locations")
        .iter()
        .map(|n| n.parse::<f64>().ok().filter(|n| n.is_finite()))
        .collect();
    let numbers =
        numbers.ok_or_else(|| ApiError::field("locations", "Boxes are lists of numbers."))?;
    if numbers.len() % 4 != 0 {
        return Err(ApiError::field(
            "locations",
            "Each box is sw_lon,sw_lat,ne_lon,ne_lat.",
        ));
    }
    if numbers.len() / 4 > MAX_BOXES {
        return Err(ApiError::field(
            "locations",
            format!("At most {MAX_BOXES} boxes."),
        ));
    }
    for b in numbers.chunks_exact(4) {
        let lon_ok = |x: f64| (-180.0..=180.0).contains(&x);
        let lat_ok = |x: f64| (-90.0..=90.0).contains(&x);
        if !(lon_ok(b[0]) && lon_ok(b[2]) && lat_ok(b[1]) && lat_ok(b[3]))
            || b[0] > b[2]
            || b[1] > b[3]
        {
            return Err(ApiError::field(
                "locations",
                "A box is sw_lon,sw_lat,ne_lon,ne_lat with lon in -180..180, lat in -90..90 and sw not north or east of ne.",
            ));
        }
        p.locations.push([b[0], b[1], b[2], b[3]]);
    }
    if p.track.is_empty() && p.follow.is_empty() && p.locations.is_empty() {
        return Err(ApiError::field(
            "track",
            "Give at least one of track, follow or locations.",
        ));
    }
    Ok(p)
}

/// The caller's live newsfeed.
///
/// Every tweet as it enters the caller's newsfeed and deletes of tweets in it. With
/// `Last-Event-ID` or `since`, first everything in the newsfeed after it (at most 30 days
/// back), then live.
#[utoipa::path(get, path = "/api/streaming/user", tag = "streams",
    params(
        FormatParam,
        ("since" = Option<String>, Query, format = DateTime,
            description = "Resume after this `NewsFeed.created_at` (RFC 3339)"),
        ("Last-Event-ID" = Option<String>, Header, nullable = false,
            description = "Resume after this event: its resume token (wins over `since`)"),
    ),
    security(("bearer" = [])),
    responses((status = 200, description = STREAM,
        content((String = "text/event-stream"), (String = "application/x-ndjson")))))]
async fn user(
    State(state): State<AppState>,
    auth: Auth,
    conn: ConnectionHandle,
    query: QueryMap,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let format = format(&query.0)?;
    let resume =
        match headers.get("last-event-id") {
            Some(token) => {
                Some(token.to_str().ok().and_then(Token::parse).ok_or_else(|| {
                    ApiError::field("Last-Event-ID", "Not a token of this stream.")
                })?)
            }
            None => None,
        };
    let resume = match (resume, query.0.get("since")) {
        (Some(cursor), _) => Some(cursor),
        (None, Some(since)) => {
            let since = time::parse_cursor(since)
                .ok_or_else(|| ApiError::field("since", "A valid timestamp is required."))?;
            let (base, _) =
                crate::newsfeeds::newest_entry(&state.db, auth.user_id, &[], Some(since)).await?;
            Some(Token::Current(Cursor::after(base, time::to_micros(since))))
        }
        (None, None) => None,
    };
    if let Some(made) = resume.as_ref().map(Token::made_us) {
        let floor = time::from_micros(made);
        let now = chrono::Utc::now();
        if floor < now - MAX_RESUME_AGE || floor > now + chrono::TimeDelta::minutes(1) {
            let field = if headers.contains_key("last-event-id") {
                "Last-Event-ID"
            } else {
                "since"
            };
            return Err(ApiError::field(
                field,
                "A stream resumes from at most 30 days back (and not from the future).",
            ));
        }
    }
    open(&state, &auth, conn, None, format, Some(resume)).await
}

/// Opens a stream for `auth`: `filter` for `statuses/*`, or `None` with `user` =
/// `Some(resume)` for `streaming/user`.
async fn open(
    state: &AppState,
    auth: &Auth,
    connection: ConnectionHandle,
    filter: Option<Filter>,
    format: Format,
    user: Option<Option<Token>>,
) -> ApiResult<Response> {
    let stop = state.shutdown.subscribe();
    let unavailable = || {
        ApiError::Detail(
            StatusCode::SERVICE_UNAVAILABLE,
            "Streaming is unavailable right now (Redis is down or the server is stopping); retry shortly.".into(),
        )
    };
    if *stop.borrow() {
        return Err(unavailable());
    }
    let hub = state.streams.clone();
    if !streams::Hub::ensure_subscribed(&state.subscriber, &state.cache, &stop, SUBSCRIBE_WAIT)
        .await
    {
        return Err(unavailable());
    }
    let generation = hub.generation();
    let lease = Lease {
        cache: state.cache.clone(),
        user_id: auth.user_id,
        id: format!("{:016x}", rand::random::<u64>()),
        duration: Duration::from_secs(state.config.stream_heartbeat_secs * 3),
    };
    let limit = state.config.streams_per_user as usize;
    match state
        .cache
        .stream_lease(lease.user_id, &lease.id, limit, lease.duration, false)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            return Err(ApiError::Detail(
                StatusCode::TOO_MANY_REQUESTS,
                format!("At most {limit} concurrent streams per user; close one first."),
            ));
        }
        Err(_) => return Err(unavailable()),
    }
    let (registration, rx) =
        hub.register(auth.user_id, filter, state.config.stream_buffer as usize);
    let is_user = user.is_some();
    // The pull sources the user follows, before the newest entry is read: a pulled tweet that
    // commits later reaches the stream live.
    let authors = match is_user {
        true => {
            let (authors, follows) = load_pull_follows(state, auth.user_id).await?;
            registration.client.set_pull_follows(follows);
            authors
        }
        false => Default::default(),
    };
    // Read after the registration: a row that commits later is published to it.
    let (cursor, catch_up) = match user {
        None => (None, None),
        Some(Some(Token::Current(cursor))) => (Some(cursor), Some(Catch::Newsfeed)),
        Some(start) => {
            let (base, at) =
                crate::newsfeeds::newest_entry(&state.db, auth.user_id, &authors, None).await?;
            let cursor = Cursor::after(base, at.map_or(0, time::to_micros))
                .made_at(time::to_micros(chrono::Utc::now()));
            let catch_up = match start {
                Some(Token::Legacy {
                    base,
                    floor_us,
                    skip,
                }) => Some(Catch::Legacy {
                    base,
                    floor_us,
                    skip,
                    after: None,
                }),
                _ => None,
            };
            (Some(cursor), catch_up)
        }
    };
    // The subscription broke between the check above and the registration: `on_lost` did
    // not see this client, so end it here.
    if hub.generation() != generation || !state.subscriber.subscribed() {
        registration.client.end(Ended::Unavailable);
    }
    let every = Duration::from_secs(state.config.stream_heartbeat_secs);
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut session = Session {
        state: state.clone(),
        user_id: auth.user_id,
        registration,
        rx,
        format,
        heartbeat,
        every,
        stop,
        cursor,
        catch_up,
        pending: VecDeque::new(),
        deleted: VecDeque::new(),
        lease,
        connection,
        done: false,
    };
    // The stream's place as its first `id:` (SSE, `streaming/user`): an `id:` without data sets
    // an EventSource's last event id without an event, so a client whose connection ends
    // before any tweet resumes from where it opened instead of from a new one's start (which
    // would skip what came between). Not for a legacy token, whose catch-up the cursor does
    // not describe.
    let first = match (format, &session.cursor, &session.catch_up) {
        (Format::Sse, Some(cursor), None | Some(Catch::Newsfeed)) => {
            Bytes::from(format!(":ok\nretry: 2000\nid: {}\n\n", cursor.token()))
        }
        (Format::Sse, ..) => Bytes::from_static(b":ok\nretry: 2000\n\n"),
        (Format::Ndjson, ..) => Bytes::from_static(b"\n"),
    };
    session.pending.push_back(first);
    tracing::debug!(user_id = auth.user_id, is_user, "stream opened");
    // The session runs in its own task and hands chunks to the body through a short queue, so
    // it notices a client that stopped reading (hyper polls the body only when the socket
    // takes bytes) and ends it, leaving only what is queued here and in the kernel.
    let (chunks, chunks_rx) = mpsc::channel::<Bytes>(BODY_CHUNKS);
    let (trailer, trailer_rx) = oneshot::channel::<Bytes>();
    tokio::spawn(session.pump(chunks, trailer));
    let body = Body::from_stream(futures_util::stream::unfold(
        (chunks_rx, Some(trailer_rx)),
        |(mut chunks, trailer)| async move {
            if let Some(chunk) = chunks.recv().await {
                return Some((Ok::<_, Infallible>(chunk), (chunks, trailer)));
            }
            let last = trailer?.await.ok()?;
            Some((Ok(last), (chunks, None)))
        },
    ));
    let content_type = match format {
        Format::Sse => "text/event-stream",
        Format::Ndjson => "application/x-ndjson",
    };
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (CONNECTION, HeaderValue::from_static("close")),
            (
                HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response())
}

/// The pull sources ([`crate::hybrid`]), and those that user `user_id` follows: the pulled
/// tweets its hub offers its `streaming/user` stream ([`streams::PullFollows`]).
async fn load_pull_follows(
    state: &AppState,
    user_id: i64,
) -> sqlx::Result<(Arc<Vec<i64>>, streams::PullFollows)> {
    let authors = state.pull_authors.current(&state.db).await?;
    let follows = crate::newsfeeds::pull_follows(&state.db, user_id, &authors).await?;
    let follows = streams::PullFollows::new(authors.clone(), &follows);
    Ok((authors, follows))
}

/// A stream's lease on one of its user's [`crate::config::Config::streams_per_user`] slots;
/// released (in the background) when the stream ends. A release that fails (Redis is down
/// or marked down for a moment, as after a fault) is tried again every
/// [`RELEASE_RETRY`] until it succeeds or the lease has expired on its own: a user whose
/// streams ended during an outage is not refused new ones (429) until their leases expire.
struct Lease {
    cache: Cache,
    user_id: i64,
    id: String,
    duration: Duration,
}

/// How long a stream's lease release waits before it tries again.
const RELEASE_RETRY: Duration = Duration::from_millis(250);

impl Drop for Lease {
    fn drop(&mut self) {
        let cache = self.cache.clone();
        let (user_id, id) = (self.user_id, std::mem::take(&mut self.id));
        let until = tokio::time::Instant::now() + self.duration;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                while cache.release_stream(user_id, &id).await.is_err()
                    && tokio::time::Instant::now() + RELEASE_RETRY < until
                {
                    tokio::time::sleep(RELEASE_RETRY).await;
                }
            });
        }
    }
}

//! Rate limits (docs/API.md, "Rate limits"): per user (bearer) or per client IP (anonymous, and
//! always for signup and login), shared by every chirp process through Redis
//! ([`crate::cache::limits`], GCRA in one Lua call), falling back to a per-process limiter when
//! Redis is down. Over a limit: 429 with `Retry-After`; every limited response carries
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the rate nearest to
//! exhaustion.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use sha2::Digest as _;

use crate::cache::limits::{Decision, Rate};
pub use crate::config::{Class, RateLimits};
use crate::error::ApiError;
use crate::http::client_ip::ClientIp;
use crate::http::extract::Auth;
use crate::state::AppState;

/// The class of a request; `None` for routes that are never limited (health checks).
fn class_of(method: &Method, path: &str) -> Option<Class> {
    let path = path.trim_end_matches('/');
    if path == "/livez" || path == "/healthz" {
        return None;
    }
    Some(match *method {
        Method::GET | Method::HEAD | Method::OPTIONS => Class::Read,
        Method::POST if path == "/api/accounts/signup" || path == "/api/accounts/login" => {
            Class::Auth
        }
        Method::POST if path == "/api/tweets" => Class::Tweet,
        _ => Class::Write,
    })
}

/// Middleware (after authentication): counts the request and answers 429 over a limit.
pub async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &state.config.rate_limits;
    let Some(class) = class_of(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    let Some(rates) = limits.rates(class) else {
        return next.run(req).await;
    };
    let user = req.extensions().get::<Auth>().map(|a| a.user_id);
    let subject = match (class, user) {
        (Class::Auth, _) | (_, None) => ClientIp::subject_of(ClientIp::of(&req)),
        (_, Some(id)) => format!("u{id}"),
    };
    let decision = decide(&state, &subject, class, rates).await;
    let mut res = if decision.allowed {
        next.run(req).await
    } else {
        too_many(&decision)
    };
    set_headers(&mut res, rates, &decision);
    res
}

/// Where a client stands with its `failed` limit before a token lookup ([`standing`]).
pub enum Standing {
    /// Look the token up; count a failure afterwards ([`failed`]).
    Clear,
    /// Over the limit just now: this 429 is the answer, unless Redis knows the token.
    Refused(Response),
    /// Over the limit in the last minute: count the lookup before it runs ([`charge`]),
    /// unless Redis knows the token.
    Suspect,
}

/// Where the client stands before a token lookup that may reach Postgres, without a round
/// trip (tokens held in the process's memory are answered before this is asked). A client
/// that is not [`Standing::Clear`] still gets the tokens Redis knows (valid users sharing an
/// address with a token guesser: `http::extract::authenticate`).
pub fn standing(state: &AppState, client: Option<ClientIp>) -> Standing {
    let Some(rates) = state.config.rate_limits.rates(Class::Failed) else {
        return Standing::Clear;
    };
    match state.refused.state(&ClientIp::subject_of(client)) {
        Refusal::None => Standing::Clear,
        Refusal::Suspect => Standing::Suspect,
        Refusal::Until(left) => Standing::Refused(refusal(rates, left)),
    }
}

/// The 429 of a subject refused for `left` more ([`Refused`]).
fn refusal(rates: &[Rate], left: std::time::Duration) -> Response {
    let us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX);
    let decision = Decision {
        allowed: false,
        rate: 0,
        remaining: 0,
        reset_us: us,
        retry_after_us: us,
    };
    let mut res = too_many(&decision);
    set_headers(&mut res, rates, &decision);
    res
}

/// The subject of username `name`'s `login` limit: `n` and 16 hex digits of the SHA-256 of its
/// lowercase form (a hash tag needs no escaping, and no Redis key names a username).
pub fn login_subject(name: &str) -> String {
    let digest = sha2::Sha256::digest(name.trim().to_lowercase().as_bytes());
    format!("n{}", crate::cache::keys::hex(&digest[..8]))
}

/// Before a login's password check: the 429 to answer while the username's `login` limit
/// refuses it (a failure went over it within the retry time). This process's memory, no round
/// trip: another process learns it at its own next failure for that username (so a guesser
/// spread over `n` processes gets at most `n` more tries per refusal). The owner of a username
/// under attack waits too, at most the retry time (OWASP's trade-off: throttle, not lock).
pub fn login_refused(state: &AppState, subject: &str) -> Option<Response> {
    let rates = state.config.rate_limits.rates(Class::Login)?;
    match state.refused.state(subject) {
        Refusal::Until(left) => Some(refusal(rates, left)),
        Refusal::None | Refusal::Suspect => None,
    }
}

/// After a login failed (`error`, a 400): counts it against the username's `login` limit (one
/// round trip) and answers `error`, or a 429 once over it, after which the username's logins
/// are refused until the limit allows one again ([`login_refused`]).
pub async fn login_failed(state: &AppState, subject: &str, error: ApiError) -> Response {
    match charge_as(state, subject, Class::Login).await {
        Ok(()) => error.into_response(),
        Err(too_many) => too_many,
    }
}

/// Counts a failed authentication against the client's `failed` limit (one round trip): after
/// the lookup ([`failed`]), or before it for a suspect client, so a guesser's lookups stay
/// within its limit however many it sends at once. Going over refuses the client's unknown
/// tokens until the limit allows one again ([`standing`]).
///
/// # Errors
/// The 429 to answer when this one is over the limit.
pub async fn charge(state: &AppState, client: Option<ClientIp>) -> Result<(), Response> {
    charge_as(state, &ClientIp::subject_of(client), Class::Failed).await
}

/// Counts one failure of `subject` against `class`; over it, remembers the refusal
/// ([`Refused`]) and returns the 429.
async fn charge_as(state: &AppState, subject: &str, class: Class) -> Result<(), Response> {
    let Some(rates) = state.config.rate_limits.rates(class) else {
        return Ok(());
    };
    let decision = decide(state, subject, class, rates).await;
    if decision.allowed {
        return Ok(());
    }
    state.refused.refuse(
        subject,
        std::time::Duration::from_micros(decision.retry_after_us),
    );
    let mut res = too_many(&decision);
    set_headers(&mut res, rates, &decision);
    Err(res)
}

/// After a failed authentication (`error`, a 401): counts it against the client's `failed`
/// limit (unless `charged`: [`charge`] did) and answers `error`, or a 429 once over the
/// limit, after which the client's unknown tokens are refused until the limit allows one
/// again, and counted before their lookup for a minute ([`standing`]).
pub async fn failed(
    state: &AppState,
    client: Option<ClientIp>,
    charged: bool,
    error: ApiError,
) -> Response {
    if charged {
        return error.into_response();
    }
    match charge(state, client).await {
        Ok(()) => error.into_response(),
        Err(too_many) => too_many,
    }
}

/// Counts one request of `subject` in Redis, or in this process while Redis is down.
async fn decide(state: &AppState, subject: &str, class: Class, rates: &[Rate]) -> Decision {
    match state.cache.gcra(subject, class.name(), rates).await {
        Ok(d) => d,
        Err(_) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            state.limiter.check(subject, class.name(), rates, now)
        }
    }
}

fn too_many(decision: &Decision) -> Response {
    let mut res = ApiError::Detail(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests, try again later.".into(),
    )
    .into_response();
    res.headers_mut().insert(
        HeaderName::from_static("retry-after"),
        HeaderValue::from(ceil_secs(decision.retry_after_us).max(1)),
    );
    res
}

/// Clients over their `failed` limit, as this process saw them: refused until the limit lets
/// one more through, then suspect for [`Refused::SUSPECT`] (their lookups are counted before
/// they run). A token guesser so costs one Redis round trip per refusal period and process
/// while refused, and at most its limit in lookups afterwards. Holds at most
/// [`Refused::CAPACITY`] clients (the expired ones are dropped first; past that, all).
#[derive(Debug, Default)]
pub struct Refused {
    /// Client → (refused until, suspect until).
    until: std::sync::Mutex<
        std::collections::HashMap<String, (std::time::Instant, std::time::Instant)>,
    >,
}

/// How [`Refused`] sees a client now.
enum Refusal {
    None,
    Until(std::time::Duration),
    Suspect,
}

impl Refused {
    /// Most clients remembered.
    pub const CAPACITY: usize = 100_000;
    /// How long a client that went over its limit stays suspect.
    pub const SUSPECT: std::time::Duration = std::time::Duration::from_secs(60);

    fn state(&self, subject: &str) -> Refusal {
        let until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        let Some((refused, suspect)) = until.get(subject) else {
            return Refusal::None;
        };
        let now = std::time::Instant::now();
        match refused.checked_duration_since(now) {
            Some(left) if !left.is_zero() => Refusal::Until(left),
            _ if *suspect > now => Refusal::Suspect,
            _ => Refusal::None,
        }
    }

    fn refuse(&self, subject: &str, period: std::time::Duration) {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if until.len() >= Self::CAPACITY {
            until.retain(|_, (_, suspect)| *suspect > now);
            if until.len() >= Self::CAPACITY {
                until.clear();
            }
        }
        until.insert(subject.to_owned(), (now + period, now + Self::SUSPECT));
    }
}

fn ceil_secs(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

fn set_headers(res: &mut Response, rates: &[Rate], d: &Decision) {
    let limit = rates.get(d.rate).map_or(0, |r| r.count);
    let headers = res.headers_mut();
    headers.insert(
        HeaderName::from_static("x-ratelimit-limit"),
        HeaderValue::from(limit),
    );
    headers.insert(
        HeaderName::from_static("x-ratelimit-remaining"),
        HeaderValue::from(d.remaining),
    );
    headers.insert(
        HeaderName::from_static("x-ratelimit-reset"),
        HeaderValue::from(ceil_secs(d.reset_us)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_fall_in_classes() {
        assert_eq!(class_of(&Method::POST, "/api/tweets/"), Some(Class::Tweet));
        assert_eq!(
            class_of(&Method::POST, "/api/accounts/login"),
            Some(Class::Auth)
        );
        assert_eq!(
            class_of(&Method::DELETE, "/api/tweets/1/"),
            Some(Class::Write)
        );
        assert_eq!(class_of(&Method::GET, "/api/newsfeeds/"), Some(Class::Read));
        assert_eq!(class_of(&Method::GET, "/livez"), None);
    }
}

//! Extractors that turn every malformed input into the JSON errors of docs/API.md.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Multipart, Path, RawQuery, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use crate::accounts;
use crate::blocks::{self, Hidden};
use crate::cache::deferred::Deferred;
use crate::error::{ApiError, FieldErrors};
use crate::http::client_ip::ClientIp;
use crate::http::limits;
use crate::media::{self, Upload};
use crate::pagination::{PageQuery, PageRequest};
use crate::state::AppState;
use crate::users::{self, User};

/// A request body's fields, from JSON (an object), an HTML form or `multipart/form-data` (text
/// fields, and files in [`Fields::1`]); an empty body has none.
///
/// Rejections: 413 over the route's body limit, 415 for another media type, 400 for a
/// malformed body.
#[derive(Debug, Default)]
pub struct Fields(pub Map<String, Value>, pub Vec<Upload>);

impl<S: Send + Sync> FromRequest<S> for Fields {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if content_type == "multipart/form-data" {
            return multipart(req, state).await;
        }
        // Routes that take uploads raise the body limit for multipart bodies only: JSON and form
        // bodies keep the small one everywhere.
        let body = axum::body::to_bytes(req.into_body(), super::MAX_BODY_BYTES)
            .await
            .map_err(|e| {
                if e.into_inner()
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    ApiError::Detail(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "Request body is too large.".into(),
                    )
                } else {
                    ApiError::field("body", "The request body could not be read.")
                }
            })?;
        if content_type == "application/json" || content_type.ends_with("+json") {
            match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(map)) => Ok(Fields(map, Vec::new())),
                Ok(_) => Err(ApiError::field("body", "Expected a JSON object.")),
                Err(e) => Err(ApiError::field("body", format!("JSON parse error: {e}"))),
            }
        } else if content_type == "application/x-www-form-urlencoded" {
            let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(&body)
                .map_err(|_| ApiError::field("body", "Malformed form data."))?;
            Ok(Fields(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
                Vec::new(),
            ))
        } else if body.is_empty() {
            Ok(Fields::default())
        } else {
            Err(ApiError::Detail(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Unsupported media type \"{content_type}\" in request."),
            ))
        }
    }
}

/// Reads a `multipart/form-data` body: parts with a file name (or a non-text content type) are
/// uploads, read up to [`media::MAX_FILE_BYTES`] each; the others are text fields.
async fn multipart<S: Send + Sync>(req: Request, state: &S) -> Result<Fields, ApiError> {
    let malformed = || ApiError::field("body", "Malformed multipart body.");
    let mut form = Multipart::from_request(req, state)
        .await
        .map_err(|_| malformed())?;
    let mut fields = Fields::default();
    loop {
        let next = form.next_field().await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::Detail(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Request body is too large.".into(),
                )
            } else {
                malformed()
            }
        })?;
        let Some(mut field) = next else { break };
        let name = field.name().unwrap_or_default().to_owned();
        let is_file = field.file_name().is_some()
            || field
                .content_type()
                .is_some_and(|t| !t.starts_with("text/"));
        if !is_file {
            // A text field is held to the JSON body limit, read chunk by chunk (the route's
            // body limit is the uploads' one).
            let mut text = Vec::new();
            while let Some(chunk) = field.chunk().await.map_err(|_| malformed())? {
                if text.len() + chunk.len() > super::MAX_BODY_BYTES {
                    return Err(ApiError::field(
                        &name,
                        format!(
                            "A text field may be at most {} KiB.",
                            super::MAX_BODY_BYTES >> 10
                        ),
                    ));
                }
                text.extend_from_slice(&chunk);
            }
            let text = String::from_utf8(text).map_err(|_| malformed())?;
            fields.0.insert(name, Value::String(text));
            continue;
        }
        let mut bytes = Vec::new();
        let mut too_large = false;
        while let Some(chunk) = field.chunk().await.map_err(|_| malformed())? {
            if bytes.len() + chunk.len() > media::MAX_FILE_BYTES {
                too_large = true;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        fields.1.push(Upload {
            field: name,
            bytes: (!too_large).then(|| Bytes::from(bytes)),
        });
    }
    Ok(fields)
}

impl Fields {
    /// Whether the field was sent at all (even as null).
    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// An optional text field: `None` if absent or null; a non-string is an error, and so is a
    /// string with U+0000, which Postgres can not store in text (it was a 500; Django REST
    /// framework refuses it the same way).
    pub fn text(&self, name: &str, errors: &mut FieldErrors) -> Option<String> {
        self.string(name, false, errors)
    }

    fn string(&self, name: &str, nul_ok: bool, errors: &mut FieldErrors) -> Option<String> {
        match self.0.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !nul_ok && s.contains('\0') => {
                errors
                    .entry(name.into())
                    .or_default()
                    .push("Null characters are not allowed.".into());
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                errors
                    .entry(name.into())
                    .or_default()
                    .push("Not a valid string.".into());
                None
            }
        }
    }

    /// Whether `name` was sent with a value; if not, records "This field is required.".
    /// `empty_is_missing`: an empty or blank string counts as not sent (for ids).
    fn present(&self, name: &str, empty_is_missing: bool, errors: &mut FieldErrors) -> bool {
        let missing = match self.0.get(name) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => empty_is_missing && s.trim().is_empty(),
            Some(_) => false,
        };
        if missing {
            errors
                .entry(name.into())
                .or_default()
                .push("This field is required.".into());
        }
        !missing
    }

    /// A required text field.
    pub fn required_text(&self, name: &str, errors: &mut FieldErrors) -> Option<String> {
        self.present(name, false, errors)
            .then(|| self.text(name, errors))
            .flatten()
    }

    /// A required secret (a password): [`Fields::required_text`], but U+0000 is allowed, as it
    /// always was: a secret is hashed, never stored as text.
    pub fn required_secret(&self, name: &str, errors: &mut FieldErrors) -> Option<String> {
        self.present(name, false, errors)
            .then(|| self.string(name, true, errors))
            .flatten()
    }

    /// A required id: a JSON integer or a decimal string.
    pub fn required_id(&self, name: &str, errors: &mut FieldErrors) -> Option<i64> {
        self.present(name, true, errors)
            .then(|| self.optional_id(name, errors))
            .flatten()
    }

    /// A required boolean: JSON `true`/`false`, or the strings `true`/`false`/`1`/`0` (forms).
    pub fn required_bool(&self, name: &str, errors: &mut FieldErrors) -> Option<bool> {
        if !self.present(name, true, errors) {
            return None;
        }
        let parsed = match self.0.get(name) {
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "1" => Some(true),
                "false" | "0" => Some(false),
                _ => None,
            },
            _ => None,
        };
        if parsed.is_none() {
            errors
                .entry(name.into())
                .or_default()
                .push("Must be a valid boolean.".into());
        }
        parsed
    }

    /// An optional id: `None` if absent, null or empty; otherwise as [`Fields::required_id`].
    pub fn optional_id(&self, name: &str, errors: &mut FieldErrors) -> Option<i64> {
        let parsed = match self.0.get(name) {
            None | Some(Value::Null) => return None,
            Some(Value::String(s)) if s.trim().is_empty() => return None,
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(s)) => s.trim().parse().ok(),
            Some(_) => None,
        };
        if parsed.is_none() {
            errors
                .entry(name.into())
                .or_default()
                .push("A valid integer is required.".into());
        }
        parsed
    }

    /// An optional finite number in `min..=max`: a JSON number or a decimal string; `None` if
    /// absent, null or empty.
    pub fn optional_number(
        &self,
        name: &str,
        (min, max): (f64, f64),
        errors: &mut FieldErrors,
    ) -> Option<f64> {
        let parsed = match self.0.get(name) {
            None | Some(Value::Null) => return None,
            Some(Value::String(s)) if s.trim().is_empty() => return None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            Some(_) => None,
        };
        match parsed {
            Some(x) if x.is_finite() && (min..=max).contains(&x) => Some(x),
            _ => {
                errors
                    .entry(name.into())
                    .or_default()
                    .push(format!("A number from {min} to {max} is required."));
                None
            }
        }
    }
}

/// The query string as a map. Rejection: 400 for a malformed query string.
#[derive(Debug, Default)]
pub struct QueryMap(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let RawQuery(raw) = RawQuery::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::field("query", "Malformed query string."))?;
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
            .map_err(|_| ApiError::field("query", "Malformed query string."))?;
        Ok(QueryMap(pairs.into_iter().collect()))
    }
}

impl QueryMap {
    /// The pagination parameters, validated.
    pub fn page(&self) -> Result<PageRequest, ApiError> {
        PageQuery {
            lt: self.0.get("created_at__lt").cloned(),
            gt: self.0.get("created_at__gt").cloned(),
            page_size: self.0.get("page_size").cloned(),
        }
        .parse()
    }

    /// The page of an oldest-first listing (a context view's descendants), where
    /// `created_at__gt` pages forward: like [`QueryMap::page`], but always `page_size` items.
    pub fn forward_page(&self) -> Result<PageRequest, ApiError> {
        let req = self.page()?;
        let sized = PageQuery {
            lt: None,
            gt: None,
            page_size: self.0.get("page_size").cloned(),
        }
        .parse()?;
        Ok(PageRequest {
            limit: sized.limit,
            ..req
        })
    }

    /// A required integer parameter (400 naming it if missing or malformed).
    pub fn required_id(&self, name: &str) -> Result<i64, ApiError> {
        match self.0.get(name).map(|v| v.trim()) {
            None | Some("") => Err(ApiError::field(name, "This field is required.")),
            Some(v) => v
                .parse()
                .map_err(|_| ApiError::field(name, "A valid integer is required.")),
        }
    }
}

/// A numeric id in the path; anything else is a 404 (no such resource).
#[derive(Debug, Clone, Copy)]
pub struct PathId(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::NotFound)?;
        raw.parse().map(PathId).map_err(|_| ApiError::NotFound)
    }
}

fn bearer(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| ApiError::InvalidToken)?;
    let mut words = value.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(scheme), Some(token), None)
            if scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token") =>
        {
            Ok(Some(token.to_owned()))
        }
        (Some(scheme), _, _)
            if scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token") =>
        {
            Err(ApiError::InvalidToken)
        }
        _ => Ok(None),
    }
}

/// Middleware run before every route: a request that sends a bearer token is authenticated
/// here, once; a malformed, unknown or revoked token is a 401 on *every* route (also where
/// login is optional, as Django REST framework does); no token is an anonymous caller. The
/// handlers' [`Auth`] and [`MaybeAuth`] read the result from the request's extensions.
///
/// Failed authentications count against the client IP's `failed` rate limit
/// ([`limits::failed`]); over it, a token that neither this process's memory nor Redis holds
/// is a 429 before any Postgres lookup, then counted before its lookup
/// ([`limits::standing`]), so guessing tokens costs Postgres at most the limit's worth of
/// lookups (and one Redis round trip per guess while refused or suspect).
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let client = ClientIp::of(&req);
    let token = match bearer(req.headers()) {
        Err(e) => return limits::failed(&state, client, false, e).await,
        Ok(None) => return next.run(req).await,
        Ok(Some(token)) => token,
    };
    let hash = match accounts::token_hash(&token) {
        Ok(hash) => hash,
        Err(e) => return limits::failed(&state, client, false, e).await,
    };
    let (user_id, loaded_hidden, fill) = match state.tokens.get(&hash) {
        Some(id) => (id, None, None),
        None => match look_up(&state, client, &hash).await {
            Ok(found) => found,
            Err(res) => return res,
        },
    };
    req.extensions_mut().insert(Auth {
        user_id,
        token,
        loaded_hidden,
    });
    // A token brought back from Postgres is cached by the request's first read (decision
    // 0037).
    let request = async {
        if !req.method().is_safe() {
            // A write: this user's never-cached reads stay on the primary for a while (see
            // `crate::replica`): here from its start, on every process from its answer (this
            // middleware runs inside `run_to_completion`, so a client that goes away
            // mid-request is marked too).
            state.replica.writing(user_id);
            let res = next.run(req).await;
            state.replica.wrote(user_id).await;
            return res;
        }
        next.run(req).await
    };
    state.cache.deferring(fill, request).await
}

/// The user of a token this process does not hold in memory, or the answer to give instead
/// (401, or 429 over the client's `failed` limit; see [`authenticate`]). Redis is asked
/// first whatever the client's standing, so a client over its limit still gets the tokens
/// Redis knows (users who share an address with a token guesser keep working); only
/// Postgres is gated. With the user, the user's hidden set and the cache fill of both if
/// Postgres was asked (the set is read with the token: [`accounts::load_token`]).
async fn look_up(
    state: &AppState,
    client: Option<ClientIp>,
    hash: &[u8],
) -> Result<(i64, Option<Arc<Hidden>>, Option<Deferred>), Response> {
    let standing = limits::standing(state, client);
    let lookup = match accounts::cached_token(&state.cache, &state.tokens, hash).await {
        accounts::Known::User(id) => return Ok((id, None, None)),
        accounts::Known::Invalid => {
            return Err(match standing {
                limits::Standing::Refused(res) => res,
                _ => limits::failed(state, client, false, ApiError::InvalidToken).await,
            });
        }
        accounts::Known::Neither(lookup) => lookup,
    };
    let charged = match standing {
        limits::Standing::Clear => false,
        limits::Standing::Refused(res) => return Err(res),
        limits::Standing::Suspect => {
            limits::charge(state, client).await?;
            true
        }
    };
    match accounts::load_token(&state.db, &state.cache, &state.tokens, hash, lookup).await {
        Ok((id, hidden, fill)) => Ok((id, Some(hidden), fill)),
        Err(e @ ApiError::InvalidToken) => Err(limits::failed(state, client, charged, e).await),
        Err(e) => Err(e.into_response()),
    }
}

/// The authenticated caller (by id) and the token used (see [`authenticate`]). Rejection: 401.
#[derive(Debug, Clone)]
pub struct Auth {
    pub user_id: i64,
    pub token: String,
    /// The caller's hidden set when this request read it from Postgres together with the token
    /// (neither cache held the token: [`accounts::load_token`]); read it with [`Auth::hidden`].
    pub loaded_hidden: Option<Arc<Hidden>>,
}

impl<S: Send + Sync> FromRequestParts<S> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Auth>()
            .cloned()
            .ok_or(ApiError::Unauthenticated)
    }
}

impl Auth {
    /// The caller's hidden set ([`blocks::hidden`]): the one read with the token if this
    /// request brought the token back from Postgres (a returning user's first request asks no
    /// cache for it: decision 0030), else from the caches or Postgres.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn hidden(&self, state: &AppState) -> sqlx::Result<Arc<Hidden>> {
        hidden_of(state, Some(self.user_id), self.loaded_hidden.as_ref()).await
    }

    /// The caller's `User` object (from the user cache).
    pub async fn user(&self, state: &AppState) -> Result<User, ApiError> {
        let mut found = users::load_many(&state.db, &state.cache, &[self.user_id]).await?;
        found
            .remove(&self.user_id)
            .map(User::from)
            .ok_or(ApiError::InvalidToken)
    }
}

/// The hidden set of caller `id` ([`Auth::hidden`], [`MaybeAuth::hidden`]): `loaded`, the one
/// read with the token, if the request has it, else [`blocks::hidden`].
async fn hidden_of(
    state: &AppState,
    id: Option<i64>,
    loaded: Option<&Arc<Hidden>>,
) -> sqlx::Result<Arc<Hidden>> {
    match loaded {
        Some(hidden) => Ok(hidden.clone()),
        None => blocks::hidden(&state.db, &state.cache, id).await,
    }
}

/// The caller's id if a token was sent (a bad token was a 401 already), else anonymous; with
/// the caller's hidden set when this request read it with the token ([`Auth::loaded_hidden`]).
#[derive(Debug, Clone, Default)]
pub struct MaybeAuth {
    id: Option<i64>,
    loaded_hidden: Option<Arc<Hidden>>,
}

impl<S: Send + Sync> FromRequestParts<S> for MaybeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Auth>()
            .map_or_else(MaybeAuth::default, |a| MaybeAuth {
                id: Some(a.user_id),
                loaded_hidden: a.loaded_hidden.clone(),
            }))
    }
}

impl MaybeAuth {
    /// The caller's id, if any.
    pub fn id(&self) -> Option<i64> {
        self.id
    }

    /// Whom the caller must not see ([`blocks::hidden`]; nobody for an anonymous caller): the
    /// set read with the token if this request brought the token back from Postgres, as
    /// [`Auth::hidden`] (a returning reader's first page of a list, a circle, a hashtag or a
    /// user's tweets asks no cache for it either: issue 42), else from the caches or Postgres.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn hidden(&self, state: &AppState) -> sqlx::Result<Arc<Hidden>> {
        hidden_of(state, self.id, self.loaded_hidden.as_ref()).await
    }

    /// Whether `author` blocks the caller (their tweets are then 404 to the caller, who may not
    /// follow them or like or comment on their tweets), from [`MaybeAuth::hidden`]. Never for
    /// an anonymous caller or the author itself.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn blocked_by(&self, state: &AppState, author: i64) -> sqlx::Result<bool> {
        if self.id.is_none_or(|v| v == author) {
            return Ok(false);
        }
        Ok(self.hidden(state).await?.blocked_by(author))
    }
}

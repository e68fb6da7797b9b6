//! `/api/chat/channels/`: channels, members, messages (send, poll, long-poll, history), read
//! markers.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::chat::{self, Channel, Message, Since};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, PathId, QueryMap};
use crate::pagination::Page;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/chat/channels", get(channels).post(create))
        .route("/api/chat/channels/{id}/members", post(add_member))
        .route("/api/chat/channels/{id}/leave", post(leave))
        .route("/api/chat/channels/{id}/messages", get(poll).post(send))
        .route("/api/chat/channels/{id}/read", post(read))
}

/// `member_ids`: a JSON array of ids, or (forms) ids separated by commas.
fn member_ids(fields: &Fields) -> Result<Vec<i64>, ApiError> {
    let bad = || ApiError::field("member_ids", "A list of user ids is required.");
    let ids: Option<Vec<i64>> = match fields.0.get("member_ids") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::Number(n) => n.as_i64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            })
            .collect(),
        Some(Value::String(s)) => s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.trim().parse().ok())
            .collect(),
        Some(Value::Number(n)) => n.as_i64().map(|n| vec![n]),
        _ => None,
    };
    ids.filter(|ids| !ids.is_empty()).ok_or_else(bad)
}

async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Channel>)> {
    let members = member_ids(&fields)?;
    let mut errors = FieldErrors::new();
    let name = fields.text("name", &mut errors).unwrap_or_default();
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let channel =
        chat::create(&state.db, &state.cache, auth.user_id, &members, name.trim()).await?;
    Ok((StatusCode::CREATED, Json(channel)))
}

async fn channels(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
    let req = query.page()?;
    let page: Page<Channel> = chat::channels(&state.db, &state.cache, auth.user_id, &req).await?;
    // The cursor of this listing is a channel's last activity, sent as its `created_at`
    // would be in other listings: clients page with `created_at__lt=<last_activity_at>`.
    let results: Vec<Value> = page
        .results
        .iter()
        .map(|c| {
            let mut v = json!(c);
            v["last_activity_at"] = json!(crate::time::format(&c.last_activity_at));
            v
        })
        .collect();
    Ok(Json(
        json!({"has_next_page": page.has_next_page, "results": results}),
    ))
}

async fn add_member(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let mut errors = FieldErrors::new();
    let Some(user) = fields.required_id("user_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    let added = chat::add_member(&state.db, auth.user_id, id, user).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"success": true, "duplicate": !added})),
    ))
}

async fn leave(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    chat::leave(&state.db, auth.user_id, id).await?;
    Ok(Json(json!({"success": true})))
}

async fn send(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Message>)> {
    let mut errors = FieldErrors::new();
    let content = fields
        .required_text("content", &mut errors)
        .map(|c| c.trim().to_owned());
    let client_id = fields.text("client_id", &mut errors);
    let too_long = |max: usize| format!("Ensure this field has no more than {max} characters.");
    match content.as_deref().map(|c| c.chars().count()) {
        Some(0) => errors
            .entry("content".into())
            .or_default()
            .push("This field may not be blank.".into()),
        Some(n) if n > chat::MAX_CONTENT_CHARS => errors
            .entry("content".into())
            .or_default()
            .push(too_long(chat::MAX_CONTENT_CHARS)),
        // Postgres text can not hold U+0000 (and one such send would fail its whole batch).
        _ if content.as_deref().is_some_and(|c| c.contains('\0')) => errors
            .entry("content".into())
            .or_default()
            .push("Null characters are not allowed.".into()),
        _ => {}
    }
    if client_id
        .as_deref()
        .is_some_and(|c| c.is_empty() || c.chars().count() > chat::MAX_CLIENT_ID_CHARS)
    {
        errors
            .entry("client_id".into())
            .or_default()
            .push(format!("1 to {} characters.", chat::MAX_CLIENT_ID_CHARS));
    }
    let (Some(content), true) = (content, errors.is_empty()) else {
        return Err(ApiError::Validation(errors));
    };
    let me = auth.user(&state).await?;
    let message = chat::send(&state.chat, &me, id, &content, client_id.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(message)))
}

/// A bounded integer query parameter (absent: `default`).
fn bounded(query: &QueryMap, name: &str, min: i64, max: i64, default: i64) -> ApiResult<i64> {
    match query.0.get(name).map(|v| v.trim()) {
        None | Some("") => Ok(default),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|v| (min..=max).contains(v))
            .ok_or_else(|| {
                ApiError::field(
                    name,
                    format!("Ensure this value is between {min} and {max}."),
                )
            }),
    }
}

async fn poll(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
    let limit = bounded(&query, "limit", 1, 100, 50)? as usize;
    let (messages, has_more) = if query.0.contains_key("before_id") {
        let before = bounded(&query, "before_id", 1, i64::MAX, 1)?;
        chat::history(&state.chat, auth.user_id, id, before, limit).await?
    } else {
        let since = match query.0.get("since_id").map(|v| v.trim()) {
            None | Some("") => Since::Marker,
            Some(_) => Since::Id(bounded(&query, "since_id", 0, i64::MAX, 0)?),
        };
        let wait = bounded(&query, "wait", 0, chat::MAX_WAIT_SECS as i64, 0)?;
        let wait = Duration::from_secs(wait.unsigned_abs());
        chat::poll(&state.chat, auth.user_id, id, since, limit, wait).await?
    };
    Ok(Json(json!({"messages": messages, "has_more": has_more})))
}

async fn read(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<Value>> {
    let mut errors = FieldErrors::new();
    let Some(last) = fields.required_id("last_read_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    let unread = chat::mark_read(&state.db, auth.user_id, id, last).await?;
    Ok(Json(json!({"unread_count": unread})))
}

//! `/api/chat/channels/`: channels, members, messages (send, poll, long-poll, history), read
//! markers.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::chat::{self, Channel, Message, Since};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, PathId, QueryMap};
use crate::http::openapi::{self, Duplicate, PageParams, Success};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(channels, create))
        .routes(routes!(add_member))
        .routes(routes!(leave))
        .routes(routes!(poll, send))
        .routes(routes!(read))
}

/// The body of a new channel.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewChannel {
    /// The other members' user ids (in a form: ids separated by commas); the caller is added.
    /// At most 1,000 members with the caller.
    #[schema(min_items = 1, max_items = 1000)]
    member_ids: Vec<i64>,
    /// Trimmed, at most 50 characters (absent or null: `""`).
    #[schema(max_length = 50)]
    name: Option<String>,
}

/// The body of a new channel member.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewChannelMember {
    /// The user to add (an integer, or a decimal string).
    user_id: i64,
}

/// The body of a message.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewMessage {
    /// Trimmed, then 1–2000 characters, without U+0000 (as every text field).
    #[schema(
        min_length = 1,
        max_length = 2000,
        pattern = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    )]
    content: String,
    /// 1–64 characters, unique per channel and sender: a retry with the same `client_id`
    /// answers the first message again.
    #[schema(min_length = 1, max_length = 64)]
    client_id: Option<String>,
}

/// The body of a read marker.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct ReadMarker {
    /// The last message read (the marker never moves back nor past the last message).
    last_read_id: i64,
}

/// The answer of a poll or a history: `{"messages": [Message, ...], "has_more"}`.
#[derive(Serialize, ToSchema)]
pub struct ChannelMessages {
    /// Oldest first.
    pub messages: Vec<Message>,
    /// More messages exist after these (with `before_id`: before them).
    pub has_more: bool,
}

/// `{"unread_count": n}`.
#[derive(Serialize, ToSchema)]
pub struct ChannelUnread {
    /// Messages after the caller's marker that others sent.
    #[schema(minimum = 0)]
    pub unread_count: i64,
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

/// Creates a channel of the caller and the given users (a direct channel has one other member).
#[utoipa::path(post, path = "/api/chat/channels", tag = "chat",
    request_body = NewChannel,
    security(("bearer" = [])),
    responses((status = 201, body = Channel, description = "The new channel")))]
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

/// The caller's channels, most recently active first.
///
/// The cursors page on the channels' `last_activity_at` (the last message's time, or the
/// channel's creation).
#[utoipa::path(get, path = "/api/chat/channels", tag = "chat",
    params(PageParams),
    security(("bearer" = [])),
    responses((status = 200, body = openapi::Page<Channel>,
        description = "A page of channels, each with the caller's `unread_count`")))]
async fn channels(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<openapi::Page<Channel>>> {
    let req = query.page()?;
    let page = chat::channels(&state.db, &state.cache, auth.user_id, &req).await?;
    Ok(Json(page))
}

/// Adds a user to a channel of the caller's (again: changes nothing).
///
/// A new member's read marker starts at the channel's last message.
#[utoipa::path(post, path = "/api/chat/channels/{id}/members", tag = "chat",
    params(("id" = i64, Path, description = "The channel (404 unless the caller is a member)")),
    request_body = NewChannelMember,
    security(("bearer" = [])),
    responses((status = 201, body = Duplicate,
        description = "A member; `duplicate`: whether they were one already")))]
async fn add_member(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Duplicate>)> {
    let mut errors = FieldErrors::new();
    let Some(user) = fields.required_id("user_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    let added = chat::add_member(&state.db, auth.user_id, id, user).await?;
    Ok((
        StatusCode::CREATED,
        Json(Duplicate {
            success: true,
            duplicate: !added,
        }),
    ))
}

/// Leaves a channel; afterwards it is a 404 for the caller.
#[utoipa::path(post, path = "/api/chat/channels/{id}/leave", tag = "chat",
    params(("id" = i64, Path, description = "The channel (404 unless the caller is a member)")),
    security(("bearer" = [])),
    responses((status = 200, body = Success, description = "Left")))]
async fn leave(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Success>> {
    chat::leave(&state.db, auth.user_id, id).await?;
    Ok(Json(Success { success: true }))
}

/// Sends a message to a channel of the caller's.
///
/// A retry with the same `client_id` (also a concurrent one) answers the first message and
/// stores no second one. A 201 means stored.
#[utoipa::path(post, path = "/api/chat/channels/{id}/messages", tag = "chat",
    params(("id" = i64, Path, description = "The channel (404 unless the caller is a member)")),
    request_body = NewMessage,
    security(("bearer" = [])),
    responses((status = 201, body = Message,
        description = "The message (the first one, for a retried `client_id`)")))]
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

/// A channel's messages: a poll, a long-poll or its history.
///
/// Without `since_id` or `before_id`: the messages after the caller's read marker, which moves
/// to the last one returned; with `since_id`, the messages after it, and nothing moves.
/// `wait=S` long-polls: with nothing new, the answer comes as soon as a message arrives, or
/// after S seconds with none. With `before_id` (history): the `limit` messages before it
/// (`since_id` and `wait` are then ignored).
#[utoipa::path(get, path = "/api/chat/channels/{id}/messages", tag = "chat",
    params(
        ("id" = i64, Path, description = "The channel (404 unless the caller is a member)"),
        ("since_id" = Option<i64>, Query, minimum = 0,
            description = "Messages after this id (absent: after the caller's read marker)"),
        ("before_id" = Option<i64>, Query, minimum = 1,
            description = "History: the messages before this id"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100,
            description = "Most messages (default 50)"),
        ("wait" = Option<i64>, Query, minimum = 0, maximum = 30,
            description = "Seconds to wait for a message when there is none (default 0)"),
    ),
    security(("bearer" = [])),
    responses((status = 200, body = ChannelMessages, description = "Messages, oldest first")))]
async fn poll(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<ChannelMessages>> {
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
    Ok(Json(ChannelMessages { messages, has_more }))
}

/// Moves the caller's read marker of a channel forward.
#[utoipa::path(post, path = "/api/chat/channels/{id}/read", tag = "chat",
    params(("id" = i64, Path, description = "The channel (404 unless the caller is a member)")),
    request_body = ReadMarker,
    security(("bearer" = [])),
    responses((status = 200, body = ChannelUnread, description = "The unread count after it")))]
async fn read(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<ChannelUnread>> {
    let mut errors = FieldErrors::new();
    let Some(last) = fields.required_id("last_read_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    let unread = chat::mark_read(&state.db, auth.user_id, id, last).await?;
    Ok(Json(ChannelUnread {
        unread_count: unread,
    }))
}

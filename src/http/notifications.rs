//! `/api/notifications/`: the caller's notifications, unread count, marking read.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, PathId, QueryMap};
use crate::http::openapi::{self, PageParams};
use crate::notifications::{self, Notification};
use crate::pagination::Page;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(unread_count))
        .routes(routes!(mark_all))
        .routes(routes!(update))
}

/// `{"unread_count": n}`.
#[derive(Serialize, ToSchema)]
pub struct UnreadCount {
    /// How many of the caller's notifications are unread.
    #[schema(minimum = 0)]
    pub unread_count: i64,
}

/// `{"marked_count": n}`.
#[derive(Serialize, ToSchema)]
pub struct MarkedCount {
    /// How many notifications were unread and are now read.
    pub marked_count: u64,
}

/// The body of a notification's update.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NotificationBody {
    /// Whether the notification is unread (in a form: `true`, `false`, `1` or `0`).
    unread: bool,
}

/// The caller's notifications, newest first.
#[utoipa::path(get, path = "/api/notifications", tag = "notifications",
    params(
        PageParams,
        ("unread" = Option<bool>, Query,
            description = "`true` (or `1`): only unread ones; `false`, `0` or absent: all"),
    ),
    security(("bearer" = [])),
    responses((status = 200, body = openapi::Page<Notification>, description = "A page")))]
async fn list(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<Page<Notification>>> {
    let req = query.page()?;
    let unread_only = match query.0.get("unread").map(|v| v.trim().to_ascii_lowercase()) {
        None => false,
        Some(v) if v == "true" || v == "1" => true,
        Some(v) if v == "false" || v == "0" || v.is_empty() => false,
        Some(_) => return Err(ApiError::field("unread", "Must be true or false.")),
    };
    Ok(Json(
        notifications::list(&state.db, &state.cache, auth.user_id, unread_only, &req).await?,
    ))
}

/// How many of the caller's notifications are unread.
#[utoipa::path(get, path = "/api/notifications/unread-count", tag = "notifications",
    security(("bearer" = [])),
    responses((status = 200, body = UnreadCount, description = "The unread count")))]
async fn unread_count(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<UnreadCount>> {
    let n = notifications::unread_count(&state.db, auth.user_id).await?;
    Ok(Json(UnreadCount { unread_count: n }))
}

/// Marks all of the caller's notifications read.
#[utoipa::path(post, path = "/api/notifications/mark-all-as-read", tag = "notifications",
    security(("bearer" = [])),
    responses((status = 200, body = MarkedCount, description = "How many were marked read")))]
async fn mark_all(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<MarkedCount>> {
    let n = notifications::mark_all_read(&state.db, auth.user_id).await?;
    Ok(Json(MarkedCount { marked_count: n }))
}

/// Marks one of the caller's notifications read or unread.
#[utoipa::path(put, path = "/api/notifications/{id}", tag = "notifications",
    params(("id" = i64, Path,
        description = "The notification (someone else's is a 404)")),
    security(("bearer" = [])),
    request_body = NotificationBody,
    responses((status = 200, body = Notification, description = "The updated notification")))]
async fn update(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<Notification>> {
    let mut errors = FieldErrors::new();
    let Some(unread) = fields.required_bool("unread", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    Ok(Json(
        notifications::set_unread(&state.db, &state.cache, auth.user_id, id, unread).await?,
    ))
}

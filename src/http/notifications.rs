//! `/api/notifications/`: the caller's notifications, unread count, marking read.

use axum::extract::State;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, PathId, QueryMap};
use crate::notifications::{self, Notification};
use crate::pagination::Page;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/notifications", get(list))
        .route("/api/notifications/unread-count", get(unread_count))
        .route("/api/notifications/mark-all-as-read", post(mark_all))
        .route("/api/notifications/{id}", put(update))
}

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

async fn unread_count(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    let n = notifications::unread_count(&state.db, auth.user_id).await?;
    Ok(Json(json!({"unread_count": n})))
}

async fn mark_all(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    let n = notifications::mark_all_read(&state.db, auth.user_id).await?;
    Ok(Json(json!({"marked_count": n})))
}

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

//! `/api/likes/`: like and cancel a like of a tweet or comment.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields};
use crate::likes::{self, Like, Target};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/likes", post(like))
        .route("/api/likes/cancel", post(cancel))
}

fn target(fields: &Fields) -> ApiResult<Target> {
    let mut errors = FieldErrors::new();
    let content_type = fields.required_text("content_type", &mut errors);
    let object_id = fields.required_id("object_id", &mut errors);
    match (content_type, object_id) {
        (Some(kind), Some(id)) if errors.is_empty() => Target::parse(&kind, id),
        _ => Err(ApiError::Validation(errors)),
    }
}

async fn like(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Like>)> {
    let target = target(&fields)?;
    Ok((
        StatusCode::CREATED,
        Json(likes::like(&state.db, &state.cache, &auth.user(&state).await?, target).await?),
    ))
}

async fn cancel(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<Json<Value>> {
    let target = target(&fields)?;
    let deleted = likes::cancel(&state.db, &state.cache, auth.user_id, target).await?;
    Ok(Json(json!({"success": true, "deleted": deleted})))
}

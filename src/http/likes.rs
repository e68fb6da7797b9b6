//! `/api/likes/`: like and cancel a like of a tweet or comment.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields};
use crate::http::openapi::Deleted;
use crate::likes::{self, Like, Target};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(like))
        .routes(routes!(cancel))
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

/// The body of a like and of its cancel: what is liked.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct LikeBody {
    /// `tweet` or `comment`, in any case.
    #[schema(pattern = r"^\s*([Tt][Ww][Ee][Ee][Tt]|[Cc][Oo][Mm][Mm][Ee][Nn][Tt])\s*$")]
    content_type: String,
    /// The tweet's or comment's id (no such object: a 400 naming `object_id`).
    object_id: i64,
}

/// Likes a tweet or comment.
///
/// Liking again changes nothing and answers the first like.
#[utoipa::path(post, path = "/api/likes", tag = "likes",
    security(("bearer" = [])),
    request_body = LikeBody,
    responses((status = 201, body = Like,
        description = "The like (when liked already: the first like, same `created_at`)")))]
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

/// Takes back the caller's like of a tweet or comment.
#[utoipa::path(post, path = "/api/likes/cancel", tag = "likes",
    security(("bearer" = [])),
    request_body = LikeBody,
    responses((status = 200, body = Deleted, description = "`deleted`: 1 if the caller liked it")))]
async fn cancel(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<Json<Deleted>> {
    let target = target(&fields)?;
    let deleted = likes::cancel(&state.db, &state.cache, auth.user_id, target).await?;
    Ok(Json(Deleted {
        success: true,
        deleted: u8::from(deleted > 0),
    }))
}

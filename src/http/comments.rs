//! `/api/comments/`: a tweet's comments, commenting, editing and deleting.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::comments::{self, Comment};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::openapi::{self, Detail, PageParams, Success};
use crate::pagination::Page;
use crate::state::AppState;
use crate::tweets;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(edit, remove))
}

/// The validated `content` field (1 to 280 characters after trimming).
fn content(fields: &Fields, errors: &mut FieldErrors) -> Option<String> {
    match tweets::validate_content(&fields.required_text("content", errors)?) {
        Ok(c) => Some(c),
        Err(msg) => {
            errors.entry("content".into()).or_default().push(msg);
            None
        }
    }
}

/// The body of a new comment.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct CommentBody {
    /// The tweet commented on (no such tweet: a 400 naming `tweet_id`).
    tweet_id: i64,
    /// 1–280 characters after trimming.
    #[schema(min_length = 1, max_length = 280, pattern = r"\S")]
    content: String,
}

/// The body of a comment's edit.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct CommentEdit {
    /// 1–280 characters after trimming.
    #[schema(min_length = 1, max_length = 280, pattern = r"\S")]
    content: String,
}

/// A tweet's comments, newest first.
#[utoipa::path(get, path = "/api/comments", tag = "comments",
    params(PageParams, ("tweet_id" = i64, Query, description = "The tweet (404 if no such tweet)")),
    security((), ("bearer" = [])),
    responses((status = 200, body = openapi::Page<Comment>,
        description = "A page; `has_liked` is the caller's")))]
async fn list(
    State(state): State<AppState>,
    caller: MaybeAuth,
    query: QueryMap,
) -> ApiResult<Json<Page<Comment>>> {
    let tweet_id = query.required_id("tweet_id")?;
    let req = query.page()?;
    let (db, cache, req) = (&state.db, &state.cache, &req);
    // The comments of a tweet whose author blocks the caller are 404, as the tweet is.
    if caller.id().is_some()
        && let Some((tweet, ..)) = crate::tweets::load(db, cache, tweet_id).await?
        && caller.blocked_by(&state, tweet.user_id).await?
    {
        return Err(crate::error::ApiError::NotFound);
    }
    let viewer = caller.id();
    let page = state
        .replica
        .read_with(db, viewer, |read| async move {
            comments::list(db, &read, cache, tweet_id, req, viewer).await
        })
        .await?;
    Ok(Json(page))
}

/// Comments on a tweet.
#[utoipa::path(post, path = "/api/comments", tag = "comments",
    security(("bearer" = [])),
    request_body = CommentBody,
    responses((status = 201, body = Comment, description = "The new comment")))]
async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Comment>)> {
    let mut errors = FieldErrors::new();
    let tweet_id = fields.required_id("tweet_id", &mut errors);
    let content = content(&fields, &mut errors);
    let (Some(tweet_id), Some(content), true) = (tweet_id, content, errors.is_empty()) else {
        return Err(ApiError::Validation(errors));
    };
    let comment = comments::create(
        &state.db,
        &state.cache,
        &auth.user(&state).await?,
        tweet_id,
        &content,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(comment)))
}

/// Edits one of the caller's comments.
#[utoipa::path(put, path = "/api/comments/{id}", tag = "comments",
    params(("id" = i64, Path, description = "The comment")),
    security(("bearer" = [])),
    request_body = CommentEdit,
    responses(
        (status = 200, body = Comment, description = "The edited comment"),
        (status = 403, body = Detail, description = "Not the caller's comment"),
    ))]
async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<Comment>> {
    let mut errors = FieldErrors::new();
    let content = content(&fields, &mut errors).ok_or(ApiError::Validation(errors))?;
    Ok(Json(
        comments::edit(
            &state.db,
            &state.cache,
            &auth.user(&state).await?,
            id,
            &content,
        )
        .await?,
    ))
}

/// Deletes one of the caller's comments.
///
/// Its likes and the notifications about it go with it.
#[utoipa::path(delete, path = "/api/comments/{id}", tag = "comments",
    params(("id" = i64, Path, description = "The comment")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Success, description = "Deleted"),
        (status = 403, body = Detail, description = "Not the caller's comment"),
    ))]
async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Success>> {
    comments::delete(&state.db, &state.cache, auth.user_id, id).await?;
    Ok(Json(Success { success: true }))
}

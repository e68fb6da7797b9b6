//! `/api/comments/`: a tweet's comments, commenting, editing and deleting.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::comments::{self, Comment};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::pagination::Page;
use crate::state::AppState;
use crate::tweets;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/comments", get(list).post(create))
        .route("/api/comments/{id}", put(edit).delete(remove))
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

async fn list(
    State(state): State<AppState>,
    caller: MaybeAuth,
    query: QueryMap,
) -> ApiResult<Json<Page<Comment>>> {
    let tweet_id = query.required_id("tweet_id")?;
    let req = query.page()?;
    let (db, cache, req) = (&state.db, &state.cache, &req);
    let page = state
        .replica
        .read_with(db, caller.id(), |read| async move {
            comments::list(db, &read, cache, tweet_id, req, caller.id()).await
        })
        .await?;
    Ok(Json(page))
}

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

async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    comments::delete(&state.db, &state.cache, auth.user_id, id).await?;
    Ok(Json(json!({"success": true})))
}

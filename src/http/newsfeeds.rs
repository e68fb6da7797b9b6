//! `/api/newsfeeds/`: the caller's newsfeed.

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::error::ApiResult;
use crate::http::extract::{Auth, QueryMap};
use crate::http::timeline::{JsonBody, timeline_body};
use crate::newsfeeds;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/newsfeeds", get(list))
}

/// A page of `NewsFeed` objects `{"id", "created_at", "tweet": Tweet}` (the id is the newsfeed
/// row's, `created_at` the entry's: its tweet's, or later for an entry that arrived behind newer
/// ones, see [`crate::newsfeeds::stamp`]).
async fn list(State(state): State<AppState>, auth: Auth, query: QueryMap) -> ApiResult<JsonBody> {
    let req = query.page()?;
    let (db, cache, pulled) = (&state.db, &state.cache, &state.pull_authors);
    let items = newsfeeds::read(db, cache, pulled, auth.user_id, &req).await?;
    Ok(timeline_body(items, &req, true))
}

//! `/api/newsfeeds/`: the caller's newsfeed.

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::blocks;
use crate::error::ApiResult;
use crate::http::extract::{Auth, QueryMap};
use crate::http::openapi::{NewsFeed, Page, PageParams};
use crate::http::timeline::{JsonBody, timeline_body};
use crate::newsfeeds;
use crate::state::AppState;
use crate::tweets;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list))
}

/// The caller's newsfeed: their own tweets and those of everyone they follow, but those of
/// the accounts the caller mutes or blocks or that block the caller.
///
/// A page of `NewsFeed` objects `{"id", "created_at", "tweet": Tweet}` (the id is the newsfeed
/// row's, `created_at` the entry's: its tweet's, or later for an entry that arrived behind newer
/// ones, see [`crate::newsfeeds::stamp`]).
#[utoipa::path(get, path = "/api/newsfeeds", tag = "newsfeeds",
    params(PageParams),
    security(("bearer" = [])),
    responses((status = 200, body = Page<NewsFeed>, description = "A page, newest first")))]
async fn list(State(state): State<AppState>, auth: Auth, query: QueryMap) -> ApiResult<JsonBody> {
    let req = query.page()?;
    let (db, cache, pulled) = (&state.db, &state.cache, &state.pull_authors);
    let hidden = auth.hidden(&state).await?;
    let viewer = Some(auth.user_id);
    let items = blocks::visible_page(&hidden, &req, |page| async move {
        let items = newsfeeds::read(db, cache, pulled, auth.user_id, &page).await?;
        tweets::complete_page(db, cache, viewer, items).await
    })
    .await?;
    Ok(timeline_body(items, &req, true))
}

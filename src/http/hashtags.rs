//! `/api/hashtags/` and `/api/trends/`: the tweets of a hashtag, and trending hashtags.

use axum::Json;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult};
use crate::hashtags::{self, Trend, Window};
use crate::http::extract::{MaybeAuth, QueryMap};
use crate::http::openapi::{self, PageParams};
use crate::http::timeline::{JsonBody, owned_timeline_page, timeline_body};
use crate::state::AppState;
use crate::timeline::Timeline;
use crate::tweets::Tweet;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(hashtag_tweets))
        .routes(routes!(trends))
}

/// The tweets with a hashtag, newest first (a cached timeline, like a circle's).
///
/// A tag no tweet used yet has an empty page; a path that is not a tag is a 404.
#[utoipa::path(get, path = "/api/hashtags/{tag}/tweets", tag = "hashtags",
    params(("tag" = String, Path,
        description = "The tag, any case, with or without `#` (`%23`): letters, digits and `_`, at least one letter"),
        PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = openapi::Page<Tweet>,
        description = "A page of tweets (`has_liked` for a logged-in caller)")))]
async fn hashtag_tweets(
    State(state): State<AppState>,
    caller: MaybeAuth,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let Ok(Path(raw)) = path else {
        return Err(ApiError::NotFound);
    };
    let tag = hashtags::parse_path_tag(&raw).ok_or(ApiError::NotFound)?;
    let req = query.page()?;
    match state.tag_ids.get(&state.db, &tag).await? {
        Some(id) => owned_timeline_page(&state, Timeline::Hashtag(id), &req, &caller).await,
        None => Ok(timeline_body(Vec::new(), &req, false)),
    }
}

/// Trending hashtags: at most 20, by distinct accounts in the window against the window before
/// it (Mastodon's rule: score `(accounts - expected)² / expected`, `expected` being the accounts
/// of the window before, at least 1; at least 3 accounts, and more than expected). Counted from
/// Postgres by one process at a time and shared through Redis; at most 500 ms old, or 1 s
/// while the next count runs.
#[utoipa::path(get, path = "/api/trends", tag = "hashtags",
    params(("window" = Option<String>, Query, pattern = "^(1h|24h)$",
        description = "`1h` (the default) or `24h`")),
    security((), ("bearer" = [])),
    responses((status = 200, body = Vec<Trend>, description = "Trends, highest score first")))]
async fn trends(State(state): State<AppState>, query: QueryMap) -> ApiResult<Json<Vec<Trend>>> {
    let window = Window::parse(query.0.get("window").map(String::as_str))?;
    let trends = state.trends.get(&state.db, &state.cache, window).await?;
    Ok(Json(trends.as_ref().clone()))
}

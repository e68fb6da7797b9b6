//! The body every timeline route answers with (a user's tweets, newsfeeds, lists, circles):
//! a page of tweet objects written by hand, cached tweets spliced in as they are.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::blocks;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::MaybeAuth;
use crate::pagination::{Page, PageRequest};
use crate::retweets;
use crate::state::AppState;
use crate::time::{self, Timestamp};
use crate::timeline::{self, Item, Timeline};
use crate::tweets::{self, TweetJson};

/// A page of timeline items as tweet objects (`has_liked` came with the hydration; cached
/// tweets spliced, see [`TweetJson`]), each with its item id and `created_at`.
fn tweet_page(items: Vec<Item>, req: &PageRequest) -> Page<((i64, Timestamp), TweetJson)> {
    Page::from_items(items, req)
        .filter_map(|i| Some(((i.id, i.created_at), TweetJson::from_item(i)?)))
}

/// Bytes a timeline result takes about (the body is allocated once, not grown).
const RESULT_BYTES: usize = 768;

/// A JSON response body written by hand ([`timeline_body`]).
pub(crate) struct JsonBody(Vec<u8>);

impl IntoResponse for JsonBody {
    fn into_response(self) -> Response {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.0,
        )
            .into_response()
    }
}

/// A page of a timeline that has an owner to check (a user's tweets, a list, a circle): 404 if
/// the page is empty and the owner does not exist. Only an empty page asks (see
/// [`Timeline::owner_exists`]). A list's or circle's page leaves out the accounts the viewer
/// must not see ([`blocks::visible_page`]); a user's own tweets are 404 to the accounts they
/// block (and shown, muted or not, to everyone else, as a profile is). Both read the
/// caller's hidden set with [`MaybeAuth::hidden`] (the set read with the token, if it was).
///
/// # Errors
/// 404 for an unknown owner or one who blocks the viewer; Postgres failed.
pub(crate) async fn owned_timeline_page(
    state: &AppState,
    timeline: Timeline,
    req: &PageRequest,
    caller: &MaybeAuth,
) -> ApiResult<JsonBody> {
    let (db, cache, viewer) = (&state.db, &state.cache, caller.id());
    let items = match timeline {
        Timeline::UserTweets(owner) => {
            if caller.blocked_by(state, owner).await? {
                return Err(ApiError::NotFound);
            }
            let items = timeline::read(db, cache, timeline, req, viewer).await?;
            let mut items = tweets::complete_page(db, cache, viewer, items).await?;
            items.retain(|i| !retweets::is_orphan(i));
            items
        }
        _ => {
            let hidden = caller.hidden(state).await?;
            blocks::visible_page(&hidden, req, |page| async move {
                let items = timeline::read(db, cache, timeline, &page, viewer).await?;
                tweets::complete_page(db, cache, viewer, items).await
            })
            .await?
        }
    };
    if items.is_empty() && !timeline.owner_exists(&state.db, &state.cache).await? {
        return Err(ApiError::NotFound);
    }
    Ok(timeline_body(items, req, false))
}

/// A page of a timeline as `{"has_next_page": bool, "results": [...]}` (the shape of
/// [`Page`]): each result the tweet object, or with `newsfeed` the `NewsFeed` object
/// `{"id", "created_at", "tweet"}` (its id is the newsfeed row's). Spliced tweets are copied
/// into the body as they are, so a warm page costs no JSON parsing and almost no serialising.
pub(crate) fn timeline_body(items: Vec<Item>, req: &PageRequest, newsfeed: bool) -> JsonBody {
    let page = tweet_page(items, req);
    let mut out = Vec::with_capacity(48 + RESULT_BYTES * page.results.len());
    out.extend_from_slice(if page.has_next_page {
        b"{\"has_next_page\":true,\"results\":["
    } else {
        b"{\"has_next_page\":false,\"results\":["
    });
    for (i, ((id, created_at), tweet)) in page.results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if newsfeed {
            out.extend_from_slice(b"{\"id\":");
            out.extend_from_slice(itoa::Buffer::new().format(*id).as_bytes());
            out.extend_from_slice(b",\"created_at\":\"");
            // An entry's time is nearly always its tweet's `created_at`, whose text a cached
            // tweet holds; an entry that arrived behind newer ones lies later
            // (`newsfeeds::stamp`).
            match tweet.created_at_text() {
                Some(text) if tweet.created_at() == *created_at => {
                    debug_assert_eq!(text, time::format(created_at));
                    out.extend_from_slice(text.as_bytes());
                }
                _ => out.extend_from_slice(time::format(created_at).as_bytes()),
            }
            out.extend_from_slice(b"\",\"tweet\":");
            tweet.write(&mut out);
            out.push(b'}');
        } else {
            tweet.write(&mut out);
        }
    }
    out.extend_from_slice(b"]}");
    JsonBody(out)
}

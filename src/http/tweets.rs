//! `/api/tweets/`: a user's tweets, posting, detail and deletion.

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{Value, json};

use crate::circles;
use crate::comments::{self, Comment};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::UPLOAD_BODY_BYTES;
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::likes::{self, Like};
use crate::media::{self, Media};
use crate::model::TweetCounts;
use crate::pagination::Page;
use crate::pagination::PageRequest;
use crate::state::AppState;
use crate::time::{self, Timestamp};
use crate::timeline::{self, Item, Timeline};
use crate::tweets::{self, NewTweet, Tweet, TweetJson};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/api/tweets",
            get(list)
                .post(create)
                .layer(DefaultBodyLimit::max(UPLOAD_BODY_BYTES)),
        )
        .route("/api/tweets/{id}", get(detail).delete(remove))
}

async fn list(
    State(state): State<AppState>,
    caller: MaybeAuth,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let user_id = query.required_id("user_id")?;
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::UserTweets(user_id), &req, caller.id()).await
}

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

/// A page of a timeline as `{"has_next_page": bool, "results": [...]}` (the shape of
/// [`Page`]): each result the tweet object, or with `newsfeed` the `NewsFeed` object
/// `{"id", "created_at", "tweet"}` (its id is the newsfeed row's). Spliced tweets are copied
/// into the body as they are, so a warm page costs no JSON parsing and almost no serialising.
/// A page of a timeline that has an owner to check (a user's tweets, a list, a circle): 404 if
/// the page is empty and the owner does not exist. Only an empty page asks (see
/// [`Timeline::owner_exists`]).
///
/// # Errors
/// 404 for an unknown owner; Postgres failed.
pub(crate) async fn owned_timeline_page(
    state: &AppState,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
) -> ApiResult<JsonBody> {
    let items = timeline::read(&state.db, &state.cache, timeline, req, viewer).await?;
    if items.is_empty() && !timeline.owner_exists(&state.db, &state.cache).await? {
        return Err(ApiError::NotFound);
    }
    Ok(timeline_body(items, req, false))
}

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

async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Tweet>)> {
    let mut errors = FieldErrors::new();
    let raw = fields.required_text("content", &mut errors);
    let circle = fields.optional_id("circle_id", &mut errors);
    let lon = fields.optional_number("lon", (-180.0, 180.0), &mut errors);
    let lat = fields.optional_number("lat", (-90.0, 90.0), &mut errors);
    let coordinates = match (lon, lat) {
        (Some(lon), Some(lat)) => Some([lon, lat]),
        (None, None) => None,
        _ if !errors.is_empty() => None,
        (None, _) => return Err(ApiError::field("lon", "Give lon and lat together.")),
        (_, None) => return Err(ApiError::field("lat", "Give lon and lat together.")),
    };
    let content = match raw.map(|c| tweets::validate_content(&c)) {
        Some(Ok(c)) if errors.is_empty() => c,
        Some(Err(msg)) => return Err(ApiError::field("content", msg)),
        _ => return Err(ApiError::Validation(errors)),
    };
    let photos = Media::check(&fields.1, "files", media::MAX_PHOTOS)
        .map_err(|msg| ApiError::field("files", msg))?;
    // Back-pressure: a tweet accepted now would reach its followers late.
    if let Some(secs) = state.backlog.refuse() {
        return Err(ApiError::Busy(
            secs,
            "The fan-out of new tweets is behind; try again shortly.",
        ));
    }
    if let Some(circle) = circle {
        circles::check_can_post(&state.db, circle, auth.user_id).await?;
    }
    // Files first, under fresh keys; if the tweet then fails, they go again.
    let photo_urls = state.media.put_all("photos", photos).await?;
    let new = NewTweet {
        content,
        circle_id: circle,
        photo_urls,
        coordinates,
        place: None,
    };
    let (db, cache, pull) = (&state.db, &state.cache, &state.pull);
    let created = tweets::create(db, cache, pull, auth.user_id, &new, || {
        state.worker.announce()
    })
    .await;
    let (record, object) = match created {
        Ok(created) => created,
        Err(e) => {
            state.media.delete_urls(&new.photo_urls).await;
            return Err(e.into());
        }
    };
    let tweet = match object {
        Some(tweet) => tweet,
        None => {
            let author = auth.user(&state).await?;
            Tweet::new(record, author, &TweetCounts::default(), false)
        }
    };
    Ok((StatusCode::CREATED, Json(tweet)))
}

/// How many comments and likes a `TweetDetail` carries.
const DETAIL_NEWEST: usize = 20;

/// `TweetDetail`: the tweet with its newest comments and likes.
#[derive(Serialize)]
struct TweetDetail {
    #[serde(flatten)]
    tweet: Tweet,
    comments: Vec<Comment>,
    likes: Vec<Like>,
}

async fn detail(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
) -> ApiResult<Json<TweetDetail>> {
    let (record, counts, author) = tweets::load(&state.db, &state.cache, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let viewer = caller.id();
    let has_liked = counts.likes > 0
        && !likes::liked_tweets(&state.db, &state.cache, viewer, &[id])
            .await?
            .is_empty();
    let (db, cache, first) = (&state.db, &state.cache, &PageRequest::first(DETAIL_NEWEST));
    // The tweet's exact counters (read with it) say which lists can be empty: most tweets have
    // no comments or no likes, and those detail pages need no Postgres query at all.
    let newest_comments = async {
        if counts.comments == 0 {
            return Ok(Vec::new());
        }
        let mut comments = state
            .replica
            .read_with(db, viewer, |read| async move {
                Ok(comments::page(db, &read, cache, id, first, viewer).await?)
            })
            .await?;
        comments.truncate(DETAIL_NEWEST);
        ApiResult::Ok(comments)
    };
    let newest_likes = async {
        if counts.likes == 0 {
            return Ok(Vec::new());
        }
        Ok(likes::newest_tweet_likes(db, cache, id, DETAIL_NEWEST as i64).await?)
    };
    let (comments, likes) = tokio::try_join!(newest_comments, newest_likes)?;
    Ok(Json(TweetDetail {
        tweet: Tweet::new(record, author.into(), &counts, has_liked),
        comments,
        likes,
    }))
}

async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    let tweet = tweets::delete(&state.db, &state.cache, auth.user_id, id).await?;
    state.media.delete_urls(&tweet.photo_urls).await;
    Ok(Json(json!({"success": true})))
}

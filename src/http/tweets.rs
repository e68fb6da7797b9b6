//! `/api/tweets/`: a user's tweets, posting, detail, edits (and their history) and deletion.

use axum::Json;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use crate::circles;
use crate::comments::{self, Comment};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::UPLOAD_BODY_BYTES;
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::openapi::{Detail, Page, PageParams, Success};
use crate::http::timeline::{JsonBody, owned_timeline_page};
use crate::likes::{self, Like};
use crate::media::{self, Media};
use crate::model::TweetCounts;
use crate::pagination::PageRequest;
use crate::replies;
use crate::retweets;
use crate::state::AppState;
use crate::timeline::Timeline;
use crate::tweets::{self, NewTweet, Tweet};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create).layer(DefaultBodyLimit::max(UPLOAD_BODY_BYTES)))
        .routes(routes!(detail, remove, edit))
        .routes(routes!(history))
        .routes(routes!(context))
        .routes(routes!(retweet))
        .routes(routes!(unretweet))
}

/// A user's tweets, newest first.
#[utoipa::path(get, path = "/api/tweets", tag = "tweets",
    params(("user_id" = i64, Query, description = "The author (404 if no such user)"), PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = Page<Tweet>,
        description = "A page; `has_liked` is the caller's")))]
async fn list(
    State(state): State<AppState>,
    caller: MaybeAuth,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let user_id = query.required_id("user_id")?;
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::UserTweets(user_id), &req, &caller).await
}

/// The body of a new tweet.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct TweetBody {
    /// 1–280 characters after trimming.
    #[schema(min_length = 1)]
    content: String,
    /// The circle to post into (the caller must be a member); absent, null or "": none.
    circle_id: Option<i64>,
    /// The tweet this one replies to (400 if there is none); absent, null or "": not a reply.
    in_reply_to_tweet_id: Option<i64>,
    /// Longitude in degrees, with `lat`.
    #[schema(minimum = -180.0, maximum = 180.0)]
    lon: Option<f64>,
    /// Latitude in degrees, with `lon`.
    #[schema(minimum = -90.0, maximum = 90.0)]
    lat: Option<f64>,
}

/// The multipart form of a new tweet: the fields, and up to 9 photos.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct TweetUpload {
    #[schema(min_length = 1)]
    content: String,
    circle_id: Option<i64>,
    in_reply_to_tweet_id: Option<i64>,
    #[schema(minimum = -180.0, maximum = 180.0)]
    lon: Option<f64>,
    #[schema(minimum = -90.0, maximum = 90.0)]
    lat: Option<f64>,
    /// 0–9 images (JPEG, PNG, GIF or WebP by content, ≤ 5 MiB, ≤ 8192 px a side each), in
    /// order; repeat the part.
    #[schema(value_type = Option<Vec<String>>, format = Binary)]
    files: Option<Vec<Vec<u8>>>,
}

/// Posts a tweet; it is fanned out to the author's followers (or pulled, for a large account).
#[utoipa::path(post, path = "/api/tweets", tag = "tweets",
    security(("bearer" = [])),
    request_body(content(
        (TweetBody = "application/json"),
        (TweetBody = "application/x-www-form-urlencoded"),
        (TweetUpload = "multipart/form-data"),
    )),
    responses(
        (status = 201, body = Tweet, description = "The new tweet"),
        (status = 403, body = Detail, description = "Not a member of `circle_id`, or blocked by (or blocking) the author of `in_reply_to_tweet_id`"),
    ))]
async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Tweet>)> {
    let mut errors = FieldErrors::new();
    let raw = fields.required_text("content", &mut errors);
    let circle = fields.optional_id("circle_id", &mut errors);
    let in_reply_to = fields.optional_id("in_reply_to_tweet_id", &mut errors);
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
        in_reply_to_tweet_id: in_reply_to,
        retweeted_tweet_id: None,
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
            return Err(e);
        }
    };
    let tweet = match object {
        Some(tweet) => tweet,
        None => {
            let author = auth.user(&state).await?;
            let tweet = Tweet::new(record, author, &TweetCounts::default(), false);
            crate::tweets::complete(&state.db, &state.cache, Some(auth.user_id), tweet).await?
        }
    };
    Ok((StatusCode::CREATED, Json(tweet)))
}

/// How many comments and likes a `TweetDetail` carries.
const DETAIL_NEWEST: usize = 20;

/// `TweetDetail`: the tweet with its newest comments and likes.
#[derive(Serialize, ToSchema)]
struct TweetDetail {
    #[serde(flatten)]
    tweet: Tweet,
    comments: Vec<Comment>,
    likes: Vec<Like>,
}

/// A tweet with its newest 20 comments and 20 likes.
#[utoipa::path(get, path = "/api/tweets/{id}", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet")),
    security((), ("bearer" = [])),
    responses((status = 200, body = TweetDetail, description = "The tweet")))]
async fn detail(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
) -> ApiResult<Json<TweetDetail>> {
    let (record, counts, author) = tweets::load(&state.db, &state.cache, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let viewer = caller.id();
    if caller.blocked_by(&state, record.user_id).await? {
        return Err(ApiError::NotFound);
    }
    let has_liked = has_liked(&state, viewer, id, counts.likes).await?;
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
    let tweet = Tweet::new(record, author.into(), &counts, has_liked);
    let (comments, likes, tweet) = tokio::try_join!(
        newest_comments,
        newest_likes,
        crate::tweets::complete(db, cache, viewer, tweet)
    )?;
    Ok(Json(TweetDetail {
        tweet,
        comments,
        likes,
    }))
}

/// The body of an edit.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct TweetEdit {
    /// The new text: 1–280 characters after trimming.
    #[schema(min_length = 1, max_length = 280, pattern = r"\S")]
    content: String,
}

/// Edits the text of the caller's tweet, within an hour of posting.
///
/// Invalid content, or more than an hour after posting: 400 naming `content`. From the moment this answers, every process serves the new text (pages, detail, streams);
/// open streams get an `edit` event. The same text again changes nothing.
#[utoipa::path(patch, path = "/api/tweets/{id}", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet")),
    security(("bearer" = [])),
    request_body = TweetEdit,
    responses(
        (status = 200, body = Tweet, description = "The edited tweet"),
        (status = 403, body = Detail, description = "Not the caller's tweet"),
    ))]
async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<Tweet>> {
    let mut errors = FieldErrors::new();
    let content = match fields.required_text("content", &mut errors) {
        Some(raw) => tweets::validate_content(&raw).map_err(|m| ApiError::field("content", m))?,
        None => return Err(ApiError::Validation(errors)),
    };
    let mut tweet = tweets::edit(&state.db, &state.cache, auth.user_id, id, &content).await?;
    tweet.has_liked = has_liked(&state, Some(auth.user_id), id, tweet.likes_count).await?;
    Ok(Json(tweet))
}

/// Whether `viewer` liked tweet `id`, which has `likes` likes (a tweet nobody liked needs no
/// lookup).
async fn has_liked(state: &AppState, viewer: Option<i64>, id: i64, likes: i64) -> ApiResult<bool> {
    Ok(likes > 0
        && !likes::liked_tweets(&state.db, &state.cache, viewer, &[id])
            .await?
            .is_empty())
}

/// A tweet's versions.
#[derive(Serialize, ToSchema)]
struct TweetHistory {
    tweet_id: i64,
    /// Every text the tweet had, oldest (as posted, version 0) first; the last is its text now.
    versions: Vec<tweets::TweetVersion>,
}

/// The versions of a tweet's text, oldest first.
#[utoipa::path(get, path = "/api/tweets/{id}/history", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet")),
    security((), ("bearer" = [])),
    responses((status = 200, body = TweetHistory, description = "Its versions")))]
async fn history(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
) -> ApiResult<Json<TweetHistory>> {
    let (author, versions) = tweets::history(&state.db, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    if caller.blocked_by(&state, author).await? {
        return Err(ApiError::NotFound);
    }
    Ok(Json(TweetHistory {
        tweet_id: id,
        versions,
    }))
}

/// A tweet's thread around it: the tweets it replies to and the replies below it (Mastodon's
/// `GET /api/v1/statuses/:id/context`), without accounts the caller mutes or blocks.
#[utoipa::path(get, path = "/api/tweets/{id}/context", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet"),
        ("created_at__gt" = Option<String>, Query,
            description = "Only descendants after this time (the next page: the last one's `created_at`)"),
        ("created_at__lt" = Option<String>, Query, description = "Only descendants before this time"),
        ("page_size" = Option<u32>, Query, minimum = 1, maximum = 100,
            description = "Descendants per page (default 20)")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, body = replies::Context,
            description = "Ancestors (oldest first) and a page of descendants (oldest first)"),
        (status = 404, body = Detail, description = "No such tweet, or its author blocks the caller"),
    ))]
async fn context(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<replies::Context>> {
    let req = query.forward_page()?;
    let hidden = caller.hidden(&state).await?;
    let (db, cache) = (&state.db, &state.cache);
    let context = replies::context(db, cache, id, caller.id(), &hidden, &req).await?;
    Ok(Json(context))
}

/// Deletes the caller's tweet (with its comments, likes and photos).
#[utoipa::path(delete, path = "/api/tweets/{id}", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Success, description = "Deleted"),
        (status = 403, body = Detail, description = "Not the caller's tweet"),
    ))]
async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Success>> {
    let tweet = tweets::delete(&state.db, &state.cache, auth.user_id, id).await?;
    state.media.delete_urls(&tweet.photo_urls).await;
    Ok(Json(Success { success: true }))
}

/// Retweets a tweet (a retweet of a retweet retweets its original).
///
/// The retweet is a newsfeed entry for the caller's followers; a tweet appears at most once in
/// a reader's newsfeed, however many of its followings retweet it (the first entry stays).
/// The author is notified (`retweeted your tweet`).
#[utoipa::path(post, path = "/api/tweets/{id}/retweet", tag = "tweets",
    params(("id" = i64, Path, description = "The tweet")),
    security(("bearer" = [])),
    responses(
        (status = 201, body = Tweet, description = "The new retweet, with `retweeted_tweet`"),
        (status = 200, body = Tweet, description = "Retweeted already: that retweet"),
        (status = 403, body = Detail, description = "The author blocks the caller, or the caller blocks the author"),
        (status = 404, body = Detail, description = "No such tweet"),
    ))]
async fn retweet(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<Tweet>)> {
    // Back-pressure, as for a tweet: a retweet is fanned out too.
    if let Some(secs) = state.backlog.refuse() {
        return Err(ApiError::Busy(
            secs,
            "The fan-out of new tweets is behind; try again shortly.",
        ));
    }
    let (db, cache, pull) = (&state.db, &state.cache, &state.pull);
    let (tweet, created) = retweets::retweet(db, cache, pull, auth.user_id, id, || {
        state.worker.announce()
    })
    .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(tweet)))
}

/// The answer of an unretweet.
#[derive(Serialize, ToSchema)]
struct Unretweeted {
    success: bool,
    /// Retweets deleted: 1, or 0 if the caller had not retweeted the tweet.
    deleted: u64,
}

/// Takes back the caller's retweet of a tweet.
///
/// Readers whose newsfeed showed the tweet by this retweet get the next one (another
/// following's retweet, or the tweet itself), as a new entry.
#[utoipa::path(post, path = "/api/tweets/{id}/unretweet", tag = "tweets",
    params(("id" = i64, Path, description = "The retweeted tweet")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Unretweeted, description = "Done"),
        (status = 404, body = Detail, description = "No such tweet"),
    ))]
async fn unretweet(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Unretweeted>> {
    let deleted = retweets::unretweet(&state.db, &state.cache, auth.user_id, id).await?;
    Ok(Json(Unretweeted {
        success: true,
        deleted,
    }))
}

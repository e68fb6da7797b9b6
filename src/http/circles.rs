//! `/api/circles/`: circles, membership, their tweets and their daily rank.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::circles::{self, Circle, CircleRow, Ranked};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::openapi::{self, Deleted, Duplicate, PageParams};
use crate::http::timeline::{JsonBody, owned_timeline_page};
use crate::lists::{Added, Member};
use crate::pagination::Page;
use crate::state::AppState;
use crate::timeline::Timeline;
use crate::tweets::Tweet;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(all, create))
        .routes(routes!(detail))
        .routes(routes!(join))
        .routes(routes!(leave))
        .routes(routes!(members))
        .routes(routes!(circle_tweets))
        .routes(routes!(rank))
}

/// The body of a new circle.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewCircle {
    /// Trimmed, then 1–50 characters; unique case-insensitively.
    #[schema(min_length = 1, max_length = 50, pattern = r"\S")]
    name: String,
    /// Trimmed, at most 280 characters (absent or null: `""`).
    #[schema(max_length = 280)]
    description: Option<String>,
}

/// A circle's rank of one day: `{"date", "results": [Ranked]}`.
#[derive(Serialize, ToSchema)]
pub struct CircleRank {
    /// The UTC day, `YYYY-MM-DD`.
    #[schema(format = Date)]
    pub date: String,
    /// The day's tweets by score, ties newest first.
    pub results: Vec<Ranked>,
}

async fn object(state: &AppState, row: CircleRow, viewer: Option<i64>) -> ApiResult<Circle> {
    circles::objects(&state.db, &state.cache, vec![row], viewer)
        .await?
        .pop()
        .ok_or(ApiError::NotFound)
}

async fn exists(state: &AppState, id: i64) -> ApiResult<()> {
    circles::get(&state.db, id)
        .await?
        .map(|_| ())
        .ok_or(ApiError::NotFound)
}

/// Creates a circle; the caller is its owner and first member.
#[utoipa::path(post, path = "/api/circles", tag = "circles",
    request_body = NewCircle,
    security(("bearer" = [])),
    responses((status = 201, body = Circle, description = "The new circle")))]
async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Circle>)> {
    let mut errors = FieldErrors::new();
    let name = fields.required_text("name", &mut errors);
    let description = fields.text("description", &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let (name, description) = circles::validate(name, description)?;
    let row = circles::create(&state.db, auth.user_id, &name, &description).await?;
    Ok((
        StatusCode::CREATED,
        Json(object(&state, row, Some(auth.user_id)).await?),
    ))
}

/// Every circle, newest first.
#[utoipa::path(get, path = "/api/circles", tag = "circles",
    params(PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = openapi::Page<Circle>,
        description = "A page of circles (`is_member` is the caller's)")))]
async fn all(
    State(state): State<AppState>,
    caller: MaybeAuth,
    query: QueryMap,
) -> ApiResult<Json<Page<Circle>>> {
    let req = query.page()?;
    let page = Page::from_items(circles::all(&state.db, &req).await?, &req);
    let results = circles::objects(&state.db, &state.cache, page.results, caller.id()).await?;
    Ok(Json(Page {
        has_next_page: page.has_next_page,
        results,
    }))
}

/// A circle.
#[utoipa::path(get, path = "/api/circles/{id}", tag = "circles",
    params(("id" = i64, Path, description = "The circle")),
    security((), ("bearer" = [])),
    responses((status = 200, body = Circle, description = "The circle")))]
async fn detail(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
) -> ApiResult<Json<Circle>> {
    let row = circles::get(&state.db, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(object(&state, row, caller.id()).await?))
}

/// Joins a circle (again: changes nothing).
#[utoipa::path(post, path = "/api/circles/{id}/join", tag = "circles",
    params(("id" = i64, Path, description = "The circle")),
    security(("bearer" = [])),
    responses((status = 201, body = Duplicate,
        description = "A member; `duplicate`: whether they were one already")))]
async fn join(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<Duplicate>)> {
    let duplicate = circles::join(&state.db, auth.user_id, id).await? == Added::Duplicate;
    Ok((
        StatusCode::CREATED,
        Json(Duplicate {
            success: true,
            duplicate,
        }),
    ))
}

/// Leaves a circle (the owner too, who stays its owner); tweets posted into it stay.
#[utoipa::path(post, path = "/api/circles/{id}/leave", tag = "circles",
    params(("id" = i64, Path, description = "The circle")),
    security(("bearer" = [])),
    responses((status = 200, body = Deleted,
        description = "Not a member; `deleted`: 1 if they were one, else 0")))]
async fn leave(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Deleted>> {
    let deleted = circles::leave(&state.db, auth.user_id, id).await?;
    Ok(Json(Deleted {
        success: true,
        deleted: u8::from(deleted > 0),
    }))
}

/// A circle's members, newest member first.
#[utoipa::path(get, path = "/api/circles/{id}/members", tag = "circles",
    params(("id" = i64, Path, description = "The circle"), PageParams),
    responses((status = 200, body = openapi::Page<Member>,
        description = "A page of members; `created_at` is when they joined")))]
async fn members(
    State(state): State<AppState>,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<Page<Member>>> {
    let req = query.page()?;
    exists(&state, id).await?;
    Ok(Json(
        circles::members(&state.db, &state.cache, id, &req).await?,
    ))
}

/// The tweets posted into a circle, newest first.
#[utoipa::path(get, path = "/api/circles/{id}/tweets", tag = "circles",
    params(("id" = i64, Path, description = "The circle"), PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = openapi::Page<Tweet>,
        description = "A page of tweets (`has_liked` for a logged-in caller)")))]
async fn circle_tweets(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::Circle(id), &req, &caller).await
}

/// A circle's best tweets of one UTC day.
///
/// By score = `likes_count + comments_count` at the time of the answer; ranks 1, 2, 3, … with
/// ties broken newest first.
#[utoipa::path(get, path = "/api/circles/{id}/rank", tag = "circles",
    params(
        ("id" = i64, Path, description = "The circle"),
        ("date" = Option<String>, Query, format = Date,
            description = "The UTC day, `YYYY-MM-DD`: today (the default) or up to 30 days back"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100,
            description = "Most entries (default 20)"),
    ),
    security((), ("bearer" = [])),
    responses((status = 200, body = CircleRank, description = "The day's rank")))]
async fn rank(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<CircleRank>> {
    let day = circles::parse_day(query.0.get("date").map(String::as_str))?;
    let limit = match query.0.get("limit").map(|l| l.trim()) {
        None | Some("") => 20,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=circles::MAX_RANK_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::field(
                    "limit",
                    format!(
                        "Ensure this value is between 1 and {}.",
                        circles::MAX_RANK_LIMIT
                    ),
                )
            })?,
    };
    let results = circles::rank(&state.db, &state.cache, id, day, limit, caller.id()).await?;
    Ok(Json(CircleRank {
        date: day.format("%Y-%m-%d").to_string(),
        results,
    }))
}

//! `/api/circles/`: circles, membership, their tweets and their daily rank.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::circles::{self, Circle, CircleRow};
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::timeline::{JsonBody, owned_timeline_page};
use crate::lists::{Added, Member};
use crate::pagination::Page;
use crate::state::AppState;
use crate::timeline::Timeline;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/circles", get(all).post(create))
        .route("/api/circles/{id}", get(detail))
        .route("/api/circles/{id}/join", post(join))
        .route("/api/circles/{id}/leave", post(leave))
        .route("/api/circles/{id}/members", get(members))
        .route("/api/circles/{id}/tweets", get(circle_tweets))
        .route("/api/circles/{id}/rank", get(rank))
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

async fn join(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let duplicate = circles::join(&state.db, auth.user_id, id).await? == Added::Duplicate;
    Ok((
        StatusCode::CREATED,
        Json(json!({"success": true, "duplicate": duplicate})),
    ))
}

async fn leave(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    let deleted = circles::leave(&state.db, auth.user_id, id).await?;
    Ok(Json(json!({"success": true, "deleted": deleted})))
}

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

async fn circle_tweets(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::Circle(id), &req, caller.id()).await
}

async fn rank(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
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
    Ok(Json(json!({
        "date": day.format("%Y-%m-%d").to_string(),
        "results": results,
    })))
}

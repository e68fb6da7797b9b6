//! `/api/lists/`: lists, their members and their timelines.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::timeline::{JsonBody, owned_timeline_page};
use crate::lists::{self, Added, List, ListRow, Member};
use crate::pagination::Page;
use crate::state::AppState;
use crate::timeline::Timeline;
use crate::users;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/lists", get(by_owner).post(create))
        .route("/api/lists/{id}", get(detail).delete(remove))
        .route("/api/lists/{id}/members", get(members).post(add_member))
        .route("/api/lists/{id}/members/{user_id}", delete(remove_member))
        .route("/api/lists/{id}/timeline", get(list_timeline))
}

async fn object(state: &AppState, row: ListRow) -> ApiResult<List> {
    lists::objects(&state.db, &state.cache, vec![row])
        .await?
        .pop()
        .ok_or(ApiError::NotFound)
}

async fn create(
    State(state): State<AppState>,
    auth: Auth,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<List>)> {
    let mut errors = FieldErrors::new();
    let name = fields.required_text("name", &mut errors);
    let description = fields.text("description", &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let (name, description) = lists::validate(name, description)?;
    let row = lists::create(&state.db, auth.user_id, &name, &description).await?;
    Ok((StatusCode::CREATED, Json(object(&state, row).await?)))
}

async fn by_owner(State(state): State<AppState>, query: QueryMap) -> ApiResult<Json<Page<List>>> {
    let owner = query.required_id("user_id")?;
    let req = query.page()?;
    if !users::exists(&state.db, owner).await? {
        return Err(ApiError::NotFound);
    }
    let rows = lists::by_owner(&state.db, owner, &req).await?;
    let page = Page::from_items(rows, &req);
    let results = lists::objects(&state.db, &state.cache, page.results).await?;
    Ok(Json(Page {
        has_next_page: page.has_next_page,
        results,
    }))
}

async fn detail(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<List>> {
    let row = lists::get(&state.db, id).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(object(&state, row).await?))
}

async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Value>> {
    lists::delete(&state.db, &state.cache, auth.user_id, id).await?;
    Ok(Json(json!({"success": true})))
}

async fn add_member(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let mut errors = FieldErrors::new();
    let Some(user) = fields.required_id("user_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    match lists::add_member(&state.db, auth.user_id, id, user).await? {
        Added::Duplicate => Ok((
            StatusCode::CREATED,
            Json(json!({"success": true, "duplicate": true})),
        )),
        Added::New(created_at) => {
            state.worker.announce();
            let user = users::load_many(&state.db, &state.cache, &[user])
                .await?
                .remove(&user)
                .ok_or(ApiError::NotFound)?;
            let member = Member {
                user: user.into(),
                created_at,
            };
            Ok((StatusCode::CREATED, Json(json!(member))))
        }
    }
}

async fn remove_member(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path((id, user)): axum::extract::Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let (Ok(id), Ok(user)) = (id.parse::<i64>(), user.parse::<i64>()) else {
        return Err(ApiError::NotFound);
    };
    let deleted = lists::remove_member(&state.db, auth.user_id, id, user).await?;
    if deleted > 0 {
        state.worker.announce();
    }
    Ok(Json(json!({"success": true, "deleted": deleted})))
}

async fn members(
    State(state): State<AppState>,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<Json<Page<Member>>> {
    let req = query.page()?;
    if lists::get(&state.db, id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    Ok(Json(
        lists::members(&state.db, &state.cache, id, &req).await?,
    ))
}

async fn list_timeline(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::List(id), &req, caller.id()).await
}

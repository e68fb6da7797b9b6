//! `/api/lists/`: lists, their members and their timelines.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth, PathId, QueryMap};
use crate::http::openapi::{self, Deleted, Detail, NewOrDuplicate, PageParams, Success};
use crate::http::timeline::{JsonBody, owned_timeline_page};
use crate::lists::{self, Added, List, ListRow, Member};
use crate::pagination::Page;
use crate::state::AppState;
use crate::timeline::Timeline;
use crate::tweets::Tweet;
use crate::users;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(by_owner, create))
        .routes(routes!(detail, remove))
        .routes(routes!(members, add_member))
        .routes(routes!(remove_member))
        .routes(routes!(list_timeline))
}

/// The body of a new list.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewList {
    /// Trimmed, then 1–25 characters; distinct among the owner's lists.
    #[schema(min_length = 1, max_length = 25, pattern = r"\S")]
    name: String,
    /// Trimmed, at most 100 characters (absent or null: `""`).
    #[schema(max_length = 100)]
    description: Option<String>,
}

/// The body of a new list member.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct NewListMember {
    /// The user to add (an integer, or a decimal string).
    user_id: i64,
}

async fn object(state: &AppState, row: ListRow) -> ApiResult<List> {
    lists::objects(&state.db, &state.cache, vec![row])
        .await?
        .pop()
        .ok_or(ApiError::NotFound)
}

/// Creates a list owned by the caller.
#[utoipa::path(post, path = "/api/lists", tag = "lists",
    request_body = NewList,
    security(("bearer" = [])),
    responses((status = 201, body = List, description = "The new list")))]
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

/// The lists a user owns, newest first.
#[utoipa::path(get, path = "/api/lists", tag = "lists",
    params(PageParams, ("user_id" = i64, Query, description = "The owner (404 if no such user)")),
    responses((status = 200, body = openapi::Page<List>,
        description = "A page of the user's lists")))]
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

/// A list.
#[utoipa::path(get, path = "/api/lists/{id}", tag = "lists",
    params(("id" = i64, Path, description = "The list")),
    responses((status = 200, body = List, description = "The list")))]
async fn detail(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<List>> {
    let row = lists::get(&state.db, id).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(object(&state, row).await?))
}

/// Deletes one of the caller's lists, with its members and its timeline.
#[utoipa::path(delete, path = "/api/lists/{id}", tag = "lists",
    params(("id" = i64, Path, description = "The list")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Success, description = "Deleted"),
        (status = 403, body = Detail, description = "The caller does not own the list"),
    ))]
async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
) -> ApiResult<Json<Success>> {
    lists::delete(&state.db, &state.cache, auth.user_id, id).await?;
    Ok(Json(Success { success: true }))
}

/// Adds a user to one of the caller's lists; their recent tweets join its timeline.
#[utoipa::path(post, path = "/api/lists/{id}/members", tag = "lists",
    params(("id" = i64, Path, description = "The list")),
    request_body = NewListMember,
    security(("bearer" = [])),
    responses(
        (status = 201, body = NewOrDuplicate<Member>,
            description = "The new member, or `{\"success\": true, \"duplicate\": true}` if \
                they were one already (nothing changed)"),
        (status = 403, body = Detail, description = "The caller does not own the list"),
    ))]
async fn add_member(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<NewOrDuplicate<Member>>)> {
    let mut errors = FieldErrors::new();
    let Some(user) = fields.required_id("user_id", &mut errors) else {
        return Err(ApiError::Validation(errors));
    };
    match lists::add_member(&state.db, auth.user_id, id, user).await? {
        Added::Duplicate => Ok((StatusCode::CREATED, Json(NewOrDuplicate::duplicate()))),
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
            Ok((StatusCode::CREATED, Json(NewOrDuplicate::New(member))))
        }
    }
}

/// Removes a user from one of the caller's lists; their tweets leave its timeline.
#[utoipa::path(delete, path = "/api/lists/{id}/members/{user_id}", tag = "lists",
    params(
        ("id" = i64, Path, description = "The list"),
        ("user_id" = i64, Path, description = "The member"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Deleted, description = "`deleted`: 1 if they were a member, else 0"),
        (status = 403, body = Detail, description = "The caller does not own the list"),
    ))]
async fn remove_member(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path((id, user)): axum::extract::Path<(String, String)>,
) -> ApiResult<Json<Deleted>> {
    let (Ok(id), Ok(user)) = (id.parse::<i64>(), user.parse::<i64>()) else {
        return Err(ApiError::NotFound);
    };
    let deleted = lists::remove_member(&state.db, auth.user_id, id, user).await?;
    if deleted > 0 {
        state.worker.announce();
    }
    Ok(Json(Deleted {
        success: true,
        deleted: u8::from(deleted > 0),
    }))
}

/// A list's members, newest member first.
#[utoipa::path(get, path = "/api/lists/{id}/members", tag = "lists",
    params(("id" = i64, Path, description = "The list"), PageParams),
    responses((status = 200, body = openapi::Page<Member>,
        description = "A page of members; `created_at` is when they were added")))]
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

/// A list's timeline: its members' tweets, newest first.
///
/// A `created_at__gt` refresh also returns tweets that arrived after the cursor although older
/// (a new member's backfill).
#[utoipa::path(get, path = "/api/lists/{id}/timeline", tag = "lists",
    params(("id" = i64, Path, description = "The list"), PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = openapi::Page<Tweet>,
        description = "A page of tweets (`has_liked` for a logged-in caller)")))]
async fn list_timeline(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(id): PathId,
    query: QueryMap,
) -> ApiResult<JsonBody> {
    let req = query.page()?;
    owned_timeline_page(&state, Timeline::List(id), &req, &caller).await
}

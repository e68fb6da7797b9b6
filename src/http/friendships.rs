//! `/api/friendships/{user_id}/*`: follow, unfollow, followers, followings.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult};
use crate::friendships::{self, Direction, Followed, Friendship};
use crate::http::extract::{Auth, MaybeAuth, PathId, QueryMap};
use crate::http::openapi::{Deleted, NewOrDuplicate, PageParams};
use crate::pagination::Page;
use crate::state::AppState;
use crate::users;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(follow))
        .routes(routes!(unfollow))
        .routes(routes!(followers))
        .routes(routes!(followings))
}

/// Follows a user (their recent tweets are backfilled into the caller's newsfeed).
#[utoipa::path(post, path = "/api/friendships/{id}/follow", tag = "friendships",
    params(("id" = i64, Path, description = "The user to follow (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 201, body = NewOrDuplicate<Friendship>,
        description = "The friendship (the followed user, `has_followed: true`), or \
            `{\"success\": true, \"duplicate\": true}` when already following")))]
async fn follow(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<(StatusCode, Json<NewOrDuplicate<Friendship>>)> {
    match friendships::follow(&state.db, &state.cache, auth.user_id, target).await? {
        Followed::Duplicate => Ok((StatusCode::CREATED, Json(NewOrDuplicate::duplicate()))),
        Followed::New(created_at) => {
            state.worker.announce();
            let user = users::load_many(&state.db, &state.cache, &[target])
                .await?
                .remove(&target)
                .ok_or(ApiError::NotFound)?;
            let friendship = Friendship {
                user: user.into(),
                created_at,
                has_followed: true,
            };
            Ok((StatusCode::CREATED, Json(NewOrDuplicate::New(friendship))))
        }
    }
}

/// Unfollows a user (their tweets leave the caller's newsfeed).
#[utoipa::path(post, path = "/api/friendships/{id}/unfollow", tag = "friendships",
    params(("id" = i64, Path, description = "The user to unfollow (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 200, body = Deleted,
        description = "`deleted`: 1 if the caller followed them")))]
async fn unfollow(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Deleted>> {
    let deleted = friendships::unfollow(&state.db, &state.cache, auth.user_id, target).await?;
    if deleted > 0 {
        state.worker.announce();
    }
    Ok(Json(Deleted {
        success: true,
        deleted: u8::from(deleted > 0),
    }))
}

/// Who follows a user, newest first.
#[utoipa::path(get, path = "/api/friendships/{id}/followers", tag = "friendships",
    params(("id" = i64, Path, description = "The user"), PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = Page<Friendship>,
        description = "A page; `has_followed`: whether the caller follows each one")))]
async fn followers(
    state: State<AppState>,
    caller: MaybeAuth,
    user: PathId,
    query: QueryMap,
) -> ApiResult<Json<Page<Friendship>>> {
    list(state, caller, user, query, Direction::Followers).await
}

/// Whom a user follows, newest first.
#[utoipa::path(get, path = "/api/friendships/{id}/followings", tag = "friendships",
    params(("id" = i64, Path, description = "The user"), PageParams),
    security((), ("bearer" = [])),
    responses((status = 200, body = Page<Friendship>,
        description = "A page; `has_followed`: whether the caller follows each one")))]
async fn followings(
    state: State<AppState>,
    caller: MaybeAuth,
    user: PathId,
    query: QueryMap,
) -> ApiResult<Json<Page<Friendship>>> {
    list(state, caller, user, query, Direction::Followings).await
}

/// A page of followers or followings, from the replica when it may serve this caller.
async fn list(
    State(state): State<AppState>,
    caller: MaybeAuth,
    PathId(user): PathId,
    query: QueryMap,
    direction: Direction,
) -> ApiResult<Json<Page<Friendship>>> {
    let req = query.page()?;
    let (db, cache, req) = (&state.db, &state.cache, &req);
    let viewer = caller.id();
    let page = state
        .replica
        .read_with(db, viewer, |read| async move {
            friendships::list(db, &read, cache, user, direction, req, viewer).await
        })
        .await?;
    Ok(Json(page))
}

//! `/api/friendships/{user_id}/*`: follow, unfollow, followers, followings.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::friendships::{self, Direction, Followed, Friendship};
use crate::http::extract::{Auth, MaybeAuth, PathId, QueryMap};
use crate::pagination::Page;
use crate::state::AppState;
use crate::users;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/friendships/{id}/follow", post(follow))
        .route("/api/friendships/{id}/unfollow", post(unfollow))
        .route("/api/friendships/{id}/followers", get(followers))
        .route("/api/friendships/{id}/followings", get(followings))
}

async fn follow(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<(StatusCode, Json<Value>)> {
    match friendships::follow(&state.db, &state.cache, auth.user_id, target).await? {
        Followed::Duplicate => Ok((
            StatusCode::CREATED,
            Json(json!({"success": true, "duplicate": true})),
        )),
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
            Ok((StatusCode::CREATED, Json(json!(friendship))))
        }
    }
}

async fn unfollow(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Value>> {
    let deleted = friendships::unfollow(&state.db, &state.cache, auth.user_id, target).await?;
    if deleted > 0 {
        state.worker.announce();
    }
    Ok(Json(json!({"success": true, "deleted": deleted})))
}

async fn followers(
    state: State<AppState>,
    caller: MaybeAuth,
    user: PathId,
    query: QueryMap,
) -> ApiResult<Json<Page<Friendship>>> {
    list(state, caller, user, query, Direction::Followers).await
}

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
    let page = state
        .replica
        .read_with(db, caller.id(), |read| async move {
            friendships::list(db, &read, cache, user, direction, req, caller.id()).await
        })
        .await?;
    Ok(Json(page))
}

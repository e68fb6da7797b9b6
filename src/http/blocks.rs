//! `/api/users/{id}/mute|unmute|block|unblock/`, `/api/mutes/`, `/api/blocks/`: the caller's
//! mutes and blocks (private to them; see [`crate::blocks`]).

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::blocks::{self, Related, Relation};
use crate::error::ApiResult;
use crate::http::extract::{Auth, PathId, QueryMap};
use crate::http::openapi::{self, PageParams};
use crate::pagination::Page;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(mute))
        .routes(routes!(unmute))
        .routes(routes!(block))
        .routes(routes!(unblock))
        .routes(routes!(mutes))
        .routes(routes!(blocks))
}

/// `{"success": true, "muting": bool}`: whether the caller now mutes the user.
#[derive(Serialize, ToSchema)]
pub struct Muting {
    pub success: bool,
    pub muting: bool,
}

/// `{"success": true, "blocking": bool}`: whether the caller now blocks the user.
#[derive(Serialize, ToSchema)]
pub struct Blocking {
    pub success: bool,
    pub blocking: bool,
}

async fn set_mute(state: AppState, me: i64, target: i64, on: bool) -> ApiResult<Json<Muting>> {
    let muting = blocks::set(&state.db, &state.cache, me, target, Relation::Mute, on).await?;
    Ok(Json(Muting {
        success: true,
        muting,
    }))
}

async fn set_block(state: AppState, me: i64, target: i64, on: bool) -> ApiResult<Json<Blocking>> {
    let blocking = blocks::set(&state.db, &state.cache, me, target, Relation::Block, on).await?;
    if on {
        // The follow edges it removed queued unmerge jobs.
        state.worker.announce();
    }
    Ok(Json(Blocking {
        success: true,
        blocking,
    }))
}

/// Mutes a user: from the moment this answers, nothing by them appears in the caller's
/// newsfeed, list and circle timelines, streams or notifications, on every process.
#[utoipa::path(post, path = "/api/users/{id}/mute", tag = "blocks",
    params(("id" = i64, Path, description = "The user to mute (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 200, body = Muting, description = "`muting: true` (also if already)")))]
async fn mute(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Muting>> {
    set_mute(state, auth.user_id, target, true).await
}

/// Unmutes a user: their tweets come back, older ones too.
#[utoipa::path(post, path = "/api/users/{id}/unmute", tag = "blocks",
    params(("id" = i64, Path, description = "The user to unmute (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 200, body = Muting, description = "`muting: false` (also if not muted)")))]
async fn unmute(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Muting>> {
    set_mute(state, auth.user_id, target, false).await
}

/// Blocks a user: hides them as a mute does, both ways; removes both follow edges; they can
/// no longer follow the caller or like or comment on the caller's tweets (403), and the
/// caller's tweets are 404 to them.
#[utoipa::path(post, path = "/api/users/{id}/block", tag = "blocks",
    params(("id" = i64, Path, description = "The user to block (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 200, body = Blocking, description = "`blocking: true` (also if already)")))]
async fn block(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Blocking>> {
    set_block(state, auth.user_id, target, true).await
}

/// Unblocks a user (the removed follows stay removed).
#[utoipa::path(post, path = "/api/users/{id}/unblock", tag = "blocks",
    params(("id" = i64, Path, description = "The user to unblock (not the caller: 400)")),
    security(("bearer" = [])),
    responses((status = 200, body = Blocking,
        description = "`blocking: false` (also if not blocked)")))]
async fn unblock(
    State(state): State<AppState>,
    auth: Auth,
    PathId(target): PathId,
) -> ApiResult<Json<Blocking>> {
    set_block(state, auth.user_id, target, false).await
}

/// The accounts the caller mutes, newest mute first.
#[utoipa::path(get, path = "/api/mutes", tag = "blocks",
    params(PageParams),
    security(("bearer" = [])),
    responses((status = 200, body = openapi::Page<Related>,
        description = "A page of User objects, each with `created_at`: when the mute began \
            (the cursor)")))]
async fn mutes(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<Page<Related>>> {
    let req = query.page()?;
    let page = blocks::list(&state.db, &state.cache, auth.user_id, Relation::Mute, &req).await?;
    Ok(Json(page))
}

/// The accounts the caller blocks, newest block first.
#[utoipa::path(get, path = "/api/blocks", tag = "blocks",
    params(PageParams),
    security(("bearer" = [])),
    responses((status = 200, body = openapi::Page<Related>,
        description = "A page of User objects, each with `created_at`: when the block began \
            (the cursor)")))]
async fn blocks(
    State(state): State<AppState>,
    auth: Auth,
    query: QueryMap,
) -> ApiResult<Json<Page<Related>>> {
    let req = query.page()?;
    let page = blocks::list(&state.db, &state.cache, auth.user_id, Relation::Block, &req).await?;
    Ok(Json(page))
}

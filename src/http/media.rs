//! `/media/{key}`: the stored photos and avatars, served with their content type.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/media/{*key}", get(file))
}

async fn file(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let (bytes, mime) = state.media.get(&key).await?.ok_or(ApiError::NotFound)?;
    // Keys are random and never reused: the bytes behind one never change.
    Ok((
        [
            (CONTENT_TYPE, mime),
            (CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        bytes,
    ))
}

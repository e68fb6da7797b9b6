//! `/media/{key}`: the stored photos and avatars, streamed with their content type.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/media/{*key}", get(file))
}

/// The file's bytes, streamed from the store, with its content type and length, immutable
/// caching (keys are random and never reused), `X-Content-Type-Options: nosniff` (a browser
/// never runs a file as anything but the image type it was stored as) and an inline content
/// disposition with its file name.
async fn file(State(state): State<AppState>, Path(key): Path<String>) -> ApiResult<Response> {
    let file = state.media.open(&key).await?.ok_or(ApiError::NotFound)?;
    let name = key.rsplit('/').next().unwrap_or("file");
    let disposition = HeaderValue::from_str(&format!("inline; filename=\"{name}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("inline"));
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static(file.mime)),
            (CONTENT_LENGTH, HeaderValue::from(file.size)),
            (
                CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            ),
            (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (CONTENT_DISPOSITION, disposition),
        ],
        Body::from_stream(file.chunks),
    )
        .into_response())
}

//! `/media/{key}`: the stored photos and avatars, streamed with their content type.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(file))
}

/// A stored file's bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // the body is streamed from the store; this is its schema
struct FileBytes(Vec<u8>);

/// A stored photo or avatar.
///
/// The file's bytes, streamed from the store, with its content type and length, immutable
/// caching (keys are random and never reused), `X-Content-Type-Options: nosniff` (a browser
/// never runs a file as anything but the image type it was stored as) and an inline content
/// disposition with its file name.
#[utoipa::path(get, path = "/media/{*key}", tag = "media",
    params(("key" = String, Path,
        description = "The file's key: the rest of a `photo_urls` or `avatar_url` path after \
            `/media/`, such as `photos/{random}.jpg` or `avatars/{user id}/{random}.png`")),
    responses((status = 200,
        description = "The file's bytes, with the content type of its extension",
        content(
            (inline(FileBytes) = "image/jpeg"),
            (inline(FileBytes) = "image/png"),
            (inline(FileBytes) = "image/gif"),
            (inline(FileBytes) = "image/webp"),
        ),
        headers(
            ("Cache-Control" = String, description = "`public, max-age=31536000, immutable`"),
            ("Content-Disposition" = String, description = "`inline; filename=\"{name}\"`"),
            ("X-Content-Type-Options" = String, description = "`nosniff`"),
        ))))]
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

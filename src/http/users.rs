//! `/api/users/{id}`: profiles.

use axum::Json;
use axum::extract::{DefaultBodyLimit, State};
use utoipa::ToSchema;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::UPLOAD_BODY_BYTES;
use crate::http::extract::{Auth, Fields, PathId};
use crate::http::openapi::Detail;
use crate::media::Media;
use crate::state::AppState;
use crate::users::{self, Profile, ProfileEdit};

/// Longest nickname, in characters.
pub const MAX_NICKNAME: usize = 50;
/// Longest avatar URL, in bytes.
pub const MAX_AVATAR_URL: usize = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(profile, update).layer(DefaultBodyLimit::max(UPLOAD_BODY_BYTES)))
        .routes(routes!(update_profile).layer(DefaultBodyLimit::max(UPLOAD_BODY_BYTES)))
}

/// A user's profile.
#[utoipa::path(get, path = "/api/users/{id}", tag = "users",
    params(("id" = i64, Path, description = "The user's id")),
    responses((status = 200, body = Profile, description = "The profile")))]
async fn profile(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<Profile>> {
    users::profile(&state.db, &state.cache, id)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound)
}

fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let Some(rest) = rest else { return false };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    !host.is_empty() && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The body of a profile edit: an absent field is left alone, `null` or `""` clears it.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct ProfileBody {
    /// At most 50 characters after trimming.
    #[schema(max_length = 50)]
    nickname: Option<String>,
    /// An http(s) URL of at most 500 bytes.
    #[schema(max_length = 500)]
    avatar_url: Option<String>,
}

/// The multipart form of a profile edit: the fields, and an uploaded avatar.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct ProfileUpload {
    #[schema(max_length = 50)]
    nickname: Option<String>,
    #[schema(max_length = 500)]
    avatar_url: Option<String>,
    /// One image (JPEG, PNG, GIF or WebP by content, ≤ 5 MiB, ≤ 8192 px a side); it wins over
    /// `avatar_url`.
    #[schema(value_type = Option<String>, format = Binary)]
    avatar: Option<Vec<u8>>,
}

/// Edits the caller's profile (`PUT` is the same as `PATCH`).
#[utoipa::path(method(patch, put), path = "/api/users/{id}", tag = "users",
    params(("id" = i64, Path, description = "The user's id (the caller's)")),
    security(("bearer" = [])),
    request_body(content(
        (ProfileBody = "application/json"),
        (ProfileBody = "application/x-www-form-urlencoded"),
        (ProfileUpload = "multipart/form-data"),
    )),
    responses(
        (status = 200, body = Profile, description = "The edited profile"),
        (status = 403, body = Detail, description = "Not the caller's profile"),
    ))]
async fn update(
    state: State<AppState>,
    auth: Auth,
    id: PathId,
    fields: Fields,
) -> ApiResult<Json<Profile>> {
    edit(state, auth, id, fields).await
}

/// Edits the caller's profile under the course's path, as a course front end's profile form
/// sends it (nickname and avatar, multipart): the same as `PATCH /api/users/{id}/`, the same
/// validation and answer. chirp keeps one profile per user, under the user's id.
#[utoipa::path(method(put, patch), path = "/api/profiles/{id}", tag = "users",
    params(("id" = i64, Path, description = "The user's id (the caller's)")),
    security(("bearer" = [])),
    request_body(content(
        (ProfileBody = "application/json"),
        (ProfileBody = "application/x-www-form-urlencoded"),
        (ProfileUpload = "multipart/form-data"),
    )),
    responses(
        (status = 200, body = Profile, description = "The edited profile"),
        (status = 403, body = Detail, description = "Not the caller's profile"),
    ))]
async fn update_profile(
    state: State<AppState>,
    auth: Auth,
    id: PathId,
    fields: Fields,
) -> ApiResult<Json<Profile>> {
    edit(state, auth, id, fields).await
}

/// A profile edit ([`update`], [`update_profile`]).
async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    PathId(id): PathId,
    fields: Fields,
) -> ApiResult<Json<Profile>> {
    if !users::exists(&state.db, id).await? {
        return Err(ApiError::NotFound);
    }
    if auth.user_id != id {
        return Err(ApiError::Forbidden);
    }
    let mut errors = FieldErrors::new();
    let mut edit = ProfileEdit::default();
    if fields.has("nickname") {
        let nickname = fields
            .text("nickname", &mut errors)
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty());
        if nickname
            .as_ref()
            .is_some_and(|n| n.chars().count() > MAX_NICKNAME)
        {
            errors.entry("nickname".into()).or_default().push(format!(
                "Ensure this field has no more than {MAX_NICKNAME} characters."
            ));
        }
        edit.nickname = Some(nickname);
    }
    if fields.has("avatar_url") {
        let url = fields
            .text("avatar_url", &mut errors)
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty());
        if url
            .as_ref()
            .is_some_and(|u| u.len() > MAX_AVATAR_URL || !is_http_url(u))
        {
            errors.entry("avatar_url".into()).or_default().push(format!(
                "Enter a valid http(s) URL of at most {MAX_AVATAR_URL} characters."
            ));
        }
        edit.avatar_url = Some(url);
    }
    let avatar = match Media::check(&fields.1, "avatar", 1) {
        Ok(files) => files,
        Err(msg) => {
            errors.entry("avatar".into()).or_default().push(msg);
            Vec::new()
        }
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    // An uploaded avatar replaces `avatar_url`; the file is stored before the row names it.
    // Each user's avatars live under their own directory: only those are ever deleted here.
    let dir = format!("avatars/{id}");
    let stored = state.media.put_all(&dir, avatar).await?;
    if let Some(url) = stored.first() {
        edit.avatar_url = Some(Some(url.clone()));
    }
    let new = edit.avatar_url.clone();
    match users::update_profile(&state.db, &state.cache, id, edit).await {
        Ok(Some((profile, old))) => {
            if let (Some(new), Some(old)) = (new, old)
                && new.as_ref() != Some(&old)
                && state.media.is_in(&old, &dir)
            {
                state.media.delete_urls(&[old]).await;
            }
            Ok(Json(profile))
        }
        Ok(None) => {
            state.media.delete_urls(&stored).await;
            Err(ApiError::NotFound)
        }
        Err(e) => {
            state.media.delete_urls(&stored).await;
            Err(e.into())
        }
    }
}

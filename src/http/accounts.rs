//! `/api/accounts/*`: sign-up, login, logout, login status.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts;
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth};
use crate::http::limits;
use crate::http::openapi::Success;
use crate::state::AppState;
use crate::users::User;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(signup))
        .routes(routes!(login))
        .routes(routes!(logout))
        .routes(routes!(login_status))
}

/// The answer of signup and login: `{"success": true, "user": User, "token"}`.
#[derive(Serialize, ToSchema)]
pub struct Session {
    pub success: bool,
    pub user: User,
    /// The bearer token (opaque; the server stores only its hash).
    pub token: String,
}

/// The body of signup: the username is trimmed and lowercased, the email trimmed.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct SignupBody {
    /// 3–30 of `a-z0-9_`, unique case-insensitively.
    #[schema(min_length = 3, max_length = 30, pattern = "^[A-Za-z0-9_ ]+$")]
    username: String,
    /// A valid address, unique case-insensitively.
    #[schema(format = Email)]
    email: String,
    /// 8–128 characters.
    #[schema(min_length = 8, max_length = 128)]
    password: String,
}

/// The body of login.
#[derive(ToSchema)]
#[allow(dead_code)] // read by the handler as [`Fields`]; this is its schema
struct LoginBody {
    username: String,
    password: String,
}

/// `{"has_logged_in": bool, "user"?: User}`.
#[derive(Serialize, ToSchema)]
pub struct LoginStatus {
    pub has_logged_in: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<User>,
}

/// Signs a new user up and logs them in.
#[utoipa::path(post, path = "/api/accounts/signup", tag = "accounts",
    request_body = SignupBody,
    responses((status = 201, body = Session, description = "Signed up and logged in")))]
async fn signup(
    State(state): State<AppState>,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Session>)> {
    let mut errors = FieldErrors::new();
    let username = fields.required_text("username", &mut errors);
    let email = fields.required_text("email", &mut errors);
    let password = fields.required_secret("password", &mut errors);
    let (username, email, password) =
        accounts::validate_signup(username, email, password, &mut errors)
            .ok_or(ApiError::Validation(errors))?;
    let (user, token) =
        accounts::signup(&state.db, &state.hashing, &username, &email, password).await?;
    // Known to Redis from the start (also to a client over its failed-authentication limit).
    state
        .cache
        .put_token(&accounts::hash_token(&token), user.id)
        .await;
    Ok((
        StatusCode::CREATED,
        Json(Session {
            success: true,
            user,
            token,
        }),
    ))
}

/// A login: a new token.
///
/// Failures count against the username's `login` limit as well as the client's `auth` one;
/// over it, the username's logins are a 429 before any password is hashed.
#[utoipa::path(post, path = "/api/accounts/login", tag = "accounts",
    request_body = LoginBody,
    responses((status = 200, body = Session,
        description = "Logged in; a wrong pair is a 400 `Failure` \
            (username and password does not match)")))]
async fn login(State(state): State<AppState>, fields: Fields) -> ApiResult<Response> {
    let mut errors = FieldErrors::new();
    let username = fields.required_text("username", &mut errors);
    let password = fields.required_secret("password", &mut errors);
    let (Some(username), Some(password)) = (username, password) else {
        return Err(ApiError::Validation(errors));
    };
    let subject = limits::login_subject(&username);
    if let Some(too_many) = limits::login_refused(&state, &subject) {
        return Ok(too_many);
    }
    let (user, token) =
        match accounts::login(&state.db, &state.hashing, username.trim(), password).await {
            Ok(found) => found,
            Err(e @ ApiError::BadRequest(_)) => {
                return Ok(limits::login_failed(&state, &subject, e).await);
            }
            Err(e) => return Err(e),
        };
    state
        .cache
        .put_token(&accounts::hash_token(&token), user.id)
        .await;
    Ok(Json(Session {
        success: true,
        user,
        token,
    })
    .into_response())
}

/// Revokes the caller's token (in every process's memory before it answers).
#[utoipa::path(post, path = "/api/accounts/logout", tag = "accounts",
    security(("bearer" = [])),
    responses((status = 200, body = Success, description = "The token no longer works")))]
async fn logout(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<Success>> {
    accounts::logout(&state.db, &state.cache, &state.tokens, &auth.token).await?;
    Ok(Json(Success { success: true }))
}

/// Whether the request carries a valid token, and whose.
#[utoipa::path(get, path = "/api/accounts/login_status", tag = "accounts",
    security((), ("bearer" = [])),
    responses((status = 200, body = LoginStatus, description = "`user` only when logged in")))]
async fn login_status(
    State(state): State<AppState>,
    caller: MaybeAuth,
) -> ApiResult<Json<LoginStatus>> {
    let Some(id) = caller.id() else {
        return Ok(Json(LoginStatus {
            has_logged_in: false,
            user: None,
        }));
    };
    let user = Auth {
        user_id: id,
        token: String::new(),
        loaded_hidden: None,
    }
    .user(&state)
    .await?;
    Ok(Json(LoginStatus {
        has_logged_in: true,
        user: Some(user),
    }))
}

//! `/api/accounts/*`: sign-up, login, logout, login status.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::accounts;
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::http::extract::{Auth, Fields, MaybeAuth};
use crate::http::limits;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/accounts/signup", post(signup))
        .route("/api/accounts/login", post(login))
        .route("/api/accounts/logout", post(logout))
        .route("/api/accounts/login_status", get(login_status))
}

async fn signup(
    State(state): State<AppState>,
    fields: Fields,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let mut errors = FieldErrors::new();
    let username = fields.required_text("username", &mut errors);
    let email = fields.required_text("email", &mut errors);
    let password = fields.required_text("password", &mut errors);
    let (username, email, password) =
        accounts::validate_signup(username, email, password, &mut errors)
            .ok_or(ApiError::Validation(errors))?;
    let (user, token) = accounts::signup(&state.db, &username, &email, password).await?;
    // Known to Redis from the start (also to a client over its failed-authentication limit).
    state
        .cache
        .put_token(&accounts::hash_token(&token), user.id)
        .await;
    Ok((
        StatusCode::CREATED,
        Json(json!({"success": true, "user": user, "token": token})),
    ))
}

/// A login. Failures count against the username's `login` limit as well as the client's
/// `auth` one; over it, the username's logins are a 429 before any password is hashed.
async fn login(State(state): State<AppState>, fields: Fields) -> ApiResult<Response> {
    let mut errors = FieldErrors::new();
    let username = fields.required_text("username", &mut errors);
    let password = fields.required_text("password", &mut errors);
    let (Some(username), Some(password)) = (username, password) else {
        return Err(ApiError::Validation(errors));
    };
    let subject = limits::login_subject(&username);
    if let Some(too_many) = limits::login_refused(&state, &subject) {
        return Ok(too_many);
    }
    let (user, token) = match accounts::login(&state.db, username.trim(), password).await {
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
    Ok(Json(json!({"success": true, "user": user, "token": token})).into_response())
}

async fn logout(State(state): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    accounts::logout(&state.db, &state.cache, &state.tokens, &auth.token).await?;
    Ok(Json(json!({"success": true})))
}

async fn login_status(State(state): State<AppState>, caller: MaybeAuth) -> ApiResult<Json<Value>> {
    let Some(id) = caller.id() else {
        return Ok(Json(json!({"has_logged_in": false})));
    };
    let user = Auth {
        user_id: id,
        token: String::new(),
    }
    .user(&state)
    .await?;
    Ok(Json(json!({"has_logged_in": true, "user": user})))
}

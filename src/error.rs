//! The one error type of the HTTP layer, rendered as the JSON bodies of docs/API.md.

use std::collections::BTreeMap;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Field name → messages, as in `{"errors": {"username": ["..."]}}`.
pub type FieldErrors = BTreeMap<String, Vec<String>>;

/// Everything a handler can fail with. Each variant maps to one status and JSON body; internal
/// errors are logged and answered with a bare 500 that leaks nothing.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `{"success": false, "message": "Please check input", "errors": {...}}`.
    #[error("validation failed: {0:?}")]
    Validation(FieldErrors),
    /// 400 `{"success": false, "message": <msg>}` (e.g. wrong login).
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// 401: no credentials.
    #[error("authentication credentials were not provided")]
    Unauthenticated,
    /// 401: a token that is unknown, revoked or malformed.
    #[error("invalid token")]
    InvalidToken,
    /// 403: not the owner.
    #[error("permission denied")]
    Forbidden,
    /// 404.
    #[error("not found")]
    NotFound,
    /// 405.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 413, 415 and other plain `{"detail": ...}` answers.
    #[error("{1}")]
    Detail(StatusCode, String),
    /// 503 with `Retry-After` (whole seconds) and the reason: the write would be accepted but
    /// not delivered in time (the fan-out is behind, see [`crate::jobs::Backlog`]), or the
    /// server is at a bound it keeps (password hashing, see [`crate::accounts`]).
    #[error("busy; retry after {0} s")]
    Busy(u64, &'static str),
    /// 500; the cause is logged, never sent.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// A 400 for one field with one message.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        let mut errors = FieldErrors::new();
        errors.insert(field.to_owned(), vec![message.into()]);
        ApiError::Validation(errors)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::Internal(anyhow::Error::new(e).context("database error"))
    }
}

fn detail(status: StatusCode, msg: &str) -> Response {
    (status, Json(json!({ "detail": msg }))).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Validation(errors) => (
                StatusCode::BAD_REQUEST,
                Json(json!({"success": false, "message": "Please check input", "errors": errors})),
            )
                .into_response(),
            ApiError::BadRequest(message) => (
                StatusCode::BAD_REQUEST,
                Json(json!({"success": false, "message": message})),
            )
                .into_response(),
            ApiError::Unauthenticated => detail(
                StatusCode::UNAUTHORIZED,
                "Authentication credentials were not provided.",
            ),
            ApiError::InvalidToken => detail(StatusCode::UNAUTHORIZED, "Invalid token."),
            ApiError::Forbidden => detail(
                StatusCode::FORBIDDEN,
                "You do not have permission to perform this action.",
            ),
            ApiError::NotFound => detail(StatusCode::NOT_FOUND, "Not found."),
            ApiError::MethodNotAllowed => {
                detail(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed.")
            }
            ApiError::Detail(status, msg) => detail(status, &msg),
            ApiError::Busy(secs, reason) => {
                let mut res = detail(StatusCode::SERVICE_UNAVAILABLE, reason);
                res.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(secs),
                );
                res
            }
            ApiError::Internal(e) => {
                let trace_id = crate::trace::TraceId::current().map(tracing::field::display);
                tracing::error!(error = ?e, trace_id, "internal error");
                detail(StatusCode::INTERNAL_SERVER_ERROR, "Internal server error.")
            }
        }
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

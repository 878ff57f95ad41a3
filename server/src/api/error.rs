//! OpenAI-style error responses: `{"error": {"message", "type", "code"}}` with an HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type.
    pub kind: &'static str,
    /// A short machine-readable code, when one fits.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", code: None }
    }

    /// 500: we failed.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            code: None,
        }
    }

    /// 401: no API key or a wrong one.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid API key: pass it as `Authorization: Bearer <key>` or `x-api-key: <key>`".into(),
            kind: "authentication_error",
            code: Some("invalid_api_key"),
        }
    }

    /// 503: the server cannot take the request now (loading, or its queue is full).
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "unavailable_error",
            code: None,
        }
    }

    /// Any status with a client-error type, for rejections made outside the handlers (413, 404,
    /// 405, 415).
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
        ApiError { status, message: message.into(), kind, code: None }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<radix_templates::TemplateError> for ApiError {
    fn from(e: radix_templates::TemplateError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

//! Every error the API answers, as one enum: its HTTP status, its OpenAI shape
//! (`{"error": {"message", "type", "code"}}`) and its Anthropic shape
//! (`{"type": "error", "error": {"type", "message"}}`) are decided here and nowhere else.

use std::fmt;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value as Json;

use super::response::{anthropic, openai, to_json};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 400: the request is wrong; the message says how.
    BadRequest(String),
    /// 400 in OpenAI's wording, which clients match: the prompt does not fit the context.
    /// `what` is "messages" for chat, "prompt" for text completions.
    ContextTooLong {
        /// The model's context.
        context: usize,
        /// The prompt's length.
        prompt_tokens: usize,
        /// What the client sent the prompt as.
        what: &'static str,
    },
    /// 401: no API key or a wrong one.
    Unauthorized,
    /// 403: a request this server does not serve (a foreign `Host` or CORS origin); the
    /// message says which flag allows it.
    Forbidden(String),
    /// 404: no such route.
    NotFound,
    /// 405: the route takes another method.
    MethodNotAllowed,
    /// 413: the body is over the limit of this many bytes.
    TooLarge(usize),
    /// 415: a body whose content type (named) is not JSON.
    UnsupportedMediaType(String),
    /// Another client error made in front of the handlers (axum's 415, ...).
    Rejected(StatusCode, String),
    /// 503: this many requests wait for admission, at the `--max-queue` limit.
    Busy {
        /// Requests waiting.
        queued: usize,
        /// The limit.
        max_queue: usize,
    },
    /// 503: the model is still loading.
    Loading,
    /// 503: every slot is busy (llama.cpp's `/slots?fail_on_no_slot=1`).
    NoSlot,
    /// 500: we failed.
    Internal(String),
}

impl ApiError {
    /// 400: the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    /// 500: we failed.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::Internal(message.into())
    }

    /// The error a non-JSON error response of axum's (a rejection) stands for; `text` is its
    /// body.
    pub fn from_rejection(status: StatusCode, text: &str) -> Self {
        match (status, text.trim()) {
            (StatusCode::NOT_FOUND, "") => ApiError::NotFound,
            (StatusCode::METHOD_NOT_ALLOWED, "") => ApiError::MethodNotAllowed,
            (StatusCode::PAYLOAD_TOO_LARGE, _) => ApiError::TooLarge(super::MAX_BODY_BYTES),
            (_, "") => ApiError::Rejected(status, status.canonical_reason().unwrap_or("error").to_owned()),
            (_, t) => ApiError::Rejected(status, t.to_owned()),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::ContextTooLong { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Rejected(status, _) => *status,
            ApiError::Busy { .. } | ApiError::Loading | ApiError::NoSlot => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What went wrong, for a person.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// OpenAI's error `type`.
    fn openai_type(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "authentication_error",
            ApiError::Busy { .. } | ApiError::Loading | ApiError::NoSlot => "unavailable_error",
            ApiError::Internal(_) => "server_error",
            ApiError::Rejected(status, _) if status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// A short machine-readable code, where one fits.
    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::ContextTooLong { .. } => Some("context_length_exceeded"),
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::TooLarge(_) => Some("request_too_large"),
            ApiError::Busy { .. } => Some("server_busy"),
            ApiError::Loading => Some("loading_model"),
            _ => None,
        }
    }

    /// Anthropic's error `type`, by status as Anthropic assigns them.
    fn anthropic_type(&self) -> &'static str {
        match self.status().as_u16() {
            400 | 405 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            415 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The OpenAI-shaped body (also what a failed stream sends as its last `data:` event).
    pub fn body(&self) -> Json {
        to_json(&openai::ErrorBody::new(self.message(), self.openai_type(), self.code()))
    }

    /// The Anthropic-shaped body.
    pub fn anthropic_body(&self) -> Json {
        to_json(&anthropic::ErrorBody::new(self.anthropic_type(), self.message()))
    }

    /// The response in Anthropic's shape.
    pub fn into_anthropic_response(self) -> Response {
        (self.status(), axum::Json(self.anthropic_body())).into_response()
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::BadRequest(message)
            | ApiError::Forbidden(message)
            | ApiError::Rejected(_, message)
            | ApiError::Internal(message) => f.write_str(message),
            ApiError::ContextTooLong { context, prompt_tokens, what } => write!(
                f,
                "This model's maximum context length is {context} tokens. However, your {what} resulted in \
                 {prompt_tokens} tokens. Please reduce the length of the {what}."
            ),
            ApiError::Unauthorized => {
                f.write_str("Invalid API key: pass it as `Authorization: Bearer <key>` or `x-api-key: <key>`")
            }
            ApiError::NotFound => f.write_str("no such route"),
            ApiError::MethodNotAllowed => f.write_str("method not allowed on this route"),
            ApiError::TooLarge(limit) => write!(f, "the request body is larger than the limit of {limit} bytes"),
            ApiError::UnsupportedMediaType(content_type) => write!(
                f,
                "the body must be JSON sent with `Content-Type: application/json` (got {content_type:?}); \
                 other types are refused so that web pages cannot post to this server"
            ),
            ApiError::Busy { queued, max_queue } => write!(
                f,
                "the server is busy: {queued} requests are already waiting (--max-queue {max_queue}); retry later"
            ),
            ApiError::Loading => f.write_str("the model is loading; retry in a moment"),
            ApiError::NoSlot => f.write_str("no slot available"),
        }
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    /// The OpenAI shape; the error itself rides along as an extension, so the Anthropic routes
    /// reshape it without reading the body back.
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        response.extensions_mut().insert(self);
        response
    }
}

impl From<radix_templates::TemplateError> for ApiError {
    fn from(e: radix_templates::TemplateError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

//! Errors as HTTP responses, in OpenAI's JSON shape:
//! `{"error": {"message": ..., "type": ..., "param": null, "code": ...}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An error answered to a client: the status, OpenAI's error `type`, and a message naming the
/// problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
    /// Seconds the client should wait before retrying (sent as `Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request is malformed or its input unusable.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or invalid API key (send `Authorization: Bearer <key>`)",
        )
    }

    /// 404: no model of that name is served.
    pub fn unknown_model(name: &str, served: &[String]) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "model `{name}` is not served here (served: {})",
                served.join(", ")
            ),
        )
    }

    /// 400: the model exists but does not do what the endpoint asks.
    pub fn wrong_task(name: &str, kind: &str, endpoint: &str) -> Self {
        Self::bad_request(format!(
            "model `{name}` is a {kind} model; {endpoint} needs another kind"
        ))
    }

    /// 413: the body or an input is over a limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
    }

    /// 503 with `Retry-After`: every replica's queue is full.
    pub fn overloaded(model: &str, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                format!("model `{model}` is overloaded: every queue is full, retry later"),
            )
        }
    }

    /// 503: no healthy replica is left.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    /// 504: the request took longer than the server's timeout.
    pub fn timeout(seconds: f64) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            format!("the request did not finish within the server's {seconds} s timeout"),
        )
    }

    /// 500: the model failed on a valid request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Whether the client's request is at fault (4xx), as opposed to the server.
    pub fn is_client_error(&self) -> bool {
        self.status.is_client_error()
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl From<ipfs_accelerate::Error> for ApiError {
    /// Input and preprocessing errors are the client's (400); the rest are the server's (500).
    fn from(e: ipfs_accelerate::Error) -> Self {
        use ipfs_accelerate::core::Error as Core;
        use ipfs_accelerate::Error as E;
        match &e {
            E::Preprocess(_) | E::Core(Core::InvalidInput(_)) => Self::bad_request(e.to_string()),
            E::Unsupported(_) => Self::bad_request(e.to_string()),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

//! The one place every refusal becomes an HTTP answer: an [`HttpError`] is a
//! `starling_api::ApiError` body with its status, and domain and store errors
//! convert into it here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use starling_api::{ApiError, ErrorCode};

/// A refusal on its way out: the API's error body and the status to send it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    status: StatusCode,
    body: ApiError,
}

impl HttpError {
    /// An error with its code's status (`ErrorCode::http_status`).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::with_status(status, code, message)
    }

    /// An error with a status of its own: body rejections carry axum's
    /// precise one (413, 415, 422).
    pub fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ApiError {
                error: code,
                message: message.into(),
            },
        }
    }

    /// A failure of the coordinator itself; the log says more.
    pub fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed");
        Self::new(
            ErrorCode::Internal,
            format!("the coordinator failed: {error}; see its log"),
        )
    }

    /// The code it answers with.
    pub fn code(&self) -> ErrorCode {
        self.body.error
    }

    /// Its status and body, for a page that shows them its own way.
    pub(crate) fn into_parts(self) -> (StatusCode, ApiError) {
        (self.status, self.body)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<crate::service::ServiceError> for HttpError {
    fn from(error: crate::service::ServiceError) -> Self {
        use crate::service::ServiceError;
        match error {
            ServiceError::Refused { code, message } => Self::new(code, message),
            ServiceError::Store(error) => error.into(),
            ServiceError::Publish(error) => error.into(),
            ServiceError::Internal(error) => Self::internal(error),
        }
    }
}

impl From<crate::store::StoreError> for HttpError {
    fn from(error: crate::store::StoreError) -> Self {
        Self::internal(error)
    }
}

impl From<crate::mqtt::publish::PublishError> for HttpError {
    fn from(error: crate::mqtt::publish::PublishError) -> Self {
        Self::internal(error)
    }
}

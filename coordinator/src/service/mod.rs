//! The use cases the REST API and the console share, each behind a narrow
//! handle built in `app.rs` (`tasks`: submit, batch, read, list, cancel;
//! `access`: enroll, mint, revoke nodes, join and API tokens, credentials;
//! `artifacts`: upload within a quota, sign, serve, the catalog; `peers`:
//! what other sites ask of this one, forwards and revocations; `sites`: the
//! federation as this site sees it; `status`: health, leadership, counts).
//! A handler or a console page parses its request, calls one of them and
//! converts the answer (`http::views`, `http::error`); neither calls the
//! other, and the rules live here, not in either; nor do they call the
//! store (an architecture test names the modules that may).

use starling_api::ErrorCode;
use starling_proto::Digest;

use crate::mqtt::publish::PublishError;
use crate::store::StoreError;

pub(crate) mod access;
pub(crate) mod artifacts;
pub(crate) mod peers;
pub(crate) mod sites;
pub(crate) mod status;
pub(crate) mod tasks;

/// Why a use case did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// Refused: the API's code for why, and a message that says what to do.
    #[error("{message}")]
    Refused {
        /// The stable code (one HTTP status each).
        code: ErrorCode,
        /// For people.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A message to a node could not be queued.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The coordinator itself failed (stored bytes that no longer parse).
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// A refusal with its code and message.
    pub(crate) fn refused(code: ErrorCode, message: impl Into<String>) -> Self {
        ServiceError::Refused {
            code,
            message: message.into(),
        }
    }

    /// A failure of the coordinator itself.
    pub(crate) fn internal(error: impl std::fmt::Display) -> Self {
        ServiceError::Internal(error.to_string())
    }

    /// The same refusal with its message rewritten (a batch names the item
    /// it refused); other errors as they are.
    pub(crate) fn map_message(self, change: impl FnOnce(&str) -> String) -> Self {
        match self {
            ServiceError::Refused { code, message } => ServiceError::Refused {
                code,
                message: change(&message),
            },
            other => other,
        }
    }
}

/// An artifact's digest as a client wrote it (64 hex digits).
pub(crate) fn parse_digest(text: &str) -> Result<Digest, ServiceError> {
    Digest::parse(text).map_err(|error| {
        ServiceError::refused(
            ErrorCode::InvalidDigest,
            format!("{error}; use the digest POST /api/v1/artifacts returned"),
        )
    })
}

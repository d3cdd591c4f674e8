//! The one error body of the REST API and the closed set of codes it carries.
//!
//! Every refusal the coordinator answers is `{"error": CODE, "message": TEXT}`:
//! the code is an [`ErrorCode`], stable for programs to match (the CLI does,
//! as types), the message is for people and says what to do. Each code has
//! one HTTP status ([`ErrorCode::http_status`]), so the server cannot answer
//! the same code with two statuses.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Declares the codes once: variant, wire name and HTTP status.
macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal => $status:literal, )*) => {
        /// Why a REST call was refused: a stable code programs can match.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $( $(#[$doc])* #[serde(rename = $name)] $variant, )*
            /// A code this client does not know (a newer coordinator's).
            #[serde(other, rename = "unknown")]
            Unknown,
        }

        impl ErrorCode {
            /// Every code the coordinator answers with.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it is written on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                    ErrorCode::Unknown => "unknown",
                }
            }

            /// The HTTP status the coordinator answers this code with.
            /// Body rejections (`invalid_json`, `bad_body`) may carry the
            /// more precise status of the rejection (413, 415, 422).
            pub fn http_status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                    ErrorCode::Unknown => 500,
                }
            }
        }
    };
}

error_codes! {
    /// No bearer token, or one the coordinator does not know.
    Unauthorized = "unauthorized" => 401,
    /// The token's role does not allow the call.
    Forbidden = "forbidden" => 403,
    /// No route, or nothing at this path.
    NotFound = "not_found" => 404,
    /// The request body is not JSON of the expected schema.
    InvalidJson = "invalid_json" => 400,
    /// The request body could not be read (too large, cut off).
    BadBody = "bad_body" => 400,
    /// A query parameter is malformed.
    InvalidQuery = "invalid_query" => 400,
    /// The coordinator failed; its log says why.
    Internal = "internal" => 500,
    /// The database does not answer.
    DatabaseUnavailable = "database_unavailable" => 503,
    /// No artifact with this digest.
    ArtifactNotFound = "artifact_not_found" => 404,
    /// The upload exceeds `--max-artifact-bytes`.
    ArtifactTooLarge = "artifact_too_large" => 413,
    /// The upload would take the caller's token past its share of the
    /// artifact store (`artifact-quota-bytes`).
    ArtifactQuotaExceeded = "artifact_quota_exceeded" => 413,
    /// Neither a valid wasm module nor a valid OpenCL package.
    InvalidArtifact = "invalid_artifact" => 400,
    /// Not 64 hex digits.
    InvalidDigest = "invalid_digest" => 400,
    /// A publisher signature that does not verify.
    InvalidSignature = "invalid_signature" => 400,
    /// A forwarded task's artifact is neither here nor at its origin.
    ArtifactUnavailable = "artifact_unavailable" => 409,
    /// Input in both forms, or not base64.
    InvalidInput = "invalid_input" => 400,
    /// Input beyond what an assignment carries inline.
    InputTooLarge = "input_too_large" => 413,
    /// Too many or too long arguments, or scalars a kernel does not take.
    InvalidArgs = "invalid_args" => 400,
    /// A demand that no node could meet or that makes no sense.
    InvalidDemand = "invalid_demand" => 400,
    /// No node of the site could run the task, whatever its load (without
    /// `wait_for_node`).
    NoCapableNode = "no_capable_node" => 422,
    /// The submission would take the caller's token past its share of the
    /// queue: more pending tasks than `pending-quota`.
    PendingQuotaExceeded = "pending_quota_exceeded" => 429,
    /// Limits out of range.
    InvalidLimits = "invalid_limits" => 400,
    /// A work estimate that is not a positive number.
    InvalidWork = "invalid_work" => 400,
    /// An OpenCL submission that does not fit its kernel's spec.
    InvalidKernel = "invalid_kernel" => 400,
    /// A batch with no tasks.
    EmptyBatch = "empty_batch" => 400,
    /// A batch with more tasks than one request takes (`MAX_BATCH_TASKS`).
    BatchTooLarge = "batch_too_large" => 413,
    /// A task state filter that names no state.
    InvalidState = "invalid_state" => 400,
    /// No task with this id.
    TaskNotFound = "task_not_found" => 404,
    /// The task already ended.
    TaskEnded = "task_ended" => 409,
    /// No node with this id.
    NodeNotFound = "node_not_found" => 404,
    /// A node id that is not a valid MQTT user name and topic level.
    InvalidNodeId = "invalid_node_id" => 400,
    /// An enrollment's report key is not an ed25519 public key in hex.
    InvalidReportKey = "invalid_report_key" => 400,
    /// A node id the coordinator keeps for itself.
    NodeIdReserved = "node_id_reserved" => 409,
    /// The node is enrolled and not revoked.
    NodeEnrolled = "node_enrolled" => 409,
    /// The node was never enrolled.
    NodeNotEnrolled = "node_not_enrolled" => 404,
    /// A join token that is unknown, spent or expired.
    InvalidJoinToken = "invalid_join_token" => 401,
    /// A join token life out of range.
    InvalidTtl = "invalid_ttl" => 400,
    /// A join token use count out of range.
    InvalidUses = "invalid_uses" => 400,
    /// An API token name that is empty or too long.
    InvalidName = "invalid_name" => 400,
    /// No API token with this id.
    TokenNotFound = "token_not_found" => 404,
    /// This coordinator does not federate.
    NotFederated = "not_federated" => 404,
    /// A forwarded task this site cannot take.
    InvalidForward = "invalid_forward" => 400,
    /// No forward from this site with this id.
    ForwardNotFound = "forward_not_found" => 404,
    /// A site revocation that is malformed or not signed by this federation's trust root.
    InvalidRevocation = "invalid_revocation" => 400,
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// A stable code programs can match (`not_found`, `invalid_artifact`, ...).
    #[schema(value_type = String)]
    pub error: ErrorCode,
    /// What went wrong and what to do, for people.
    pub message: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_ones_are_kept_apart() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), *code);
            assert!((400..600).contains(&code.http_status()), "{code}");
        }
        let newer: ApiError =
            serde_json::from_str(r#"{"error":"quota_exceeded","message":"later"}"#).unwrap();
        assert_eq!(newer.error, ErrorCode::Unknown);
    }

    #[test]
    fn every_code_has_its_own_name() {
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }
}

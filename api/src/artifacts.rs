//! Artifacts (wasm modules and OpenCL packages) as uploaded and signed.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A stored artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactStored {
    /// Its sha256, 64 hex digits.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// The runtime that runs it: `wasm` or `opencl`.
    pub runtime: String,
    /// Whether these bytes were new to the coordinator.
    pub created: bool,
}

/// A publisher's signature over an artifact's digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactSignature {
    /// The publisher's ed25519 public key, 64 hex digits (`starling keygen` prints it).
    pub key: String,
    /// The ed25519 signature of the artifact's 32-byte sha256 digest, 128 hex digits.
    pub signature: String,
}

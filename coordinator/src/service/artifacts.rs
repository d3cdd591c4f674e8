//! Artifacts: storing an upload (checked, within its uploader's quota),
//! recording a publisher's signature, serving the bytes (as uploaded, or
//! compiled for nodes without a compiler), and the catalog the console lists.

use sha2::{Digest as _, Sha256};
use starling_api::{ArtifactSignature, ArtifactStored, ErrorCode};
use starling_opencl::Package;
use starling_proto::{Digest, PublisherSignature, Runtime};

use super::{parse_digest, ServiceError};
use crate::store::Store;
use crate::task::unix_now_ms;

/// What the artifact use cases need, and nothing else (built in `app.rs`).
#[derive(Clone)]
pub(crate) struct Artifacts {
    /// Artifacts, their uploaders and signatures.
    pub(crate) store: Store,
    /// Each uploader's stored bytes at most (`artifact-quota-bytes`).
    pub(crate) quota_bytes: u64,
}

/// An artifact's bytes as a node fetches them.
pub(crate) enum ArtifactBytes {
    /// As uploaded: a WebAssembly module or an OpenCL package.
    Uploaded(Vec<u8>),
    /// A module this coordinator compiled for nodes without a compiler.
    Precompiled(Vec<u8>),
}

/// One row of the catalog: an artifact, its size and runtime (when its
/// row is still there) and its publisher's signature.
pub(crate) struct CatalogEntry {
    /// The digest, hex.
    pub(crate) digest: String,
    /// Its size and runtime.
    pub(crate) info: Option<(u64, Runtime)>,
    /// Who signed it, if anyone did.
    pub(crate) publisher: Option<PublisherSignature>,
}

impl Artifacts {
    /// Stores `bytes` (an upload by `uploader`, the caller's token hash)
    /// under its sha256 once it has passed every check. Uploading the same
    /// bytes again is fine and costs no quota.
    pub(crate) async fn upload(
        &self,
        bytes: &[u8],
        uploader: &str,
    ) -> Result<ArtifactStored, ServiceError> {
        if bytes.is_empty() {
            return Err(ServiceError::refused(
                ErrorCode::InvalidArtifact,
                "the body is empty; send the .wasm file's bytes",
            ));
        }
        let runtime = validate_artifact(bytes)?;
        let digest = Digest(Sha256::digest(bytes).into());
        self.check_quota(uploader, &digest, bytes.len() as u64)
            .await?;
        let created = self
            .store
            .put_artifact(&digest, bytes, runtime, uploader, unix_now_ms())
            .await?;
        Ok(ArtifactStored {
            digest: digest.to_hex(),
            size: bytes.len() as u64,
            runtime: runtime.as_str().to_string(),
            created,
        })
    }

    /// Refuses an upload that would take `uploader`'s stored artifacts past
    /// the quota. Bytes already stored cost nothing again. Two uploads at
    /// once may both pass the check: the quota can be passed by what is in
    /// flight, which the connection cap and the size limit bound.
    async fn check_quota(
        &self,
        uploader: &str,
        digest: &Digest,
        size: u64,
    ) -> Result<(), ServiceError> {
        if self.store.artifact_info(digest).await?.is_some() {
            return Ok(());
        }
        let used = self.store.uploaded_bytes(uploader).await?;
        let quota = self.quota_bytes;
        if used.saturating_add(size) > quota {
            return Err(ServiceError::refused(
                ErrorCode::ArtifactQuotaExceeded,
                format!(
                    "this token's stored artifacts take {used} bytes of its {quota}-byte quota; this {size}-byte upload would pass it. \
                     artifacts no task uses are deleted a grace period after their upload (artifact-grace, a day by default); an admin can raise artifact-quota-bytes"
                ),
            ));
        }
        Ok(())
    }

    /// Keeps an artifact another site sent, already checked against its
    /// digest: it must validate as an upload does.
    pub(crate) async fn keep_fetched(
        &self,
        digest: &Digest,
        bytes: &[u8],
        origin: &str,
    ) -> Result<(), ServiceError> {
        let runtime = validate_artifact(bytes)?;
        self.store
            .put_artifact(
                digest,
                bytes,
                runtime,
                &format!("site:{origin}"),
                unix_now_ms(),
            )
            .await?;
        Ok(())
    }

    /// Whether the artifact is stored here.
    pub(crate) async fn holds(&self, digest: &Digest) -> Result<bool, ServiceError> {
        Ok(self.store.artifact_info(digest).await?.is_some())
    }

    /// Records a publisher's signature over a stored artifact (replacing any
    /// earlier one); every later assignment of it carries the signature.
    pub(crate) async fn sign(
        &self,
        digest: &Digest,
        signature: &ArtifactSignature,
    ) -> Result<ArtifactSignature, ServiceError> {
        let publisher = verified_publisher(signature, digest)?;
        if !self
            .store
            .set_artifact_publisher(digest, &publisher)
            .await?
        {
            return Err(ServiceError::refused(
                ErrorCode::ArtifactNotFound,
                format!("no artifact {digest}; upload it first (starling publish FILE)"),
            ));
        }
        tracing::info!(artifact = %digest, publisher = %hex::encode(&publisher.key), "publisher signature recorded");
        Ok(ArtifactSignature {
            key: hex::encode(&publisher.key),
            signature: hex::encode(&publisher.signature),
        })
    }

    /// Adds a signature a peer forwarded with a task. One already recorded
    /// here stays: a peer may add a signature, not replace one (it could
    /// swap in a key this site's nodes do not trust and so stop them running
    /// the artifact).
    pub(crate) async fn add_signature(
        &self,
        digest: &Digest,
        publisher: &PublisherSignature,
    ) -> Result<(), ServiceError> {
        if self.store.artifact_publisher(digest).await?.is_none() {
            self.store.set_artifact_publisher(digest, publisher).await?;
        }
        Ok(())
    }

    /// The bytes a node fetches for `digest`.
    pub(crate) async fn bytes(&self, digest: &str) -> Result<ArtifactBytes, ServiceError> {
        let digest = parse_digest(digest)?;
        if let Some(bytes) = self.store.artifact(&digest).await? {
            return Ok(ArtifactBytes::Uploaded(bytes));
        }
        match self.store.precompiled_bytes(&digest).await? {
            Some(bytes) => Ok(ArtifactBytes::Precompiled(bytes)),
            None => Err(ServiceError::refused(
                ErrorCode::ArtifactNotFound,
                format!("no artifact {digest}; upload it with POST /api/v1/artifacts (starling publish FILE.wasm)"),
            )),
        }
    }

    /// The newest `limit` artifacts, newest first, with their size, runtime
    /// and publisher.
    pub(crate) async fn catalog(&self, limit: u32) -> Result<Vec<CatalogEntry>, ServiceError> {
        let mut rows = Vec::new();
        for hex in self.store.recent_artifacts(limit).await? {
            let Ok(digest) = hex.parse::<Digest>() else {
                continue;
            };
            rows.push(CatalogEntry {
                info: self.store.artifact_info(&digest).await?,
                publisher: self.store.artifact_publisher(&digest).await?,
                digest: hex,
            });
        }
        Ok(rows)
    }
}

/// Checks that bytes are a valid WebAssembly module, saying why not.
pub(crate) fn validate_wasm(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(b"\0asm") {
        return Err("the body is not a WebAssembly module (it does not start with \\0asm); upload a .wasm file".to_string());
    }
    wasmparser::Validator::new()
        .validate_all(bytes)
        .map(|_| ())
        .map_err(|error| format!("the WebAssembly module is invalid: {error}"))
}

/// Decides what an upload is (a WebAssembly module or an OpenCL package) and
/// checks it, so that nothing a node could not run is ever stored.
pub(crate) fn validate_artifact(bytes: &[u8]) -> Result<Runtime, ServiceError> {
    if bytes.starts_with(b"\0asm") {
        validate_wasm(bytes)
            .map_err(|message| ServiceError::refused(ErrorCode::InvalidArtifact, message))?;
        Ok(Runtime::Wasm)
    } else if Package::looks_like(bytes) {
        Package::from_bytes(bytes).map_err(|error| {
            ServiceError::refused(
                ErrorCode::InvalidKernel,
                format!("{error}; see tasks/README.md for the [opencl] section of task.toml"),
            )
        })?;
        Ok(Runtime::Opencl)
    } else {
        Err(ServiceError::refused(ErrorCode::InvalidArtifact,
            "the body is not a WebAssembly module (it does not start with \\0asm), nor an OpenCL package (a JSON object); upload a .wasm file, or publish a .cl kernel with `starling publish`",
        ))
    }
}

/// A publisher signature as the API carries it (hex), decoded and checked:
/// a well-formed ed25519 key and signature that verifies over `digest`.
/// What an upload's signature and a forward's must both pass.
pub(crate) fn verified_publisher(
    body: &ArtifactSignature,
    digest: &Digest,
) -> Result<PublisherSignature, ServiceError> {
    let decode = |what: &str, text: &str| {
        hex::decode(text.trim()).map_err(|error| {
            ServiceError::refused(
                ErrorCode::InvalidSignature,
                format!("the {what} is not hex ({error}); starling sign writes both"),
            )
        })
    };
    let publisher = PublisherSignature {
        key: decode("key", &body.key)?,
        signature: decode("signature", &body.signature)?,
    };
    publisher.verify(digest).map_err(|detail| {
        ServiceError::refused(
            ErrorCode::InvalidSignature,
            format!("the publisher signature is refused: {detail}"),
        )
    })?;
    Ok(publisher)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn wasm_validation_explains() {
        assert!(validate_wasm(b"\0asm\x01\0\0\0").is_ok());
        assert!(validate_wasm(b"hello").unwrap_err().contains("\\0asm"));
        assert!(validate_wasm(b"\0asm\x01\0\0\0\x01")
            .unwrap_err()
            .contains("invalid"));
    }
}

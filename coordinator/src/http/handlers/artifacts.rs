//! Uploading, signing and fetching artifacts (wasm modules, OpenCL packages).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest as _, Sha256};
use starling_api::{ApiError, ArtifactSignature, ArtifactStored, ErrorCode};
use starling_opencl::Package;
use starling_proto::{Digest, PublisherSignature, Runtime};

use crate::http::error::HttpError;
use crate::http::json_body;
use crate::task::unix_now_ms;
use crate::Shared;

/// The OpenCL package as the OpenAPI document shows it: a JSON object
/// (`starling-opencl/1`), checked in full by `starling_opencl::Package`.
/// Only the document uses this type; uploads are parsed as bytes.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a schema, never built: the handlers take bytes
pub(crate) struct OpenClPackage {
    /// Always `starling-opencl/1`.
    format: String,
    /// The kernel's OpenCL C source.
    source: String,
    /// The kernel's name, work size, device and arguments.
    #[schema(value_type = Object)]
    spec: serde_json::Value,
}

/// Checks that bytes are a valid WebAssembly module, saying why not.
pub fn validate_wasm(bytes: &[u8]) -> Result<(), String> {
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
pub fn validate_artifact(bytes: &[u8]) -> Result<Runtime, HttpError> {
    if bytes.starts_with(b"\0asm") {
        validate_wasm(bytes)
            .map_err(|message| HttpError::new(ErrorCode::InvalidArtifact, message))?;
        Ok(Runtime::Wasm)
    } else if Package::looks_like(bytes) {
        Package::from_bytes(bytes).map_err(|error| {
            HttpError::new(
                ErrorCode::InvalidKernel,
                format!("{error}; see tasks/README.md for the [opencl] section of task.toml"),
            )
        })?;
        Ok(Runtime::Opencl)
    } else {
        Err(HttpError::new(ErrorCode::InvalidArtifact,
            "the body is not a WebAssembly module (it does not start with \\0asm), nor an OpenCL package (a JSON object); upload a .wasm file, or publish a .cl kernel with `starling publish`",
        ))
    }
}

/// Stores a WebAssembly module or an OpenCL package (kernel source and spec,
/// as `starling publish KERNEL.cl` builds it) under its sha256, after checking
/// it: a module must validate, a package's spec must match its kernel.
/// Uploading the same bytes again is fine. Each API token's stored
/// artifacts are bounded (`artifact-quota-bytes`); artifacts no task
/// references are collected a grace period after their upload.
#[utoipa::path(
    post,
    path = "/api/v1/artifacts",
    security((), ("bearer" = [])),
    request_body(content(
        (Vec<u8> = "application/wasm"),
        (OpenClPackage = "application/vnd.starling.opencl+json")
    ), description = "The module's bytes, or the OpenCL package"),
    responses(
        (status = 201, description = "Stored (or already stored)", body = ArtifactStored),
        (status = 400, description = "Not a valid WebAssembly module or OpenCL package", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 413, description = "Larger than the coordinator accepts (`artifact_too_large`), or past the caller's token's quota of stored artifacts (`artifact_quota_exceeded`)", body = ApiError)
    )
)]
pub(crate) async fn upload_artifact(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ArtifactStored>), HttpError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::new(ErrorCode::ArtifactTooLarge,
                format!(
                    "the module is larger than the {} bytes this coordinator accepts; shrink it (wasm-opt, strip debug info) or raise max-artifact-bytes",
                    shared.max_artifact_bytes
                ),
            )
        } else {
            HttpError::with_status(rejection.status(), ErrorCode::BadBody, rejection.body_text())
        }
    })?;
    if bytes.is_empty() {
        return Err(HttpError::new(
            ErrorCode::InvalidArtifact,
            "the body is empty; send the .wasm file's bytes",
        ));
    }
    let runtime = validate_artifact(&bytes)?;
    let digest = Digest(Sha256::digest(&bytes).into());
    let uploader = crate::http::auth::caller_key(&headers);
    check_quota(&shared, &uploader, &digest, bytes.len() as u64).await?;
    let created = shared
        .store
        .put_artifact(&digest, &bytes, runtime, &uploader, unix_now_ms())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(ArtifactStored {
            digest: digest.to_hex(),
            size: bytes.len() as u64,
            runtime: runtime.as_str().to_string(),
            created,
        }),
    ))
}

/// Refuses an upload that would take `uploader`'s stored artifacts past
/// the quota. Bytes already stored cost nothing again. Two uploads at once
/// may both pass the check: the quota can be passed by what is in flight,
/// which the connection cap and the size limit bound.
async fn check_quota(
    shared: &Shared,
    uploader: &str,
    digest: &Digest,
    size: u64,
) -> Result<(), HttpError> {
    if shared.store.artifact_info(digest).await?.is_some() {
        return Ok(());
    }
    let used = shared.store.uploaded_bytes(uploader).await?;
    let quota = shared.artifact_quota_bytes;
    if used.saturating_add(size) > quota {
        return Err(HttpError::new(
            ErrorCode::ArtifactQuotaExceeded,
            format!(
                "this token's stored artifacts take {used} bytes of its {quota}-byte quota; this {size}-byte upload would pass it. \
                 artifacts no task uses are deleted a grace period after their upload (artifact-grace, a day by default); an admin can raise artifact-quota-bytes"
            ),
        ));
    }
    Ok(())
}

/// Records a publisher's signature over a stored artifact; every later
/// assignment of the artifact carries it, and nodes that trust the publisher
/// (`--trusted-publisher`) run only artifacts so signed.
#[utoipa::path(
    post,
    path = "/api/v1/artifacts/{digest}/signature",
    security((), ("bearer" = [])),
    params(("digest" = String, Path, description = "sha256 of the artifact, 64 hex digits")),
    request_body = ArtifactSignature,
    responses(
        (status = 200, description = "Recorded (replacing any earlier signature)", body = ArtifactSignature),
        (status = 400, description = "Not hex, or the signature does not verify over the digest", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 403, description = "Role below developer", body = ApiError),
        (status = 404, description = "No such artifact", body = ApiError)
    )
)]
pub(crate) async fn sign_artifact(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
    body: Result<Json<ArtifactSignature>, JsonRejection>,
) -> Result<Json<ArtifactSignature>, HttpError> {
    let digest = crate::service::parse_digest(&digest)?;
    let body = json_body(body, "ArtifactSignature")?;
    let publisher = verified_publisher(&body, &digest)?;
    if !shared
        .store
        .set_artifact_publisher(&digest, &publisher)
        .await?
    {
        return Err(HttpError::new(
            ErrorCode::ArtifactNotFound,
            format!("no artifact {digest}; upload it first (starling publish FILE)"),
        ));
    }
    tracing::info!(artifact = %digest, publisher = %hex::encode(&publisher.key), "publisher signature recorded");
    Ok(Json(ArtifactSignature {
        key: hex::encode(&publisher.key),
        signature: hex::encode(&publisher.signature),
    }))
}

/// A publisher signature as the API carries it (hex), decoded and checked:
/// a well-formed ed25519 key and signature that verifies over `digest`.
/// What an upload's signature and a forward's must both pass.
pub(crate) fn verified_publisher(
    body: &ArtifactSignature,
    digest: &Digest,
) -> Result<PublisherSignature, HttpError> {
    let decode = |what: &str, text: &str| {
        hex::decode(text.trim()).map_err(|error| {
            HttpError::new(
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
        HttpError::new(
            ErrorCode::InvalidSignature,
            format!("the publisher signature is refused: {detail}"),
        )
    })?;
    Ok(publisher)
}

/// Serves a module's bytes (agents fetch modules here), or the code compiled
/// from one for nodes without a compiler.
#[utoipa::path(
    get,
    path = "/api/v1/artifacts/{digest}",
    params(("digest" = String, Path, description = "sha256 of the artifact, 64 hex digits")),
    responses(
        (status = 200, description = "The artifact as uploaded: a WebAssembly module, or an OpenCL package; or a module this coordinator compiled for nodes without a compiler (wasmtime's ELF, named by the assignments it sends them)", content(
            (Vec<u8> = "application/wasm"),
            (OpenClPackage = "application/vnd.starling.opencl+json"),
            (Vec<u8> = "application/vnd.starling.precompiled")
        )),
        (status = 400, description = "Not a digest", body = ApiError),
        (status = 404, description = "No such artifact", body = ApiError)
    )
)]
pub(crate) async fn get_artifact(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
) -> Result<Response, HttpError> {
    let digest = crate::service::parse_digest(&digest)?;
    match shared.store.artifact(&digest).await? {
        Some(bytes) => {
            let media_type = if bytes.starts_with(b"\0asm") {
                "application/wasm"
            } else {
                starling_opencl::package::MEDIA_TYPE
            };
            Ok(([(header::CONTENT_TYPE, media_type)], bytes).into_response())
        }
        None => match shared.store.precompiled_bytes(&digest).await? {
            Some(bytes) => Ok(([(header::CONTENT_TYPE, PRECOMPILED_MEDIA_TYPE)], bytes).into_response()),
            None => Err(HttpError::new(ErrorCode::ArtifactNotFound,
            format!("no artifact {digest}; upload it with POST /api/v1/artifacts (starling publish FILE.wasm)"),
        )),
        },
    }
}

/// The media type of a module compiled ahead of time for a node.
const PRECOMPILED_MEDIA_TYPE: &str = "application/vnd.starling.precompiled";

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

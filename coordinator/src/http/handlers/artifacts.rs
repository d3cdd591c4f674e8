//! Uploading, signing and fetching artifacts (wasm modules, OpenCL packages).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use starling_api::{ApiError, ArtifactSignature, ArtifactStored, ErrorCode};

use crate::http::error::HttpError;
use crate::http::json_body;
use crate::http::Shared;
use crate::service::artifacts::ArtifactBytes;

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
    let uploader = crate::http::auth::caller_key(&headers);
    let stored = shared.artifacts().upload(&bytes, &uploader).await?;
    Ok((StatusCode::CREATED, Json(stored)))
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
    Ok(Json(shared.artifacts().sign(&digest, &body).await?))
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
    let (media_type, bytes) = match shared.artifacts().bytes(&digest).await? {
        ArtifactBytes::Uploaded(bytes) if bytes.starts_with(b"\0asm") => {
            ("application/wasm", bytes)
        }
        ArtifactBytes::Uploaded(bytes) => (starling_opencl::package::MEDIA_TYPE, bytes),
        ArtifactBytes::Precompiled(bytes) => (PRECOMPILED_MEDIA_TYPE, bytes),
    };
    Ok(([(header::CONTENT_TYPE, media_type)], bytes).into_response())
}

/// The media type of a module compiled ahead of time for a node.
const PRECOMPILED_MEDIA_TYPE: &str = "application/vnd.starling.precompiled";

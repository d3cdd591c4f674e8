//! The OpenAPI document of the REST API (utoipa), served at
//! `/api/v1/openapi.json` and checked in as `coordinator/openapi.json`.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use starling_api::{
    ApiError, ApiTokenCreated, ApiTokenList, ApiTokenRecord, ArtifactSignature, ArtifactStored,
    AttemptRecord, BatchSubmitted, CreateApiToken, CreateJoinToken, EnrollRequest, EventKind,
    EventRecord, ForwardAccepted, ForwardRequest, ForwardStatus, Health, Identity,
    JoinTokenCreated, LiveEvent, NodeChange, NodeChangeKind, NodeCredentials, NodeDetail, NodeList,
    NodeRevoked, NodeSummary, RevocationAccepted, Role, SiteChange, SiteEntry, SiteList,
    SiteRevocation, SiteState, StreamReset, SubmitBatch, SubmitTask, TaskChange, TaskDemand,
    TaskDetail, TaskGrants, TaskKind, TaskLimits, TaskList, TaskStatus, TaskSummary,
    TelemetrySample,
};
use utoipa::OpenApi;

use super::handlers::{
    access::*, artifacts::*, batch::*, events::*, federation::*, metrics::*, nodes::*,
    revocations::*, tasks::*,
};

/// Declares the optional bearer token in the OpenAPI document.
pub(crate) struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        // The federation routes: a request signed by the calling site. The
        // signature is this header; the site, its certificate and the
        // timestamp travel in `starling-site`, `starling-site-certificate`
        // and `starling-timestamp`.
        components.add_security_scheme(
            "site_signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "starling-signature",
                "ed25519 signature of the calling site over its target site, method, path, \
                 timestamp and body hash, with starling-site, starling-site-certificate (issued \
                 by the federation's trust root) and starling-timestamp (Unix ms, within 60 s)",
            ))),
        );
    }
}

/// The OpenAPI document of this API.
#[derive(OpenApi)]
#[openapi(
    modifiers(&BearerToken),
    info(
        title = "Starling coordinator API",
        description = "Nodes, artifacts and tasks of a Starling coordinator. When the coordinator has an API token, every call except health, identity, enrollment, this document and artifacts by digest needs `Authorization: Bearer TOKEN` with a role: viewer reads; developer also uploads, submits and cancels; operator also creates join tokens and revokes nodes; admin also manages API tokens. 401: missing, unknown or revoked token; 403: role too low."
    ),
    paths(
        health,
        list_nodes,
        get_node,
        upload_artifact,
        get_artifact,
        sign_artifact,
        submit_task,
        submit_batch,
        list_tasks,
        get_task,
        cancel_task,
        openapi_document,
        metrics,
        identity,
        enroll,
        create_join_token,
        revoke_node,
        create_api_token,
        list_api_tokens,
        revoke_api_token,
        list_sites,
        accept_forward,
        forward_status,
        cancel_forward,
        accept_revocation,
        events
    ),
    components(schemas(
        ApiError,
        SiteList,
        SiteEntry,
        SiteState,
        ForwardRequest,
        ForwardAccepted,
        ForwardStatus,
        SiteRevocation,
        RevocationAccepted,
        Health,
        NodeSummary,
        NodeList,
        NodeDetail,
        ArtifactStored,
        ArtifactSignature,
        SubmitTask,
        SubmitBatch,
        BatchSubmitted,
        TaskSummary,
        TaskList,
        TaskDetail,
        TaskStatus,
        TaskKind,
        TaskDemand,
        TaskLimits,
        TaskGrants,
        AttemptRecord,
        EventRecord,
        Role,
        Identity,
        EnrollRequest,
        NodeCredentials,
        CreateJoinToken,
        JoinTokenCreated,
        CreateApiToken,
        ApiTokenCreated,
        ApiTokenRecord,
        ApiTokenList,
        NodeRevoked,
        LiveEvent,
        TaskChange,
        NodeChange,
        NodeChangeKind,
        TelemetrySample,
        SiteChange,
        StreamReset,
        EventKind
    ))
)]
pub struct ApiDoc;

/// The OpenAPI document as pretty JSON (the checked-in `openapi.json`).
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI document of this API", content_type = "application/json"))
)]
pub(crate) async fn openapi_document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

//! The coordinator's REST contract: the request and response types of
//! `/api/v1`, the one error body with its closed set of codes, the task model
//! those types carry, and the JSON sites exchange when they forward work.
//!
//! The coordinator serves these types and the `starling` CLI reads them; with
//! the `client` feature this crate also holds the typed [`client::Client`]
//! the CLI uses. It knows nothing of axum, the store or MQTT: the server maps
//! its own rows into these types at its HTTP edge, so a change of schema is a
//! change of this crate, visible in the OpenAPI document.

pub mod access;
pub mod artifacts;
#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod events;
pub mod federation;
pub mod nodes;
pub mod task;
pub mod tasks;

pub use access::{
    ApiTokenCreated, ApiTokenList, ApiTokenRecord, CreateApiToken, CreateJoinToken, EnrollRequest,
    Identity, JoinTokenCreated, NodeCredentials, Role, UnknownRole,
};
pub use artifacts::{ArtifactSignature, ArtifactStored};
pub use error::{ApiError, ErrorCode};
pub use events::{
    EventKind, LiveEvent, NodeChange, NodeChangeKind, SiteChange, StreamPosition, StreamReset,
    TaskChange, TelemetrySample,
};
pub use federation::{
    ForwardAccepted, ForwardRequest, ForwardStatus, RevocationAccepted, SiteEntry, SiteList,
    SiteRevocation, SiteState,
};
pub use nodes::{Health, NodeDetail, NodeList, NodeRevoked, NodeSummary};
pub use task::{TaskDemand, TaskGrants, TaskKind, TaskLimits, TaskStatus};
pub use tasks::{
    batch_item_index, batch_item_message, AttemptRecord, BatchSubmitted, EventRecord, SubmitBatch,
    SubmitTask, TaskDetail, TaskList, TaskListQuery, TaskSummary, MAX_BATCH_TASKS,
};

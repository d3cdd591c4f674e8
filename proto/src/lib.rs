//! Starling's wire contract: the messages that agents and coordinators exchange
//! over MQTT, their CBOR codec, and the topic names they travel on.
//!
//! This crate is the only contract between an agent and a coordinator. It does
//! no I/O, knows nothing of MQTT clients, HTTP or tokio, and builds without `std`
//! (with `alloc`) so that the smallest agent builds can share it.
//!
//! Every message carries the protocol version [`PROTOCOL_VERSION`], which is
//! separate from the crate's version: it changes only when the bytes on the wire
//! change in a way an older peer cannot read.
#![cfg_attr(not(feature = "std"), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod capability;
pub mod codec;
pub mod fixtures;
pub mod ids;
pub mod limits;
pub mod signed;
pub mod site;
pub mod status;
pub mod task;
pub mod telemetry;
pub mod topic;

pub use capability::{
    Capability, CpuInfo, DiskInfo, GpuDevice, GpuKind, NetInterface, PowerControl, PowerLevel,
    RateSource, Runtime, Source, WasmEngine,
};
pub use codec::{decode, decode_stored, encode, DecodeError, EncodeError, Message};
pub use ids::{Digest, IdError, Label, NodeId, TaskId};
#[cfg(feature = "ed25519")]
pub use signed::ReportSignatureError;
pub use signed::{
    counter_admitted, Issued, ReportChannel, ReportCounter, SignedReport, COUNTER_BLOCK,
    REPORT_DOMAIN,
};
pub use site::{ClassCapacity, PowerBand, SiteDigest, SiteId, WorkClass};
pub use status::{NodeState, Status};
pub use task::{
    Assignment, Cancel, EventAck, ExecLimits, ExecMetrics, FailureReason, Grants, PowerApplied,
    PrecompiledModule, PublisherSignature, TaskEvent, TaskState,
};
#[cfg(feature = "ed25519")]
pub use task::{KeyHex, PublisherSignatureError};
pub use telemetry::{AttemptRef, LinkState, Telemetry};
pub use topic::{Channel, TopicError, Topics};

/// The version of the wire format every message carries in its `v` field.
/// Version 2 added signed assignments (node, validity window, grants,
/// publisher signature, signature), the `rejected` state and event receipts.
pub const PROTOCOL_VERSION: u16 = 2;

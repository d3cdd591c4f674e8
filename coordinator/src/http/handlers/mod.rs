//! The handlers, one file per resource. Each turns a request into a call on
//! the store, the registry or the MQTT publisher and answers with a
//! `starling_api` type or an [`super::error::HttpError`].

pub(super) mod access;
pub(super) mod artifacts;
pub(super) mod batch;
pub(super) mod events;
pub(super) mod federation;
pub(super) mod metrics;
pub(super) mod nodes;
pub(super) mod revocations;
pub(super) mod tasks;

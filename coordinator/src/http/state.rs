//! The REST router's state: the use cases its handlers and console pages
//! call (built once by the wiring, `app.rs`), the few parts they read as
//! they are (the registry for node lists, the live feed, the federation for
//! peer signatures, the counters for `/metrics`) and what only HTTP holds
//! (console sessions, the connection cap, the API token). Nothing else
//! names it (architecture test); the store is not in it.

use std::sync::Arc;

use crate::access::MqttAccess;
use crate::counters::Counters;
use crate::federation::Federation;
use crate::live::Feed;
use crate::registry::{NodeRegistry, Registry};
use crate::service::access::Access;
use crate::service::artifacts::Artifacts;
use crate::service::peers::{not_federated, Peers};
use crate::service::status::Status;
use crate::service::tasks::Tasks;
use crate::service::ServiceError;

/// What every handler and console page is given (as `State<Arc<Shared>>`).
pub(crate) struct Shared {
    /// Tasks: submit, batch, read, list, cancel.
    pub(crate) tasks: Tasks,
    /// Nodes and tokens.
    pub(crate) access: Access,
    /// Artifacts.
    pub(crate) artifacts: Artifacts,
    /// What peer sites ask; `None` where this site does not federate.
    pub(crate) peers: Option<Peers>,
    /// Health, leadership, counts.
    pub(crate) status: Status,
    /// The nodes as reports made them (node lists, the console's fleet).
    pub(crate) registry: Arc<NodeRegistry>,
    /// The federation: peer signatures, the sites list.
    pub(crate) federation: Option<Arc<Federation>>,
    /// Which nodes are revoked (node state in lists and metrics).
    pub(crate) mqtt_access: Arc<MqttAccess>,
    /// What `/metrics` shows.
    pub(crate) counters: Arc<Counters>,
    /// The live events behind `GET /api/v1/events` and long polls.
    pub(crate) feed: Feed,
    /// The URL agents fetch from; open mode refuses requests that do not
    /// come to it.
    pub(crate) public_url: String,
    /// The bootstrap API token (`None`: open mode).
    pub(crate) api_token: Option<String>,
    /// The largest body an artifact upload may have.
    pub(crate) max_artifact_bytes: usize,
    /// The console's sessions and sparkline history.
    pub(crate) console: super::console::Console,
    /// The REST API's connection cap, and what it closed.
    pub(crate) connections: super::connections::ConnectionLimit,
}

impl Shared {
    /// The task use cases.
    pub(crate) fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// The node and token use cases.
    pub(crate) fn access(&self) -> &Access {
        &self.access
    }

    /// The artifact use cases.
    pub(crate) fn artifacts(&self) -> &Artifacts {
        &self.artifacts
    }

    /// What peer sites ask of this one; refused where it does not federate.
    pub(crate) fn peers(&self) -> Result<&Peers, ServiceError> {
        self.peers.as_ref().ok_or_else(not_federated)
    }

    /// Health, leadership, counts.
    pub(crate) fn status(&self) -> &Status {
        &self.status
    }

    /// Reads the registry (see [`NodeRegistry::read`]).
    pub(crate) fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read()
    }
}

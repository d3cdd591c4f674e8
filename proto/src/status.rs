//! Online/offline status. The agent publishes `online` (retained) after it
//! connects and registers `offline` as its MQTT last will, so the broker
//! announces a node that vanished without saying goodbye.

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;

/// Whether a node is reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Connected and accepting work.
    Online,
    /// Disconnected, cleanly or not.
    Offline,
}

/// A node's status message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Protocol version.
    pub v: u16,
    /// The node's id.
    pub node_id: NodeId,
    /// Its state.
    pub state: NodeState,
}

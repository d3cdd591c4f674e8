//! Pieces of pages that are also sent alone: a fleet row (with its
//! sparklines) and a task row. The pages render them in place; the console's
//! event stream sends them again when the node or task changes, and htmx
//! swaps them in by their ids.

use maud::{html, Markup};
use starling_api::{Role, TaskSummary};

use super::history::Sample;
use super::layout::{ago, bytes, hex_id, percent, task_badge, utc, Caller};
use super::svg::row_sparklines;
use crate::http::Shared;
use crate::registry::NodeEntry;

/// A node's state as the console shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// It said it is online and has not fallen silent.
    Online,
    /// It fell silent: the coordinator stopped hearing from it.
    Suspect,
    /// It said it went offline (its last will, or a clean stop).
    Offline,
    /// An operator revoked its credentials.
    Revoked,
    /// It has sent its capability but no status yet.
    Unknown,
}

impl NodeState {
    /// Every state, for the filter.
    pub(crate) const ALL: [NodeState; 5] = [
        NodeState::Online,
        NodeState::Suspect,
        NodeState::Offline,
        NodeState::Revoked,
        NodeState::Unknown,
    ];

    /// The state's name (filter value and badge class).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NodeState::Online => "online",
            NodeState::Suspect => "suspect",
            NodeState::Offline => "offline",
            NodeState::Revoked => "revoked",
            NodeState::Unknown => "unknown",
        }
    }

    /// The state of a registry entry; `revoked` from the access cache.
    pub(crate) fn of(entry: &NodeEntry, revoked: bool) -> Self {
        if revoked {
            NodeState::Revoked
        } else if entry.silent {
            NodeState::Suspect
        } else {
            match entry.state {
                Some(starling_proto::NodeState::Online) => NodeState::Online,
                Some(starling_proto::NodeState::Offline) => NodeState::Offline,
                None => NodeState::Unknown,
            }
        }
    }
}

/// This coordinator's site name (its federation name, else `local`).
pub(crate) fn own_site(shared: &Shared) -> String {
    shared.federation.as_ref().map_or_else(
        || "local".to_owned(),
        |federation| federation.site.to_string(),
    )
}

/// The site a node belongs to: its `site=` label, else this coordinator's.
pub(crate) fn node_site(entry: &NodeEntry, own_site: &str) -> String {
    entry
        .capability
        .labels
        .iter()
        .find(|label| label.key.as_str() == "site")
        .map(|label| label.value.to_string())
        .unwrap_or_else(|| own_site.to_owned())
}

/// What a fleet row shows of one node.
#[derive(Debug, Clone)]
pub(crate) struct NodeView {
    pub(crate) id: String,
    pub(crate) state: NodeState,
    /// Its MQTT session as its status messages say: connected, gone (last
    /// will), or not said yet.
    pub(crate) mqtt_connected: Option<bool>,
    /// When its latest telemetry (heartbeat) arrived, Unix ms.
    pub(crate) heartbeat_ms: Option<u64>,
    pub(crate) arch: String,
    pub(crate) cores: u16,
    pub(crate) memory_bytes: u64,
    pub(crate) gpus: usize,
    pub(crate) power_level: Option<u8>,
    pub(crate) cpu_load: Option<f32>,
    pub(crate) memory_used: Option<f32>,
    pub(crate) rtt_ms: Option<f32>,
    pub(crate) running_tasks: Option<u16>,
    /// Joules since the agent started, and whether a sensor or the model
    /// gave them.
    pub(crate) energy: Option<(f64, starling_proto::Source)>,
    /// The busiest GPU's load, where a sensor reports it.
    pub(crate) gpu_load: Option<f32>,
    pub(crate) labels: Vec<String>,
    pub(crate) site: String,
    pub(crate) samples: Vec<Sample>,
}

impl NodeView {
    /// The view of a registry entry with its kept samples.
    pub(crate) fn of(
        entry: &NodeEntry,
        revoked: bool,
        own_site: &str,
        samples: Vec<Sample>,
    ) -> Self {
        let capability = &entry.capability;
        let telemetry = entry.telemetry.as_ref();
        let memory_used = telemetry.and_then(|t| {
            (capability.memory_bytes > 0).then(|| {
                1.0 - (t.free_memory_bytes.min(capability.memory_bytes) as f64
                    / capability.memory_bytes as f64) as f32
            })
        });
        Self {
            id: capability.node_id.to_string(),
            state: NodeState::of(entry, revoked),
            mqtt_connected: entry
                .state
                .map(|state| state == starling_proto::NodeState::Online),
            heartbeat_ms: entry.telemetry_received_ms,
            arch: capability.arch.to_string(),
            cores: capability.cpu.cores,
            memory_bytes: capability.memory_bytes,
            gpus: capability.gpus.len(),
            power_level: telemetry.map(|t| t.power_level),
            cpu_load: telemetry.map(|t| t.cpu_load),
            memory_used,
            rtt_ms: telemetry.and_then(|t| t.link.rtt_ms),
            running_tasks: telemetry.map(|t| t.running_tasks),
            energy: telemetry.map(|t| (t.energy_joules, t.energy_source)),
            gpu_load: telemetry.and_then(|t| t.gpu_load),
            labels: capability.labels.iter().map(ToString::to_string).collect(),
            site: node_site(entry, own_site),
            samples,
        }
    }
}

/// A path segment with everything but unreserved characters escaped, for
/// links built from ids chosen by others.
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The SSE event name that carries a node's row.
pub(crate) fn node_event(id: &str) -> String {
    format!("n-{}", hex_id(id))
}

/// The SSE event name that carries a task's row.
pub(crate) fn task_event(id: &str) -> String {
    format!("t-{}", hex_id(id))
}

/// A figure and where it came from, as people read it: "3.1 J (sensor)",
/// "≈ 3.5 J (model)".
pub(crate) fn sourced(text: String, source: starling_proto::Source) -> String {
    match source {
        starling_proto::Source::Model => format!("≈ {text} (model)"),
        other => format!("{text} ({})", other.as_str()),
    }
}

/// A node's state badge.
pub(crate) fn state_badge(state: NodeState) -> Markup {
    html! { span class={ "badge " (state.as_str()) } data-state=(state.as_str()) { (state.as_str()) } }
}

/// The MQTT session and the heartbeat, shown apart: a node may hold its
/// connection and still have stopped reporting, or the reverse.
pub(crate) fn liveness(view: &NodeView, now_ms: u64) -> (Markup, Markup) {
    let mqtt = match view.mqtt_connected {
        Some(true) => html! { span.badge.connected { "connected" } },
        Some(false) => html! { span.badge.disconnected { "disconnected" } },
        None => html! { span.muted { "not said" } },
    };
    let heartbeat = match view.heartbeat_ms {
        Some(at) => html! { span title=(utc(at)) { (ago(now_ms, at)) } },
        None => html! { span.muted { "none yet" } },
    };
    (mqtt, heartbeat)
}

/// One fleet row: the row element stays while the stream replaces its
/// cells ([`node_cells`]), so its listener is never lost between two
/// events that follow each other closely.
pub(crate) fn node_row(view: &NodeView, caller: &Caller, now_ms: u64) -> Markup {
    let event = node_event(&view.id);
    html! {
        tr id=(event) sse-swap=(event) hx-swap="innerHTML" data-node=(view.id) {
            (node_cells(view, caller, now_ms))
        }
    }
}

/// A fleet row's cells. `caller` decides whether it has a checkbox for
/// bulk revoke.
pub(crate) fn node_cells(view: &NodeView, caller: &Caller, now_ms: u64) -> Markup {
    let (mqtt, heartbeat) = liveness(view, now_ms);
    let (cpu_line, memory_line, rtt_line) = row_sparklines(&view.samples);
    html! {
        @if caller.may(Role::Operator) {
            td { input type="checkbox" name="node" value=(view.id) form="bulk" aria-label={ "select " (view.id) }; }
        }
        td { a href={ "/nodes/" (segment(&view.id)) } { (view.id) } }
        td { (state_badge(view.state)) }
        td { (mqtt) }
        td { (heartbeat) }
        td { (view.arch) }
        td.num { (view.cores) }
        td.num { (bytes(view.memory_bytes)) }
        td.num { (view.gpus) }
        td.num { (view.power_level.map_or("–".to_owned(), |level| level.to_string())) }
        td.num { (view.cpu_load.map_or("–".to_owned(), percent)) (cpu_line) }
        td.num { (view.memory_used.map_or("–".to_owned(), percent)) (memory_line) }
        td.num { (view.rtt_ms.map_or("–".to_owned(), |rtt| format!("{rtt:.1} ms"))) (rtt_line) }
        td { (view.site) }
        td.wrap.muted { (view.labels.join(", ")) }
    }
}

/// One task row; like a fleet row, the stream replaces only its cells.
pub(crate) fn task_row(task: &TaskSummary, now_ms: u64) -> Markup {
    let event = task_event(&task.id);
    html! {
        tr id=(event) sse-swap=(event) hx-swap="innerHTML" data-task=(task.id) {
            (task_cells(task, now_ms))
        }
    }
}

/// A task row's cells.
pub(crate) fn task_cells(task: &TaskSummary, now_ms: u64) -> Markup {
    html! {
        td.mono { a href={ "/tasks/" (segment(&task.id)) } { (task.id) } }
        td { (task_badge(task.state)) }
        td.mono { a href={ "/artifacts#a-" (task.artifact) } { (task.artifact.get(..12).unwrap_or(&task.artifact)) } }
        td {
            @if let Some(node) = &task.node_id {
                a href={ "/nodes/" (segment(node)) } { (node) }
            } @else if let Some(site) = &task.site {
                "site " (site)
            } @else {
                span.muted { "–" }
            }
        }
        td.num { (task.attempt) }
        td.num { (task.priority) }
        td title=(utc(task.created_ms)) { (ago(now_ms, task.created_ms)) }
        td title=(utc(task.updated_ms)) { (ago(now_ms, task.updated_ms)) }
        td.muted { (task.reason.as_deref().unwrap_or("")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_never_shape_links_or_event_names() {
        assert_eq!(segment("pi-1"), "pi-1");
        assert_eq!(segment("a/b?c"), "a%2Fb%3Fc");
        assert_eq!(node_event("x\ny"), "n-780a79");
        assert_eq!(task_event("t"), "t-74");
    }
}

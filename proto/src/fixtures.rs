//! Example reports for tests, shared by every crate's tests: a field added
//! to [`Capability`] or [`Telemetry`] is added here once, and each test
//! changes only what it is about (`Telemetry { cpu_load: 0.5,
//! ..fixtures::telemetry("edge-1", 1, 1_000) }`). Not for production
//! reports: those come from the agent's probes.

use heapless::String;

use crate::capability::{Capability, CpuInfo, Runtime};
use crate::ids::NodeId;
use crate::telemetry::{LinkState, Telemetry};
use crate::PROTOCOL_VERSION;

/// A short literal as a bounded string.
// Every literal in this module is shorter than the smallest field it fills
// (64 bytes): a longer one is a bug in this file, caught by its tests.
#[allow(clippy::expect_used)]
fn text<const N: usize>(literal: &'static str) -> String<N> {
    let mut text = String::new();
    text.push_str(literal)
        .expect("a fixture's literal fits its field");
    text
}

/// `name` as a node id; a name that is not a valid node id falls back to
/// `node`.
#[allow(clippy::expect_used)] // "node" is a valid node id
fn node_id(name: &str) -> NodeId {
    NodeId::new(name)
        .or_else(|_| NodeId::new("node"))
        .expect("\"node\" is a valid node id")
}

/// An x86_64 Linux node with 4 cores (800–3000 MHz) and 8 GiB that runs
/// wasm, with no GPU, disk, interface, label or power level reported.
pub fn capability(node: &str) -> Capability {
    let mut runtimes = heapless::Vec::new();
    // One runtime into an empty list of MAX_RUNTIMES (at least one).
    let _ = runtimes.push(Runtime::Wasm);
    Capability {
        v: PROTOCOL_VERSION,
        node_id: node_id(node),
        agent_version: text("0.1.0"),
        arch: text("x86_64"),
        os: text("linux"),
        cpu: CpuInfo {
            model: text("test cpu"),
            cores: 4,
            min_mhz: 800,
            max_mhz: 3000,
            speed: None,
            speed_source: Default::default(),
        },
        memory_bytes: 8 << 30,
        gpus: Default::default(),
        disks: Default::default(),
        interfaces: Default::default(),
        labels: Default::default(),
        runtimes,
        power_levels: Default::default(),
        power_control: Default::default(),
        wasm: Default::default(),
    }
}

/// Telemetry of an idle node (no load, 4 GiB free, nothing running, no link
/// measured, no energy), listing no attempt and not saying the list is
/// complete.
pub fn telemetry(node: &str, seq: u64, uptime_ms: u64) -> Telemetry {
    Telemetry {
        v: PROTOCOL_VERSION,
        node_id: node_id(node),
        seq,
        uptime_ms,
        cpu_load: 0.0,
        free_memory_bytes: 4 << 30,
        io_read_bps: 0,
        io_write_bps: 0,
        link: LinkState {
            rtt_ms: None,
            bandwidth_mbps: None,
            loss: None,
        },
        running_tasks: 0,
        queued_tasks: 0,
        power_level: 0,
        energy_joules: 0.0,
        energy_source: Default::default(),
        gpu_load: None,
        attempts: Default::default(),
        attempts_complete: false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    #[test]
    fn the_fixtures_are_valid_reports_that_survive_the_codec() {
        let capability = capability("edge-1");
        assert_eq!(capability.node_id.as_str(), "edge-1");
        assert_eq!(capability.runtimes.as_slice(), [Runtime::Wasm]);
        let bytes = encode(&capability).unwrap();
        assert_eq!(decode::<Capability>(&bytes).unwrap(), capability);
        let telemetry = telemetry("edge-1", 3, 3_000);
        let bytes = encode(&telemetry).unwrap();
        assert_eq!(decode::<Telemetry>(&bytes).unwrap(), telemetry);
        assert_eq!(capability_of_bad_name().node_id.as_str(), "node");
    }

    fn capability_of_bad_name() -> Capability {
        capability("not a node id!")
    }
}

//! What crosses the wire, seen from outside Starling: a plain MQTT client
//! (`mosquitto_sub`) reads each agent's retained Capability and decodes it with
//! a generic CBOR reader (ciborium), and the figures match this machine.

use std::process::Command;
use std::time::Duration;

use ciborium::Value;
use starling_tests::{machine_cpus_and_memory, Agent, Coordinator, Mosquitto, Store};

fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    map.as_map()
        .expect("a CBOR map")
        .iter()
        .find(|(k, _)| k.as_text() == Some(key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {key:?} in {map:?}"))
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_plain_mqtt_client_reads_every_capability() {
    let _turn = crate::alongside();
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &[]);
    let _a = Agent::start(&coordinator, &broker.url, "wire-a", "zone=lab");
    let _b = Agent::start(&coordinator, &broker.url, "wire-b", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(30));

    // Capabilities are retained: a subscriber arriving now still gets both.
    let out = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args(["-t", "starling/v1/#", "-F", "%t %x", "-W", "20"])
        .args(["-C", "40"])
        .output()
        .expect("mosquitto_sub is installed (scripts/test installs mosquitto-clients)");
    let text = String::from_utf8_lossy(&out.stdout);
    let (cpus, memory) = machine_cpus_and_memory();
    let mut seen = Vec::new();
    for line in text.lines() {
        let Some((topic, hex)) = line.split_once(' ') else {
            continue;
        };
        if !topic.ends_with("/capability") {
            continue;
        }
        let message = starling_tests::report_message(&hex_decode(hex));
        let value: Value = ciborium::from_reader(message.as_slice()).unwrap();
        let node = field(&value, "node_id").as_text().unwrap().to_string();
        assert_eq!(topic, format!("starling/v1/nodes/{node}/capability"));
        assert_eq!(
            field(&value, "v").as_integer().map(i128::from),
            Some(i128::from(starling_proto::PROTOCOL_VERSION))
        );
        let cores = field(field(&value, "cpu"), "cores")
            .as_integer()
            .map(i128::from);
        assert_eq!(cores, Some(i128::from(cpus)), "CPU count of {node}");
        let reported = field(&value, "memory_bytes")
            .as_integer()
            .map(i128::from)
            .unwrap();
        // sysinfo and /proc/meminfo agree to within a page or two.
        assert!(
            (reported - i128::from(memory)).abs() < 1 << 20,
            "memory of {node}: {reported} vs {memory}"
        );
        let runtimes = field(&value, "runtimes").as_array().unwrap();
        assert!(runtimes.iter().any(|r| r.as_text() == Some("wasm")));
        if node == "wire-a" {
            let labels = field(&value, "labels").as_array().unwrap();
            assert_eq!(field(&labels[0], "key").as_text(), Some("zone"));
            assert_eq!(field(&labels[0], "value").as_text(), Some("lab"));
        }
        seen.push(node);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["wire-a", "wire-b"], "subscriber output:\n{text}");
}

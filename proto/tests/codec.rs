//! Round trips of every message through the codec, decoding by an independent
//! CBOR reader, and the refusal of garbage, oversize and deep input.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use starling_proto::limits::{MAX_MESSAGE_BYTES, MAX_NESTING_DEPTH};
use starling_proto::*;

fn hs<const N: usize>(s: &str) -> heapless::String<N> {
    heapless::String::try_from(s).unwrap()
}

fn node_id() -> impl Strategy<Value = NodeId> {
    "[a-zA-Z0-9_-]{1,64}".prop_map(|s| NodeId::new(&s).unwrap())
}

fn task_id() -> impl Strategy<Value = TaskId> {
    "[a-zA-Z0-9_.:-]{1,64}".prop_map(|s| TaskId::new(&s).unwrap())
}

fn digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

fn label() -> impl Strategy<Value = Label> {
    ("[a-z0-9_./-]{1,32}", "[a-zA-Z0-9 _.:-]{0,64}").prop_map(|(k, v)| Label::new(&k, &v).unwrap())
}

/// A finite, non-negative figure (rates, watts, loads): decoders refuse
/// NaN, infinities and negatives.
fn non_negative() -> impl Strategy<Value = f32> {
    0.0f32..1.0e6f32
}

/// A power level's speed factor: finite and above 0.
fn speed_factor() -> impl Strategy<Value = f32> {
    0.01f32..=1.0f32
}

fn capability() -> impl Strategy<Value = Capability> {
    (
        node_id(),
        prop::collection::vec(label(), 0..8),
        prop::collection::vec((any::<u32>(), any::<u64>(), "[ -~]{0,40}"), 0..4),
        (1u16..512, any::<u64>(), any::<u32>(), any::<u32>()),
        prop::collection::vec((speed_factor(), non_negative(), non_negative()), 0..4),
    )
        .prop_map(
            |(node_id, labels, gpus, (cores, memory, min, max), levels)| {
                let mut cap = Capability {
                    v: PROTOCOL_VERSION,
                    node_id,
                    agent_version: hs("0.1.0"),
                    arch: hs("aarch64"),
                    os: hs("Linux 6.1"),
                    cpu: CpuInfo {
                        model: hs("Cortex-A72"),
                        cores,
                        min_mhz: min,
                        max_mhz: max,
                        speed: None,
                        speed_source: Default::default(),
                    },
                    memory_bytes: memory,
                    gpus: heapless::Vec::new(),
                    disks: heapless::Vec::new(),
                    interfaces: heapless::Vec::new(),
                    labels: heapless::Vec::new(),
                    runtimes: heapless::Vec::from_slice(&[Runtime::Wasm, Runtime::Opencl]).unwrap(),
                    power_levels: heapless::Vec::new(),
                    power_control: if min % 2 == 0 {
                        starling_proto::PowerControl::Cpufreq
                    } else {
                        starling_proto::PowerControl::None
                    },
                    wasm: starling_proto::WasmEngine {
                        compiles: max % 2 == 0,
                        engine: hs("wasmtime-48/starling-1"),
                        target: hs("aarch64-unknown-linux"),
                    },
                };
                for l in labels {
                    cap.labels.push(l).unwrap();
                }
                for (cu, mem, name) in gpus {
                    cap.gpus
                        .push(GpuDevice {
                            platform: hs("Portable Computing Language"),
                            vendor: hs("pocl"),
                            name: hs(&name),
                            kind: GpuKind::Cpu,
                            compute_units: cu,
                            memory_bytes: mem,
                            max_clock_mhz: 1500,
                            version: hs("OpenCL 3.0 PoCL"),
                            local_memory_bytes: 4 << 20,
                            max_alloc_bytes: mem / 4,
                            max_work_group_size: 4096,
                            fp64: true,
                            gflops: Some(cu as f32 * 1.5),
                        })
                        .unwrap();
                }
                for (i, (s, idle, active)) in levels.into_iter().enumerate() {
                    cap.power_levels
                        .push(PowerLevel {
                            level: i as u8,
                            name: hs("level"),
                            speed_factor: s,
                            idle_watts: idle,
                            active_watts: active,
                            source: Default::default(),
                        })
                        .unwrap();
                }
                cap.disks
                    .push(DiskInfo {
                        name: hs("mmcblk0"),
                        mount: hs("/"),
                        total_bytes: 32 << 30,
                        available_bytes: 10 << 30,
                        read_mbps: 90.0,
                        write_mbps: 30.0,
                        rate_source: RateSource::Measured,
                    })
                    .unwrap();
                cap.interfaces
                    .push(NetInterface {
                        name: hs("wlan0"),
                        mac: Some(hs("dc:a6:32:00:00:01")),
                        speed_mbps: None,
                    })
                    .unwrap();
                cap
            },
        )
}

fn assignment() -> impl Strategy<Value = Assignment> {
    (
        task_id(),
        any::<u32>(),
        digest(),
        prop::collection::vec("[ -~]{0,32}", 0..6),
        prop::collection::vec(any::<u8>(), 0..2048),
        any::<u8>(),
        proptest::option::of(any::<u64>()),
        (any::<bool>(), any::<bool>(), any::<u64>(), any::<bool>()),
    )
        .prop_map(
            |(task_id, attempt, artifact, args, input, power_level, deadline, extra)| Assignment {
                v: PROTOCOL_VERSION,
                node_id: NodeId::new("pi-1").unwrap(),
                task_id,
                attempt,
                runtime: Runtime::Wasm,
                artifact,
                artifact_url: hs("http://127.0.0.1:7878/api/v1/artifacts/x"),
                args: args.iter().map(|a| hs(a)).collect(),
                input,
                limits: ExecLimits::default(),
                power_level,
                deadline_unix_ms: deadline,
                grants: Grants {
                    clock: extra.0,
                    random: extra.1,
                },
                publisher: extra.3.then(|| PublisherSignature {
                    key: vec![7; 32],
                    signature: vec![9; 64],
                }),
                precompiled: extra.0.then(|| starling_proto::PrecompiledModule {
                    digest: artifact,
                    url: hs("http://127.0.0.1:7878/api/v1/artifacts/y"),
                }),
                leader_epoch: extra.1.then_some(extra.2 / 3),
                issued_unix_ms: extra.2 / 2,
                expires_unix_ms: extra.2,
                signature: if extra.3 { vec![1; 64] } else { Vec::new() },
            },
        )
}

fn event() -> impl Strategy<Value = TaskEvent> {
    (
        task_id(),
        any::<u32>(),
        node_id(),
        prop::collection::vec(any::<u8>(), 0..2048),
        proptest::option::of(any::<i32>()),
        "[ -~]{0,100}",
    )
        .prop_map(|(task_id, attempt, node_id, output, exit_code, message)| {
            let mut e =
                TaskEvent::failed(task_id, attempt, node_id, FailureReason::Timeout, &message);
            e.output = output;
            e.exit_code = exit_code;
            e.metrics = Some(ExecMetrics {
                wall_ms: 12,
                compile_ms: 3,
                peak_memory_bytes: 65536,
                cache_hit: true,
            });
            e
        })
}

fn telemetry() -> impl Strategy<Value = Telemetry> {
    (
        node_id(),
        any::<u64>(),
        0.0f32..1.0,
        any::<u64>(),
        proptest::option::of(non_negative()),
    )
        .prop_map(|(node_id, seq, load, free, rtt)| Telemetry {
            v: PROTOCOL_VERSION,
            node_id,
            seq,
            uptime_ms: seq.wrapping_mul(1000),
            cpu_load: load,
            free_memory_bytes: free,
            io_read_bps: 1000,
            io_write_bps: 2000,
            link: LinkState {
                rtt_ms: rtt,
                bandwidth_mbps: None,
                loss: Some(0.0),
            },
            running_tasks: 1,
            queued_tasks: 2,
            power_level: 1,
            energy_joules: 12.5,
            energy_source: Default::default(),
            gpu_load: None,
            attempts: Default::default(),
            attempts_complete: false,
        })
}

proptest! {
    #[test]
    fn capability_round_trips(m in capability()) {
        let bytes = encode(&m).unwrap();
        prop_assert_eq!(decode::<Capability>(&bytes).unwrap(), m);
    }

    #[test]
    fn telemetry_round_trips(m in telemetry()) {
        let bytes = encode(&m).unwrap();
        prop_assert_eq!(decode::<Telemetry>(&bytes).unwrap(), m);
    }

    #[test]
    fn assignment_round_trips(m in assignment()) {
        let bytes = encode(&m).unwrap();
        prop_assert_eq!(decode::<Assignment>(&bytes).unwrap(), m);
    }

    #[test]
    fn event_round_trips(m in event()) {
        let bytes = encode(&m).unwrap();
        prop_assert_eq!(decode::<TaskEvent>(&bytes).unwrap(), m);
    }

    #[test]
    fn status_and_cancel_round_trip(n in node_id(), t in task_id(), attempt in any::<u32>(), online in any::<bool>()) {
        let status = Status { v: PROTOCOL_VERSION, node_id: n, state: if online { NodeState::Online } else { NodeState::Offline } };
        prop_assert_eq!(decode::<Status>(&encode(&status).unwrap()).unwrap(), status);
        let cancel = Cancel { v: PROTOCOL_VERSION, task_id: t, attempt };
        prop_assert_eq!(decode::<Cancel>(&encode(&cancel).unwrap()).unwrap(), cancel);
    }

    /// Garbage never panics: it decodes to a typed error (or, rarely, a valid message).
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let _ = decode::<Capability>(&bytes);
        let _ = decode::<Telemetry>(&bytes);
        let _ = decode::<Assignment>(&bytes);
        let _ = decode::<TaskEvent>(&bytes);
        let _ = decode::<Status>(&bytes);
        let _ = decode::<Cancel>(&bytes);
    }

    /// Every strict prefix of a valid message is refused as malformed, before serde sees it.
    #[test]
    fn truncated_messages_are_malformed(m in event(), cut in 0usize..100) {
        let bytes = encode(&m).unwrap();
        let cut = cut % bytes.len();
        let err = decode::<TaskEvent>(&bytes[..cut]).unwrap_err();
        prop_assert!(matches!(err, DecodeError::Malformed(_)), "{}", err);
    }
}

#[test]
fn a_generic_cbor_reader_sees_named_fields() {
    let status = Status {
        v: PROTOCOL_VERSION,
        node_id: NodeId::new("pi-1").unwrap(),
        state: NodeState::Offline,
    };
    let bytes = encode(&status).unwrap();
    let value: ciborium::Value = ciborium::from_reader(bytes.as_slice()).unwrap();
    let map = value.as_map().expect("a CBOR map");
    let get = |k: &str| {
        map.iter()
            .find(|(key, _)| key.as_text() == Some(k))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("v").unwrap().as_integer().map(i128::from), Some(2));
    assert_eq!(get("node_id").unwrap().as_text(), Some("pi-1"));
    assert_eq!(get("state").unwrap().as_text(), Some("offline"));
}

/// The exact bytes of a small message, so a change to the wire format shows up
/// in review rather than in the field.
#[test]
fn status_bytes_are_stable() {
    let status = Status {
        v: PROTOCOL_VERSION,
        node_id: NodeId::new("n1").unwrap(),
        state: NodeState::Online,
    };
    let bytes = encode(&status).unwrap();
    // {"v": 2, "node_id": "n1", "state": "online"}
    let expected: &[u8] = &[
        0xa3, 0x61, b'v', 0x02, 0x67, b'n', b'o', b'd', b'e', b'_', b'i', b'd', 0x62, b'n', b'1',
        0x65, b's', b't', b'a', b't', b'e', 0x66, b'o', b'n', b'l', b'i', b'n', b'e',
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn oversize_input_is_refused_before_parsing() {
    let bytes = vec![0u8; MAX_MESSAGE_BYTES + 1];
    assert_eq!(
        decode::<Status>(&bytes).unwrap_err(),
        DecodeError::TooLarge {
            len: MAX_MESSAGE_BYTES + 1,
            max: MAX_MESSAGE_BYTES
        }
    );
}

#[test]
fn deep_nesting_is_refused() {
    // 1000 nested one-element arrays: would recurse deeply in a naive decoder.
    let mut bytes = vec![0x81u8; 1000];
    bytes.push(0x00);
    assert_eq!(
        decode::<Status>(&bytes).unwrap_err(),
        DecodeError::TooDeep {
            max: MAX_NESTING_DEPTH
        }
    );
    // Indefinite-length arrays nest just the same.
    let mut bytes = vec![0x9fu8; 100];
    bytes.extend(std::iter::repeat_n(0xffu8, 100));
    assert!(matches!(
        decode::<Status>(&bytes),
        Err(DecodeError::TooDeep { .. })
    ));
}

#[test]
fn lying_lengths_are_refused() {
    // A map claiming 2^32 entries in a 9-byte message.
    let bytes = [0xbb, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(
        decode::<Status>(&bytes).unwrap_err(),
        DecodeError::Malformed("container longer than input")
    );
    // A text string claiming more bytes than remain.
    assert_eq!(
        decode::<Status>(&[0x7a, 0xff, 0xff, 0xff, 0xff, b'a']).unwrap_err(),
        DecodeError::Malformed("string longer than input")
    );
    // Trailing bytes after a complete item.
    assert_eq!(
        decode::<Status>(&[0xa0, 0x00]).unwrap_err(),
        DecodeError::Malformed("trailing bytes after the message")
    );
}

#[test]
fn wrong_shapes_and_versions_are_typed_errors() {
    let status = Status {
        v: 99,
        node_id: NodeId::new("n1").unwrap(),
        state: NodeState::Online,
    };
    let bytes = serde_cbor::to_vec(&status).unwrap();
    assert_eq!(
        decode::<Status>(&bytes).unwrap_err(),
        DecodeError::UnsupportedVersion {
            message: "status",
            got: 99,
            supported: PROTOCOL_VERSION
        }
    );
    // A well-formed map that is not a status.
    let err = decode::<Status>(&[0xa0]).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Invalid {
                message: "status",
                ..
            }
        ),
        "{err}"
    );
    // A node id with a topic wildcard is refused by the id's own check.
    let bytes = serde_cbor::to_vec(&serde_cbor::Value::Map(
        [
            (
                serde_cbor::Value::Text("v".into()),
                serde_cbor::Value::Integer(1),
            ),
            (
                serde_cbor::Value::Text("node_id".into()),
                serde_cbor::Value::Text("a/#".into()),
            ),
            (
                serde_cbor::Value::Text("state".into()),
                serde_cbor::Value::Text("online".into()),
            ),
        ]
        .into_iter()
        .collect(),
    ))
    .unwrap();
    let err = decode::<Status>(&bytes).unwrap_err();
    assert!(
        err.to_string().contains("node id may only contain"),
        "{err}"
    );
}

#[test]
fn oversize_inline_input_is_refused_both_ways() {
    let mut a = Assignment {
        v: PROTOCOL_VERSION,
        node_id: NodeId::new("n").unwrap(),
        task_id: TaskId::new("t1").unwrap(),
        attempt: 1,
        runtime: Runtime::Wasm,
        artifact: Digest([0; 32]),
        artifact_url: hs("http://x"),
        args: heapless::Vec::new(),
        input: vec![0; limits::MAX_INLINE_INPUT_BYTES + 1],
        limits: ExecLimits::default(),
        power_level: 0,
        deadline_unix_ms: None,
        grants: Grants::default(),
        publisher: None,
        precompiled: None,
        leader_epoch: None,
        issued_unix_ms: 0,
        expires_unix_ms: 0,
        signature: Vec::new(),
    };
    assert!(matches!(encode(&a), Err(EncodeError::Invalid { .. })));
    let bytes = serde_cbor::to_vec(&a).unwrap();
    assert!(matches!(
        decode::<Assignment>(&bytes),
        Err(DecodeError::Invalid { .. })
    ));
    a.input.truncate(10);
    assert!(encode(&a).is_ok());
}

#[test]
fn too_many_labels_are_refused() {
    // Build a capability map by hand with one label more than allowed.
    let cap = capability()
        .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
        .unwrap()
        .current();
    let mut value: serde_cbor::Value =
        serde_cbor::from_slice(&serde_cbor::to_vec(&cap).unwrap()).unwrap();
    if let serde_cbor::Value::Map(map) = &mut value {
        let labels: Vec<serde_cbor::Value> = (0..=limits::MAX_LABELS)
            .map(|i| {
                serde_cbor::Value::Map(
                    [
                        (
                            serde_cbor::Value::Text("key".into()),
                            serde_cbor::Value::Text(format!("k{i}")),
                        ),
                        (
                            serde_cbor::Value::Text("value".into()),
                            serde_cbor::Value::Text("v".into()),
                        ),
                    ]
                    .into_iter()
                    .collect(),
                )
            })
            .collect();
        map.insert(
            serde_cbor::Value::Text("labels".into()),
            serde_cbor::Value::Array(labels),
        );
    }
    let bytes = serde_cbor::to_vec(&value).unwrap();
    assert!(matches!(
        decode::<Capability>(&bytes),
        Err(DecodeError::Invalid { .. })
    ));
}

fn signed_assignment() -> Assignment {
    Assignment {
        v: PROTOCOL_VERSION,
        node_id: NodeId::new("pi-1").unwrap(),
        task_id: TaskId::new("t1").unwrap(),
        attempt: 2,
        runtime: Runtime::Wasm,
        artifact: Digest([3; 32]),
        artifact_url: hs("http://x"),
        args: heapless::Vec::new(),
        input: b"in".to_vec(),
        limits: ExecLimits::default(),
        power_level: 1,
        deadline_unix_ms: None,
        grants: Grants::default(),
        publisher: None,
        precompiled: None,
        leader_epoch: None,
        issued_unix_ms: 1_000,
        expires_unix_ms: 61_000,
        signature: vec![5; 64],
    }
}

#[test]
fn signed_bytes_ignore_the_signature_and_cover_everything_else() {
    let a = signed_assignment();
    let mut b = a.clone();
    b.signature = vec![6; 64];
    assert_eq!(a.signed_bytes().unwrap(), b.signed_bytes().unwrap());
    // Decoding and re-encoding gives the verifier the signer's bytes.
    let decoded: Assignment = decode(&encode(&a).unwrap()).unwrap();
    assert_eq!(decoded.signed_bytes().unwrap(), a.signed_bytes().unwrap());
    for change in [
        |a: &mut Assignment| a.attempt += 1,
        |a: &mut Assignment| a.node_id = NodeId::new("pi-2").unwrap(),
        |a: &mut Assignment| a.expires_unix_ms += 1,
        |a: &mut Assignment| a.grants.clock = true,
        |a: &mut Assignment| a.input.push(0),
        |a: &mut Assignment| {
            a.precompiled = Some(starling_proto::PrecompiledModule {
                digest: Digest([4; 32]),
                url: hs("http://x/p"),
            })
        },
        |a: &mut Assignment| a.leader_epoch = Some(7),
    ] {
        let mut c = a.clone();
        change(&mut c);
        assert_ne!(c.signed_bytes().unwrap(), a.signed_bytes().unwrap());
    }
}

/// An assignment without precompiled code encodes as it did before the field
/// existed, so an agent from before it (which re-encodes what it decoded to
/// check the signature) still verifies it; with code, the digest is signed.
#[test]
fn precompiled_code_is_absent_from_the_encoding_unless_present() {
    let plain = signed_assignment();
    let bytes = plain.signed_bytes().unwrap();
    let value: ciborium::Value = ciborium::from_reader(bytes.as_slice()).unwrap();
    let keys: Vec<String> = value
        .as_map()
        .unwrap()
        .iter()
        .filter_map(|(key, _)| key.as_text().map(str::to_owned))
        .collect();
    assert!(!keys.iter().any(|k| k == "precompiled"), "{keys:?}");
    assert!(!keys.iter().any(|k| k == "leader_epoch"), "{keys:?}");
    assert_eq!(keys.len(), 17, "{keys:?}");
    let mut compiled = plain.clone();
    compiled.precompiled = Some(starling_proto::PrecompiledModule {
        digest: Digest([4; 32]),
        url: hs("http://x/p"),
    });
    let decoded: Assignment = decode(&encode(&compiled).unwrap()).unwrap();
    assert_eq!(decoded, compiled);
    assert_eq!(
        decoded.signed_bytes().unwrap(),
        compiled.signed_bytes().unwrap()
    );
    let mut from_a_leader = plain.clone();
    from_a_leader.leader_epoch = Some(3);
    let decoded: Assignment = decode(&encode(&from_a_leader).unwrap()).unwrap();
    assert_eq!(decoded, from_a_leader);
}

#[test]
fn signatures_and_publisher_keys_of_the_wrong_size_are_refused() {
    let mut a = signed_assignment();
    a.signature = vec![5; 63];
    assert!(matches!(encode(&a), Err(EncodeError::Invalid { .. })));
    let bytes = serde_cbor::to_vec(&a).unwrap();
    assert!(matches!(
        decode::<Assignment>(&bytes),
        Err(DecodeError::Invalid { .. })
    ));
    a.signature = Vec::new();
    a.publisher = Some(PublisherSignature {
        key: vec![1; 31],
        signature: vec![2; 64],
    });
    assert!(matches!(encode(&a), Err(EncodeError::Invalid { .. })));
}

#[test]
fn event_acks_round_trip_on_their_own_channel() {
    let ack = EventAck {
        v: PROTOCOL_VERSION,
        task_id: TaskId::new("t1").unwrap(),
        attempt: 3,
        state: TaskState::Rejected,
    };
    assert_eq!(decode::<EventAck>(&encode(&ack).unwrap()).unwrap(), ack);
    assert!(TaskState::Rejected.is_terminal());
    let topics = Topics::default();
    let node = NodeId::new("pi-1").unwrap();
    assert_eq!(
        topics.node(&node, Channel::Ack),
        "starling/v1/nodes/pi-1/ack"
    );
    assert_eq!(
        topics.parse("starling/v1/nodes/pi-1/ack"),
        Some((node, Channel::Ack))
    );
}

/// The figures a decoder must refuse: NaN, both infinities and a negative.
const BAD_FIGURES: [f32; 4] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0];

/// Encodes without the codec's checks, as a broken or hostile peer would.
fn unchecked_bytes<T: serde::Serialize>(message: &T) -> Vec<u8> {
    serde_cbor::to_vec(message).unwrap()
}

fn assert_refused<M: Message + std::fmt::Debug>(message: &M, what: &str) {
    assert!(encode(message).is_err(), "encode accepted {what}");
    match decode::<M>(&unchecked_bytes(message)) {
        Err(DecodeError::Invalid { message, detail }) => {
            assert_eq!(message, M::NAME);
            assert!(detail.contains("finite"), "{what}: {detail}");
        }
        other => panic!("decode of {what} gave {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every float of a capability that placement computes with refuses NaN,
    /// infinities and negatives; a speed factor also refuses 0.
    #[test]
    fn capabilities_with_non_finite_figures_are_refused(cap in capability()) {
        for bad in BAD_FIGURES {
            let mut gpu = cap.clone();
            if let Some(device) = gpu.gpus.first_mut() {
                device.gflops = Some(bad);
                assert_refused(&gpu, &format!("gflops {bad}"));
            }
            let mut speed = cap.clone();
            speed.cpu.speed = Some(bad);
            assert_refused(&speed, &format!("cpu speed {bad}"));
            let mut disk = cap.clone();
            if let Some(entry) = disk.disks.first_mut() {
                entry.read_mbps = bad;
                assert_refused(&disk, &format!("read_mbps {bad}"));
            }
            if !cap.power_levels.is_empty() {
                for field in 0..3 {
                    let mut level = cap.clone();
                    let first = &mut level.power_levels[0];
                    match field {
                        0 => first.speed_factor = bad,
                        1 => first.idle_watts = bad,
                        _ => first.active_watts = bad,
                    }
                    assert_refused(&level, &format!("power level field {field} = {bad}"));
                }
                let mut stopped = cap.clone();
                stopped.power_levels[0].speed_factor = 0.0;
                assert_refused(&stopped, "speed_factor 0");
            }
        }
    }

    #[test]
    fn telemetry_with_non_finite_figures_is_refused(report in telemetry()) {
        for bad in BAD_FIGURES {
            for field in 0..4 {
                let mut broken = report.clone();
                match field {
                    0 => broken.cpu_load = bad,
                    1 => broken.link.rtt_ms = Some(bad),
                    2 => broken.link.bandwidth_mbps = Some(bad),
                    _ => broken.link.loss = Some(bad),
                }
                assert_refused(&broken, &format!("telemetry field {field} = {bad}"));
            }
            let mut energy = report.clone();
            energy.energy_joules = f64::from(bad);
            assert_refused(&energy, &format!("energy_joules {bad}"));
            let mut gpu = report.clone();
            gpu.gpu_load = Some(bad);
            assert_refused(&gpu, &format!("gpu_load {bad}"));
        }
        // Fractions past 1: a broken sensor or a node lying about its link.
        for field in 0..2 {
            let mut broken = report.clone();
            match field {
                0 => broken.link.loss = Some(1.5),
                _ => broken.gpu_load = Some(1.5),
            }
            prop_assert!(encode(&broken).is_err());
            match decode::<Telemetry>(&unchecked_bytes(&broken)) {
                Err(DecodeError::Invalid { detail, .. }) => {
                    prop_assert!(detail.contains("more than 1"), "{}", detail);
                }
                other => prop_assert!(false, "fraction field {} decoded: {:?}", field, other),
            }
        }
    }

    /// A node id in any message decodes only when it is made of ASCII
    /// letters, digits, `-` and `_`; everything else is a typed error.
    #[test]
    fn node_ids_outside_the_alphabet_are_refused(text in "[ -~]{1,64}") {
        let status = Status {
            v: PROTOCOL_VERSION,
            node_id: NodeId::new("placeholder").unwrap(),
            state: NodeState::Online,
        };
        let mut value: ciborium::Value =
            ciborium::de::from_reader(unchecked_bytes(&status).as_slice()).unwrap();
        if let ciborium::Value::Map(fields) = &mut value {
            for (key, field) in fields.iter_mut() {
                if key.as_text() == Some("node_id") {
                    *field = ciborium::Value::Text(text.clone());
                }
            }
        }
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(&value, &mut bytes).unwrap();
        let valid = text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        match decode::<Status>(&bytes) {
            Ok(decoded) => {
                prop_assert!(valid, "{:?} was accepted", text);
                prop_assert_eq!(decoded.node_id.as_str(), text.as_str());
            }
            Err(error) => {
                prop_assert!(!valid, "{:?} was refused: {}", text, error);
                prop_assert!(matches!(error, DecodeError::Invalid { .. }), "{}", error);
            }
        }
    }
}

//! Layering of flags, file and defaults, and every refusal of a bad setting.

use super::*;

#[test]
fn flags_beat_file_beats_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coordinator.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:9000\"\npolicy = \"random\"\nmqtt-listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path),
        policy: Some("least-loaded".into()),
        ..ServeArgs::default()
    };
    let config = args.resolve().unwrap();
    assert_eq!(config.listen, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(config.mqtt_listen, "127.0.0.1:0".parse().unwrap());
    assert_eq!(config.policy, "least-loaded");
    assert_eq!(config.topic_prefix, "starling/v1");
    assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(config.node_timeout, DEFAULT_NODE_TIMEOUT);
    assert_eq!(config.assignment_ttl, DEFAULT_ASSIGNMENT_TTL);
}

#[test]
fn delivery_durations_parse_from_flags_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coordinator.toml");
    std::fs::write(
        &path,
        "node-timeout = \"2s\"\nresend-interval = \"250ms\"\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path),
        node_timeout: Some("1500ms".into()),
        assignment_ttl: Some("2m".into()),
        ..ServeArgs::default()
    };
    let config = args.resolve().unwrap();
    assert_eq!(config.node_timeout, Duration::from_millis(1500));
    assert_eq!(config.resend_interval, Duration::from_millis(250));
    assert_eq!(config.assignment_ttl, Duration::from_secs(120));
    for bad in ["0", "soon", "5 parsecs", "-1s"] {
        let args = ServeArgs {
            node_timeout: Some(bad.into()),
            ..ServeArgs::default()
        };
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains("--node-timeout"), "{bad}: {error}");
    }
}

#[test]
fn federation_settings_come_together_or_not_at_all() {
    assert_eq!(ServeArgs::default().resolve().unwrap().federation, None);
    let key = crate::federation::ClusterKey::generate().unwrap();
    let args = ServeArgs {
        site: Some("plant-a".into()),
        cluster_key: Some(key.clone()),
        seeds: vec!["10.0.0.1:7946".into(), "10.0.0.2:7946".into()],
        forward_timeout: Some("3s".into()),
        ..ServeArgs::default()
    };
    let federation = args.resolve().unwrap().federation.unwrap();
    assert_eq!(federation.seeds.len(), 2);
    assert_eq!(federation.forward_timeout, Duration::from_secs(3));
    assert_eq!(federation.link_mbps, DEFAULT_SITE_LINK_MBPS);
    for (args, says) in [
        (
            ServeArgs {
                site: Some("plant-a".into()),
                ..ServeArgs::default()
            },
            "--cluster-key",
        ),
        (
            ServeArgs {
                seeds: vec!["10.0.0.1:7946".into()],
                ..ServeArgs::default()
            },
            "--site",
        ),
        (
            ServeArgs {
                site: Some("plant a".into()),
                cluster_key: Some(key.clone()),
                ..ServeArgs::default()
            },
            "--site",
        ),
        (
            ServeArgs {
                site: Some("plant-a".into()),
                cluster_key: Some(key.clone()),
                seeds: vec!["nowhere".into()],
                ..ServeArgs::default()
            },
            "--seed",
        ),
    ] {
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains(says), "{error}");
    }
}

#[test]
fn bad_file_and_bad_address_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "no-such-setting = 1\n").unwrap();
    let args = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    };
    assert!(matches!(args.resolve(), Err(ConfigError::Parse { .. })));
    let args = ServeArgs {
        listen: Some("localhost".into()),
        ..ServeArgs::default()
    };
    let error = args.resolve().unwrap_err().to_string();
    assert!(error.contains("--listen"), "{error}");
}

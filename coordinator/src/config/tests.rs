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
        site_credentials: Some("plant-a.json".into()),
        seeds: vec!["10.0.0.1:7946".into(), "10.0.0.2:7946".into()],
        forward_timeout: Some("3s".into()),
        ..ServeArgs::default()
    };
    let federation = args.resolve().unwrap().federation.unwrap();
    assert_eq!(federation.site_credentials, Path::new("plant-a.json"));
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
                site_credentials: Some("plant-a.json".into()),
                seeds: vec!["nowhere".into()],
                ..ServeArgs::default()
            },
            "--seed",
        ),
        // No credentials: refused, saying how to issue them.
        (
            ServeArgs {
                site: Some("plant-a".into()),
                cluster_key: Some(key.clone()),
                ..ServeArgs::default()
            },
            "federation issue --site plant-a",
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

#[test]
fn an_open_api_beyond_loopback_is_refused_unless_asked_for() {
    for listen in ["0.0.0.0:7878", "10.0.0.5:7878", "[::]:7878"] {
        let args = ServeArgs {
            listen: Some(listen.into()),
            ..ServeArgs::default()
        };
        let error = args.resolve().unwrap_err();
        assert!(
            matches!(error, ConfigError::OpenToTheNetwork { .. }),
            "{listen}: {error}"
        );
        let message = error.to_string();
        for says in ["--api-token", "--insecure-no-auth", "127.0.0.1"] {
            assert!(message.contains(says), "{message}");
        }
        // An empty token is no token.
        let args = ServeArgs {
            listen: Some(listen.into()),
            api_token: Some(String::new()),
            ..ServeArgs::default()
        };
        assert!(args.resolve().is_err(), "{listen}");
    }

    // With a token, or told to run open (flag or file), it starts.
    let with_token = ServeArgs {
        listen: Some("0.0.0.0:7878".into()),
        api_token: Some("secret".into()),
        ..ServeArgs::default()
    };
    assert_eq!(
        with_token.resolve().unwrap().api_token.as_deref(),
        Some("secret")
    );
    let with_flag = ServeArgs {
        listen: Some("10.0.0.5:7878".into()),
        insecure_no_auth: true,
        ..ServeArgs::default()
    };
    assert_eq!(with_flag.resolve().unwrap().api_token, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coordinator.toml");
    std::fs::write(
        &path,
        "listen = \"0.0.0.0:7878\"\ninsecure-no-auth = true\n",
    )
    .unwrap();
    let from_file = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    };
    assert!(from_file.resolve().is_ok());

    // Loopback, v4, v6 or v4-mapped, needs neither.
    for listen in [
        "127.0.0.1:0",
        "127.0.0.2:7878",
        "[::1]:7878",
        "[::ffff:127.0.0.1]:7878",
    ] {
        let args = ServeArgs {
            listen: Some(listen.into()),
            ..ServeArgs::default()
        };
        assert!(args.resolve().is_ok(), "{listen}");
    }
    assert!(ServeArgs::default().resolve().is_ok());
}

#[test]
fn the_cluster_key_comes_from_a_file() {
    let key = crate::federation::ClusterKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("cluster.key");
    // As `starling-coordinator cluster-key > FILE` writes it: with a newline.
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let args = ServeArgs {
        site: Some("plant-a".into()),
        cluster_key_file: Some(key_file.clone()),
        site_credentials: Some("plant-a.json".into()),
        ..ServeArgs::default()
    };
    assert_eq!(args.resolve().unwrap().federation.unwrap().cluster_key, key);

    let config = dir.path().join("coordinator.toml");
    std::fs::write(
        &config,
        format!(
            "site = \"plant-a\"\nsite-credentials = \"plant-a.json\"\ncluster-key-file = {:?}\n",
            key_file.display().to_string()
        ),
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(config.clone()),
        ..ServeArgs::default()
    };
    assert_eq!(args.resolve().unwrap().federation.unwrap().cluster_key, key);

    // Both in one file is ambiguous; a missing file names itself.
    std::fs::write(
        &config,
        format!(
            "site = \"plant-a\"\ncluster-key = \"{key}\"\ncluster-key-file = {:?}\n",
            key_file.display().to_string()
        ),
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(config),
        ..ServeArgs::default()
    };
    let error = args.resolve().unwrap_err().to_string();
    assert!(error.contains("cluster-key-file"), "{error}");
    let args = ServeArgs {
        site: Some("plant-a".into()),
        cluster_key_file: Some(dir.path().join("missing.key")),
        ..ServeArgs::default()
    };
    let error = args.resolve().unwrap_err();
    assert!(
        matches!(error, ConfigError::ClusterKeyFile { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("missing.key"), "{error}");
}

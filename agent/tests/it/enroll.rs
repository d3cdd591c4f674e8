//! Enrollment, MQTT credentials and MQTT over TLS, against a real Mosquitto:
//! - a join token is traded once for credentials kept in `credentials.json`
//!   (mode 0600), which later starts reuse without asking again;
//! - a refused token, a missing coordinator URL and credentials of another
//!   node are clear errors;
//! - the agent connects with its credentials to a broker that refuses
//!   anonymous clients, and a wrong password is refused;
//! - `mqtts://` with a CA file connects, a client without that CA fails the
//!   handshake, and a broker requiring client certificates admits only a
//!   client that presents one.
//!
//! The enrollment endpoint here is a small HTTP responder in the test: it
//! records what the agent sent and answers what the test needs (the real
//! endpoint is exercised by the cross-process tests in `tests/`).

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use starling_agent::enroll::{self, Credentials, EnrollError, CREDENTIALS_FILE};
use starling_agent::{AgentConfig, AgentError};
use starling_net::{BrokerAddress, MqttTlsFiles};
use starling_proto::{NodeState, Status};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const KEY_HEX: &str = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";

fn credentials(node: &str, password: &str) -> Credentials {
    Credentials {
        node_id: node.to_owned(),
        mqtt_username: node.to_owned(),
        mqtt_password: password.to_owned(),
        coordinator_key: KEY_HEX.to_owned(),
        topic_prefix: "starling/v1".to_owned(),
    }
}

// ---------------------------------------------------------------- enrollment

/// What the enrollment responder saw: the request line and the body.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Answers every request with `status` and `body`, recording each request.
async fn responder(status: u16, body: String) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Read the head, then as many body bytes as Content-Length says.
            let (head, body_start) = loop {
                let n = stream.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the client closed before a full request");
                request.extend_from_slice(&buffer[..n]);
                if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (String::from_utf8_lossy(&request[..at]).into_owned(), at + 4);
                }
            };
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            while request.len() < body_start + length {
                let n = stream.read(&mut buffer).await.unwrap();
                assert!(n > 0);
                request.extend_from_slice(&buffer[..n]);
            }
            let line = head.lines().next().unwrap_or_default().to_owned();
            let request_body =
                String::from_utf8_lossy(&request[body_start..body_start + length]).into_owned();
            record.lock().unwrap().push((line, request_body));
            let reason = if status == 200 { "OK" } else { "Error" };
            let response = format!(
                "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(response.as_bytes()).await.unwrap();
            let _ = stream.shutdown().await;
        }
    });
    (url, seen)
}

fn agent_config(dir: &Path, node: &str) -> AgentConfig {
    AgentConfig {
        node_id: Some(node.to_owned()),
        data_dir: dir.to_path_buf(),
        opencl: false,
        ..AgentConfig::default()
    }
}

#[tokio::test]
async fn a_join_token_is_traded_once_for_private_credentials() {
    let dir = TempDir::new().unwrap();
    let answer = serde_json::to_string(&credentials("edge-1", "s3cret")).unwrap();
    let (url, seen) = responder(200, answer).await;

    let mut config = agent_config(dir.path(), "edge-1");
    config.coordinator_url = Some(format!("{url}/"));
    config.join_token = Some("join-abc".to_owned());
    let enrolled = enroll::prepare(&mut config).await.unwrap().unwrap();
    assert_eq!(enrolled, credentials("edge-1", "s3cret"));

    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].0.starts_with("POST /api/v1/enroll "),
        "{:?}",
        requests[0]
    );
    let body: serde_json::Value = serde_json::from_str(&requests[0].1).unwrap();
    // The node's report key was made here, and only its public half sent.
    let report_key = starling_agent::report_key::load(dir.path())
        .unwrap()
        .expect("enrollment made a report key");
    let public = starling_agent::report_key::public_hex(&report_key);
    assert_eq!(
        body,
        serde_json::json!({"join_token": "join-abc", "node_id": "edge-1", "report_key": public})
    );
    assert!(!requests[0].1.contains(&hex::encode(report_key.to_bytes())));
    {
        use std::os::unix::fs::PermissionsExt;
        let key_file = starling_agent::report_key::key_path(dir.path());
        let mode = std::fs::metadata(key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the report key must be owner-only");
    }

    assert_eq!(config.mqtt_username.as_deref(), Some("edge-1"));
    assert_eq!(config.mqtt_password.as_deref(), Some("s3cret"));
    let key: [u8; 32] = hex::decode(KEY_HEX).unwrap().try_into().unwrap();
    assert_eq!(config.coordinator_key, Some(key));

    let path = dir.path().join(CREDENTIALS_FILE);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "credentials must be owner-only");
    }
    assert_eq!(enroll::load(&path).unwrap(), enrolled);

    // A restart (the harness passes the used token again) reads the file and
    // asks the coordinator nothing.
    let mut again = agent_config(dir.path(), "edge-1");
    again.coordinator_url = Some(url);
    again.join_token = Some("join-abc".to_owned());
    let reloaded = enroll::prepare(&mut again).await.unwrap().unwrap();
    assert_eq!(reloaded, enrolled);
    assert_eq!(seen.lock().unwrap().len(), 1, "no second enrollment");
    assert_eq!(again.mqtt_password.as_deref(), Some("s3cret"));

    // Without a node id the enrolled one is used.
    let mut unnamed = agent_config(dir.path(), "x");
    unnamed.node_id = None;
    enroll::prepare(&mut unnamed).await.unwrap();
    assert_eq!(unnamed.node_id.as_deref(), Some("edge-1"));
}

#[tokio::test]
async fn an_answer_with_another_coordinator_key_is_refused_and_nothing_is_kept() {
    // Whoever answers here plays a man in the middle: its credentials carry
    // its own key, not the one printed with the join token.
    let dir = TempDir::new().unwrap();
    let answer = serde_json::to_string(&credentials("edge-1", "stolen")).unwrap();
    let (url, _seen) = responder(200, answer).await;
    let expected = [0x42; 32];
    let mut config = agent_config(dir.path(), "edge-1");
    config.coordinator_url = Some(url.clone());
    config.join_token = Some("join-abc".to_owned());
    config.coordinator_key = Some(expected);
    let error = enroll::prepare(&mut config).await.unwrap_err();
    match &error {
        EnrollError::KeyMismatch { expected, received } => {
            assert_eq!(expected, &"42".repeat(32));
            assert_eq!(received, KEY_HEX);
        }
        other => panic!("expected a key mismatch, got {other}"),
    }
    assert!(error.to_string().contains("nothing was saved"), "{error}");
    assert!(!dir.path().join(CREDENTIALS_FILE).exists());
    assert_eq!(config.mqtt_password, None);

    // With the right key the same answer is taken.
    let mut config = agent_config(dir.path(), "edge-1");
    config.coordinator_url = Some(url);
    config.join_token = Some("join-abc".to_owned());
    config.coordinator_key = Some(hex::decode(KEY_HEX).unwrap().try_into().unwrap());
    enroll::prepare(&mut config).await.unwrap().unwrap();
    assert!(dir.path().join(CREDENTIALS_FILE).exists());
}

#[tokio::test]
async fn refusals_and_misconfigurations_are_clear_errors() {
    let dir = TempDir::new().unwrap();
    let (url, _) = responder(
        401,
        r#"{"error":"unauthorized","message":"unknown join token"}"#.to_owned(),
    )
    .await;
    let mut config = agent_config(dir.path(), "edge-2");
    config.coordinator_url = Some(url);
    config.join_token = Some("stale".to_owned());
    let error = enroll::prepare(&mut config).await.unwrap_err();
    assert!(matches!(error, EnrollError::InvalidToken), "{error}");
    assert!(
        error.to_string().contains("starling token create"),
        "{error}"
    );
    assert!(!dir.path().join(CREDENTIALS_FILE).exists());

    let (url, _) = responder(
        409,
        r#"{"error":"conflict","message":"node edge-2 was revoked"}"#.to_owned(),
    )
    .await;
    config.coordinator_url = Some(url);
    let error = enroll::prepare(&mut config).await.unwrap_err();
    assert!(error.to_string().contains("was revoked"), "{error}");

    // An answer for another node than asked is not taken.
    let (url, _) = responder(
        200,
        serde_json::to_string(&credentials("someone-else", "p")).unwrap(),
    )
    .await;
    config.coordinator_url = Some(url);
    let error = enroll::prepare(&mut config).await.unwrap_err();
    assert!(matches!(error, EnrollError::BadAnswer { .. }), "{error}");
    assert!(!dir.path().join(CREDENTIALS_FILE).exists());

    config.coordinator_url = None;
    let error = enroll::prepare(&mut config).await.unwrap_err();
    assert!(matches!(error, EnrollError::NoCoordinatorUrl), "{error}");

    // Nobody listening.
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    config.coordinator_url = Some(format!("http://127.0.0.1:{port}"));
    let error = enroll::prepare(&mut config).await.unwrap_err();
    assert!(matches!(error, EnrollError::Unreachable { .. }), "{error}");

    // Credentials of another node in the data dir.
    enroll::save(
        &dir.path().join(CREDENTIALS_FILE),
        &credentials("edge-1", "p"),
    )
    .unwrap();
    let error = enroll::prepare(&mut agent_config(dir.path(), "edge-2"))
        .await
        .unwrap_err();
    assert!(matches!(error, EnrollError::NodeMismatch { .. }), "{error}");
    assert!(error.to_string().contains("--node-id edge-1"), "{error}");

    // Neither credentials nor a token: nothing to do, nothing changed.
    let empty = TempDir::new().unwrap();
    let mut open = agent_config(empty.path(), "edge-3");
    assert!(enroll::prepare(&mut open).await.unwrap().is_none());
    assert_eq!(open.mqtt_username, None);
}

// ---------------------------------------------------------------- Mosquitto

/// A Mosquitto with a config of the test's choosing, killed on drop.
struct Broker {
    child: Child,
    dir: TempDir,
}

impl Broker {
    fn start(dir: TempDir, config: &str, ports: &[u16]) -> Self {
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(&conf, config).unwrap();
        let log = std::fs::File::create(dir.path().join("mosquitto.log")).unwrap();
        let binary = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("mosquitto is installed (scripts/setup installs it)");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        for port in ports {
            starling_tests::wait_for_port(([127, 0, 0, 1], *port).into(), Duration::from_secs(10));
        }
        Self { child, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- mosquitto log -----\n{}", self.log());
        }
    }
}

/// Polls a client until its CONNACK (Ok) or its first error (Err, as text).
async fn connect(options: MqttOptions) -> Result<AsyncClient, String> {
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(error) => return Err(format!("{error:?}")),
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err("no answer in 10 s".to_owned()));
    outcome?;
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    Ok(client)
}

/// Waits for the node's retained status to say online, as an observer sees it.
async fn wait_online(mut options: MqttOptions, node: &str) -> Status {
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    client
        .subscribe(format!("starling/v1/nodes/{node}/status"), QoS::AtLeastOnce)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let status: Status = starling_proto::decode(&publish.payload).unwrap();
                    if status.state == NodeState::Online {
                        return status;
                    }
                }
                Ok(_) => {}
                Err(error) => panic!("observer connection failed: {error:?}"),
            }
        }
    })
    .await
    .expect("the agent's online status within 30 s")
}

fn free_port() -> u16 {
    starling_tests::free_port()
}

fn password_file(dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("passwd");
    for (index, (user, password)) in users.iter().enumerate() {
        let mut command = Command::new("mosquitto_passwd");
        command.arg("-b");
        if index == 0 {
            command.arg("-c");
        }
        let status = command
            .arg(&path)
            .arg(user)
            .arg(password)
            .status()
            .expect("mosquitto_passwd is installed with mosquitto");
        assert!(status.success());
    }
    path
}

#[tokio::test]
async fn the_agent_connects_with_its_credentials_and_a_wrong_password_is_refused() {
    let broker_dir = TempDir::new().unwrap();
    let passwd = password_file(
        broker_dir.path(),
        &[("edge-1", "right-password"), ("observer", "observer-pw")],
    );
    let port = free_port();
    let _broker = Broker::start(
        broker_dir,
        &format!(
            "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\npersistence false\n",
            passwd.display()
        ),
        &[port],
    );
    let broker = format!("mqtt://127.0.0.1:{port}");

    // Anonymous clients are turned away: the broker really checks.
    let anonymous = connect(MqttOptions::new("anon", "127.0.0.1", port)).await;
    assert!(anonymous.is_err(), "an anonymous client got in");

    let data = TempDir::new().unwrap();
    enroll::save(
        &data.path().join(CREDENTIALS_FILE),
        &credentials("edge-1", "right-password"),
    )
    .unwrap();
    let mut config = agent_config(data.path(), "edge-1");
    config.broker = broker.clone();
    config.allow_unsigned = true;
    enroll::prepare(&mut config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async move {
        let _ = stopped.await;
    }));
    let mut observer = MqttOptions::new("observer", "127.0.0.1", port);
    observer.set_credentials("observer", "observer-pw");
    let status = wait_online(observer, "edge-1").await;
    assert_eq!(status.node_id.as_str(), "edge-1");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The same node with a wrong password does not start.
    let wrong = TempDir::new().unwrap();
    enroll::save(
        &wrong.path().join(CREDENTIALS_FILE),
        &credentials("edge-1", "wrong-password"),
    )
    .unwrap();
    let mut config = agent_config(wrong.path(), "edge-1");
    config.broker = broker;
    config.allow_unsigned = true;
    enroll::prepare(&mut config).await.unwrap();
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        starling_agent::run(config, std::future::pending()),
    )
    .await
    .expect("a refused agent stops at start")
    .unwrap_err();
    assert!(matches!(error, AgentError::BrokerRefused { .. }), "{error}");
    assert!(error.to_string().contains("refused"), "{error}");
}

// ---------------------------------------------------------------- TLS

fn tls_options(id: &str, port: u16, files: &MqttTlsFiles) -> Result<MqttOptions, String> {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    let transport = starling_net::tls::transport(files).map_err(|e| e.to_string())?;
    options.set_transport(transport);
    Ok(options)
}

#[tokio::test]
async fn mqtts_needs_the_right_ca_and_client_certificates_where_required() {
    let broker_dir = TempDir::new().unwrap();
    let pki = starling_tests::Pki::create(broker_dir.path());
    let (open_port, mutual_port) = (free_port(), free_port());
    let files = pki.mosquitto_listener_files();
    let _broker = Broker::start(
        broker_dir,
        &format!(
            "allow_anonymous true\npersistence false\n\
             listener {open_port} 127.0.0.1\n{files}\
             listener {mutual_port} 127.0.0.1\n{files}require_certificate true\n"
        ),
        &[open_port, mutual_port],
    );
    let with_ca = MqttTlsFiles {
        ca_file: Some(pki.ca.clone()),
        ..MqttTlsFiles::default()
    };
    let with_client_cert = MqttTlsFiles {
        ca_file: Some(pki.ca.clone()),
        client_cert: Some(pki.client_cert.clone()),
        client_key: Some(pki.client_key.clone()),
    };

    connect(tls_options("with-ca", open_port, &with_ca).unwrap())
        .await
        .expect("a client trusting the CA connects");

    // Without the CA: the system roots do not know the test CA, so the
    // handshake fails (or, on a machine without any roots, the client
    // refuses to start). Either way, no connection.
    match tls_options("without-ca", open_port, &MqttTlsFiles::default()) {
        Ok(options) => {
            let error = connect(options)
                .await
                .expect_err("no connection without the CA");
            assert!(
                error.contains("Tls") || error.contains("certificate"),
                "{error}"
            );
        }
        Err(error) => assert!(error.contains("--mqtt-ca-file"), "{error}"),
    }

    // Plain MQTT to a TLS listener gets nowhere either.
    assert!(connect(MqttOptions::new("plain", "127.0.0.1", open_port))
        .await
        .is_err());

    let error = connect(tls_options("no-client-cert", mutual_port, &with_ca).unwrap())
        .await
        .expect_err("a broker requiring certificates refuses a client without one");
    assert!(!error.is_empty());
    connect(tls_options("client-cert", mutual_port, &with_client_cert).unwrap())
        .await
        .expect("a client with a certificate from the CA connects");

    // The agent itself over mqtts://, with the CA file from its config.
    let data = TempDir::new().unwrap();
    let mut config = agent_config(data.path(), "tls-node");
    config.broker = format!("mqtts://127.0.0.1:{open_port}");
    config.mqtt_tls = with_ca.clone();
    config.allow_unsigned = true;
    assert!(BrokerAddress::parse(&config.broker).unwrap().tls);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(starling_agent::run(config, async move {
        let _ = stopped.await;
    }));
    let status = wait_online(
        tls_options("observer", open_port, &with_ca).unwrap(),
        "tls-node",
    )
    .await;
    assert_eq!(status.node_id.as_str(), "tls-node");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

//! The MQTT broker side: the embedded rumqttd broker the coordinator starts by
//! default.
//!
//! The embedded broker authenticates every connection against
//! [`MqttAccess`]: the coordinator's own login and the enrolled, non-revoked
//! nodes. rumqttd 0.20 has no per-topic authorization, so confining each node
//! to its own topics needs Mosquitto with the ACL the coordinator writes
//! (`--mosquitto-auth-dir`); on the embedded broker, ingest still checks that
//! the node in a message's topic and body agree and ignores revoked nodes.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings, TlsConfig};

use crate::access::MqttAccess;
use crate::server_tls::{ServerTls, ServerTlsError};

/// Headroom over [`starling_proto::limits::MAX_MESSAGE_BYTES`] for the MQTT
/// packet's own header and topic name.
pub const PACKET_HEADROOM_BYTES: usize = 64 * 1024;

/// The largest MQTT packet the broker and the coordinator's client accept.
pub const MAX_PACKET_BYTES: usize =
    starling_proto::limits::MAX_MESSAGE_BYTES + PACKET_HEADROOM_BYTES;

/// How long the embedded broker may take to accept its first connection.
const BROKER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the embedded broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartBrokerError {
    /// The MQTT listen address is taken or not ours to bind.
    #[error("cannot listen for MQTT on {addr}: {reason}; pass --mqtt-listen with a free port (port 0 picks one)")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS's words.
        reason: String,
    },
    /// The embedded broker's certificate or key cannot be used.
    #[error("{0}; pass PEM files to --mqtt-tls-cert and --mqtt-tls-key")]
    Tls(#[from] ServerTlsError),
    /// The broker's thread could not be started.
    #[error("cannot start the embedded MQTT broker: {0}")]
    Thread(#[source] std::io::Error),
    /// The broker did not accept connections in time.
    #[error("the embedded MQTT broker on {addr} did not accept connections within {timeout:?}; pass --mqtt-listen with another port")]
    NotReady {
        /// The address it should listen on.
        addr: SocketAddr,
        /// How long we waited.
        timeout: Duration,
    },
}

/// Where a started embedded broker listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedBroker {
    /// The address agents use (TLS when [`EmbeddedBroker::tls`]).
    pub listen: SocketAddr,
    /// Whether `listen` speaks TLS.
    pub tls: bool,
    /// A plain listener on the loopback interface for the coordinator's own
    /// client, so it needs neither a CA nor a certificate naming this host;
    /// logins are checked there too. The same as `listen` without TLS.
    pub local: SocketAddr,
}

/// Starts rumqttd on `listen` in its own threads and returns where it
/// listens once it accepts TCP connections. Each connection must log in with
/// credentials `access` accepts; one without any is refused. With `tls`,
/// `listen` speaks only TLS and a second, plain listener on 127.0.0.1 serves
/// the coordinator itself.
///
/// rumqttd binds its listeners itself and offers no way to stop them, so the
/// broker lives until the process exits.
pub fn start_embedded_broker(
    listen: SocketAddr,
    tls: Option<&ServerTls>,
    access: Arc<MqttAccess>,
) -> Result<EmbeddedBroker, StartBrokerError> {
    let addr = reserve(listen)?;
    let local = match tls {
        Some(_) => reserve(SocketAddr::from(([127, 0, 0, 1], 0)))?,
        None => addr,
    };
    let tls_config = tls.map(check_tls_files).transpose()?;
    let mut servers = HashMap::from([(
        "1".to_string(),
        server_settings("starling-v4", addr, tls_config, &access),
    )]);
    if tls.is_some() {
        servers.insert(
            "2".to_string(),
            server_settings("starling-v4-local", local, None, &access),
        );
    }
    if access.allows_anonymous() {
        tracing::debug!("embedded broker: anonymous clients allowed");
    }
    let config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: 10_000,
            max_outgoing_packet_count: 200,
            // A segment must hold at least one message of the largest size.
            max_segment_size: 4 * MAX_PACKET_BYTES,
            max_segment_count: 10,
            ..RouterConfig::default()
        },
        v4: Some(servers),
        ..Config::default()
    };
    let mut broker = Broker::new(config);
    std::thread::Builder::new()
        .name("mqtt-broker".to_string())
        .spawn(move || {
            if let Err(error) = broker.start() {
                tracing::error!(%error, "embedded MQTT broker stopped");
            }
        })
        .map_err(StartBrokerError::Thread)?;

    let deadline = Instant::now() + BROKER_START_TIMEOUT;
    for bound in [addr, local] {
        let connect_to = if bound.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], bound.port()))
        } else {
            bound
        };
        loop {
            if TcpStream::connect_timeout(&connect_to, Duration::from_millis(200)).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(StartBrokerError::NotReady {
                    addr: bound,
                    timeout: BROKER_START_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(EmbeddedBroker {
        listen: addr,
        tls: tls.is_some(),
        local,
    })
}

/// Binds `listen` and lets it go, returning the address bound.
///
/// rumqttd cannot report the port it bound, and it logs a bind failure from
/// its own thread instead of returning it. So we bind here first: that
/// reports "address in use" to the caller and, for port 0, picks a free
/// port. We then release the port and hand it to rumqttd. Between the
/// release and rumqttd's bind another process could take the port; the
/// readiness check then times out with a clear error.
fn reserve(listen: SocketAddr) -> Result<SocketAddr, StartBrokerError> {
    let probe = TcpListener::bind(listen).map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: crate::describe_bind_error(&error),
    })?;
    probe.local_addr().map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: error.to_string(),
    })
}

/// rumqttd reads the files in its own thread and only logs what it thinks of
/// them; reading them here first turns a typo into an error at start.
fn check_tls_files(tls: &ServerTls) -> Result<TlsConfig, StartBrokerError> {
    tls.rustls_config()?;
    let text = |path: &std::path::Path| {
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| ServerTlsError {
                path: path.to_path_buf(),
                detail: "the path is not UTF-8".to_string(),
            })
    };
    Ok(TlsConfig::Rustls {
        capath: None,
        certpath: text(&tls.cert)?,
        keypath: text(&tls.key)?,
    })
}

/// One listener's settings, with the login check unless anonymous clients
/// are allowed (rumqttd refuses a connect without a login as soon as a
/// handler is set, so anonymous clients are let in only without one).
fn server_settings(
    name: &str,
    listen: SocketAddr,
    tls: Option<TlsConfig>,
    access: &Arc<MqttAccess>,
) -> ServerSettings {
    let mut server = ServerSettings {
        name: name.to_string(),
        listen,
        tls,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 60_000,
            max_payload_size: MAX_PACKET_BYTES,
            max_inflight_count: 100,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    if !access.allows_anonymous() {
        let access = access.clone();
        server.set_auth_handler(move |_client_id, username, password| {
            let allowed = access.check(&username, &password);
            if !allowed {
                tracing::warn!(%username, "embedded broker refused a login");
            }
            async move { allowed }
        });
    }
    server
}

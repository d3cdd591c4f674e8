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

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

use crate::access::MqttAccess;

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

/// Where an MQTT broker listens: the agent's parser, so both ends accept the
/// same `mqtt://` and `mqtts://` URLs.
pub use starling_agent::config::BrokerAddress;

/// Starts rumqttd on `listen` in its own threads and returns the address it
/// listens on once it accepts TCP connections. Each connection must log in
/// with credentials `access` accepts; one without any is refused.
///
/// rumqttd binds its listener itself and offers no way to stop it, so the
/// broker lives until the process exits.
pub fn start_embedded_broker(
    listen: SocketAddr,
    access: Arc<MqttAccess>,
) -> Result<SocketAddr, StartBrokerError> {
    // rumqttd cannot report the port it bound, and it logs a bind failure from
    // its own thread instead of returning it. So we bind here first: that
    // reports "address in use" to the caller and, for port 0, picks a free
    // port. We then release the port and hand it to rumqttd. Between the
    // release and rumqttd's bind another process could take the port; the
    // readiness check below then times out with a clear error.
    let probe = TcpListener::bind(listen).map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: crate::describe_bind_error(&error),
    })?;
    let addr = probe.local_addr().map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: error.to_string(),
    })?;
    drop(probe);

    let mut server = ServerSettings {
        name: "starling-v4".to_string(),
        listen: addr,
        tls: None,
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
    // rumqttd refuses a connect without a login as soon as a handler is set,
    // so anonymous clients are let in only by a handler that says so.
    if access.allows_anonymous() {
        tracing::debug!("embedded broker: anonymous clients allowed");
    } else {
        server.set_auth_handler(move |_client_id, username, password| {
            let allowed = access.check(&username, &password);
            if !allowed {
                tracing::warn!(%username, "embedded broker refused a login");
            }
            async move { allowed }
        });
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
        v4: Some(HashMap::from([("1".to_string(), server)])),
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
    let connect_to = if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    };
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&connect_to, Duration::from_millis(200)).is_ok() {
            return Ok(addr);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(StartBrokerError::NotReady {
        addr,
        timeout: BROKER_START_TIMEOUT,
    })
}

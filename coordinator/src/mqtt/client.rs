//! The coordinator's own MQTT client: connecting to the broker (embedded or
//! external) and waiting for its ConnAck. `ingest` then polls its event
//! loop; `publish` sends through it.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet};
use starling_net::BrokerAddress;

use super::broker::MAX_PACKET_BYTES;

/// The coordinator's MQTT client, as the rest of the coordinator holds it
/// (only this module names the MQTT crate).
pub(crate) type MqttClient = AsyncClient;

/// Why the coordinator's client could not connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TLS settings for an `mqtts://` broker are unusable.
    #[error(transparent)]
    Tls(#[from] starling_net::TlsError),
    /// The broker did not accept the connection.
    #[error("cannot reach the MQTT broker at {url}: {reason}; start it or pass --broker with the right address")]
    Unreachable {
        /// The broker's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// Requests (publishes, subscriptions) queued for the MQTT loop. A
/// scheduling round queues its assignments at once and ingest queues an
/// acknowledgement per event without waiting (it drops one when this is
/// full, and the agent sends its event again): room for several rounds and
/// their events' acknowledgements, so a burst drops none.
const REQUEST_QUEUE: usize = 8_192;

/// QoS 1 publishes sent and not yet acknowledged by the broker: the loop
/// stops taking requests past it. Assignments and acknowledgements go out
/// in bursts of hundreds; rumqttc's default (100) throttled them.
const MAX_INFLIGHT: u16 = 1_000;

/// The largest packet the coordinator's client reads: far above what any
/// node may publish ([`MAX_PACKET_BYTES`], the embedded broker's limit). On
/// an external broker without that limit, a larger message (a node's 2 MB
/// retained capability, in issue 33) is then read and refused, and a
/// retained one cleared (`session`), where a read limit equal to what is
/// allowed made it a connection error, at every reconnect, for ever. Only
/// a message past this still does that, and the log says which limit the
/// broker lacks.
pub(crate) const MAX_INCOMING_PACKET_BYTES: usize = 16 * 1024 * 1024;

/// How long the coordinator waits for the broker to accept its connection.
const BROKER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects the coordinator's MQTT client and waits for the broker's ConnAck.
pub(crate) async fn connect(
    address: &BrokerAddress,
    tls: &starling_net::MqttTlsFiles,
    login: Option<(&str, &str)>,
) -> Result<(MqttClient, EventLoop), ConnectError> {
    let client_id = format!("starling-coordinator-{}", uuid::Uuid::now_v7().simple());
    let mut options = MqttOptions::new(client_id, address.host.clone(), address.port);
    options
        .set_keep_alive(Duration::from_secs(10))
        .set_clean_session(true)
        .set_max_packet_size(MAX_INCOMING_PACKET_BYTES, MAX_PACKET_BYTES)
        .set_inflight(MAX_INFLIGHT);
    if address.tls {
        options.set_transport(starling_net::tls::transport(tls)?);
    }
    if let Some((username, password)) = login {
        options.set_credentials(username, password);
    }
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
    starling_net::mqtt::no_delay(&mut eventloop);
    let unreachable = |reason: String| ConnectError::Unreachable {
        url: address.url(),
        reason,
    };
    let wait_for_connack = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                Ok(_) => continue,
                Err(error) => return Err(unreachable(error.to_string())),
            }
        }
    };
    match tokio::time::timeout(BROKER_CONNECT_TIMEOUT, wait_for_connack).await {
        Ok(Ok(())) => Ok((client, eventloop)),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(unreachable(format!(
            "no answer within {BROKER_CONNECT_TIMEOUT:?}"
        ))),
    }
}

//! The coordinator's own MQTT client: connecting to the broker (embedded or
//! external) and waiting for its ConnAck. `ingest` then polls its event
//! loop; `publish` sends through it.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS, SubscribeReasonCode};
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

/// How long the packet-limit probe waits for the broker to settle it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What an external broker does with a packet past [`MAX_PACKET_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketLimit {
    /// It closed the sender's connection: the limit is set.
    Enforced,
    /// It took the packet and delivered it: any client it lets publish can
    /// send every subscriber, the coordinator included, messages of any size.
    Missing,
    /// The probe could not tell, and why.
    Unknown(String),
}

/// Options for a client of the coordinator's (its own, or the probe).
fn options(
    client_id: String,
    address: &BrokerAddress,
    incoming: usize,
    outgoing: usize,
) -> MqttOptions {
    let mut options = MqttOptions::new(client_id, address.host.clone(), address.port);
    options
        .set_keep_alive(Duration::from_secs(10))
        .set_clean_session(true)
        .set_max_packet_size(incoming, outgoing);
    options
}

/// Finds out whether an external broker enforces the packet limit the
/// coordinator's own broker has (issue 33: without it one node's 2 MB
/// retained message stopped a site). MQTT 3.1.1 has no way to ask, so a
/// client of its own subscribes to a topic of its own and publishes one
/// message just past the limit there: a broker with the limit disconnects
/// it, one without delivers the message back. Costs one message of about
/// 1 MiB on the broker, once at start.
pub(crate) async fn probe_packet_limit(
    address: &BrokerAddress,
    tls: &starling_net::MqttTlsFiles,
    login: Option<(&str, &str)>,
) -> PacketLimit {
    let client_id = format!(
        "starling-coordinator-probe-{}",
        uuid::Uuid::now_v7().simple()
    );
    let topic = format!("starling/probe/{client_id}");
    let mut options = options(
        client_id,
        address,
        MAX_INCOMING_PACKET_BYTES,
        MAX_INCOMING_PACKET_BYTES,
    );
    if address.tls {
        match starling_net::tls::transport(tls) {
            Ok(transport) => {
                options.set_transport(transport);
            }
            Err(error) => return PacketLimit::Unknown(error.to_string()),
        }
    }
    if let Some((username, password)) = login {
        options.set_credentials(username, password);
    }
    let (client, mut eventloop) = AsyncClient::new(options, 4);
    let probe = async {
        let mut subscribed = false;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if let Err(error) = client.subscribe(topic.as_str(), QoS::AtMostOnce).await {
                        return PacketLimit::Unknown(error.to_string());
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) if !subscribed => {
                    if ack.return_codes.contains(&SubscribeReasonCode::Failure) {
                        return PacketLimit::Unknown(format!(
                            "the broker refused a subscription to {topic}"
                        ));
                    }
                    subscribed = true;
                    let oversized = vec![0u8; MAX_PACKET_BYTES];
                    if let Err(error) = client
                        .publish(topic.as_str(), QoS::AtMostOnce, false, oversized)
                        .await
                    {
                        return PacketLimit::Unknown(error.to_string());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) if publish.topic == topic => {
                    return PacketLimit::Missing;
                }
                Ok(_) => {}
                // Before the subscription, a failure says nothing about
                // the limit; after it, the broker closed the connection on
                // the oversized packet.
                Err(error) if !subscribed => return PacketLimit::Unknown(error.to_string()),
                Err(_) => return PacketLimit::Enforced,
            }
        }
    };
    let found = tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .unwrap_or_else(|_| PacketLimit::Unknown(format!("no answer within {PROBE_TIMEOUT:?}")));
    // The broker may already have closed it; nothing to do if so.
    let _ = client.try_disconnect();
    found
}

/// Runs [`probe_packet_limit`] and says what it found in the log: a warning
/// naming the setting when the limit is missing.
pub(crate) async fn check_packet_limit(
    address: BrokerAddress,
    tls: starling_net::MqttTlsFiles,
    login: Option<(String, String)>,
) -> PacketLimit {
    let login = login
        .as_ref()
        .map(|(user, password)| (user.as_str(), password.as_str()));
    let found = probe_packet_limit(&address, &tls, login).await;
    let url = address.url();
    match &found {
        PacketLimit::Enforced => {
            tracing::info!(%url, limit = MAX_PACKET_BYTES, "the broker enforces the packet limit");
        }
        PacketLimit::Missing => tracing::warn!(
            %url,
            "the broker takes packets larger than {MAX_PACKET_BYTES} bytes: any client it lets publish can make every subscriber read messages of any size (one node's retained message can stall the coordinator); set `max_packet_size {MAX_PACKET_BYTES}` in its mosquitto.conf (the starling.conf that --mosquitto-auth-dir writes has it: `include_dir` that directory)"
        ),
        PacketLimit::Unknown(why) => tracing::info!(
            %url,
            why = why.as_str(),
            "could not tell whether the broker enforces a packet limit of {MAX_PACKET_BYTES} bytes"
        ),
    }
    found
}

/// Connects the coordinator's MQTT client and waits for the broker's
/// ConnAck. On an operator's broker (`check_limit`), whether it has the
/// packet limit the coordinator's own broker has is then found out beside
/// the start ([`check_packet_limit`]).
pub(crate) async fn connect(
    address: &BrokerAddress,
    tls: &starling_net::MqttTlsFiles,
    login: Option<(&str, &str)>,
    check_limit: bool,
) -> Result<(MqttClient, EventLoop), ConnectError> {
    let connected = connect_client(address, tls, login).await?;
    if check_limit {
        tokio::spawn(check_packet_limit(
            address.clone(),
            tls.clone(),
            login.map(|(user, password)| (user.to_owned(), password.to_owned())),
        ));
    }
    Ok(connected)
}

async fn connect_client(
    address: &BrokerAddress,
    tls: &starling_net::MqttTlsFiles,
    login: Option<(&str, &str)>,
) -> Result<(MqttClient, EventLoop), ConnectError> {
    let client_id = format!("starling-coordinator-{}", uuid::Uuid::now_v7().simple());
    let mut options = options(
        client_id,
        address,
        MAX_INCOMING_PACKET_BYTES,
        MAX_PACKET_BYTES,
    );
    options.set_inflight(MAX_INFLIGHT);
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

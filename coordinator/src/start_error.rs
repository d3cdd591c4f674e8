//! Why the coordinator could not start, each message saying what to change.

use std::net::SocketAddr;

use crate::mqtt::broker;
use crate::{access, federation, models, mqtt, server_tls, signing, store};

/// Why the coordinator could not start. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The REST listen address is taken or invalid.
    #[error(
        "cannot listen on {addr}: {reason}; pass --listen with a free port (port 0 picks one)"
    )]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS's words.
        reason: String,
    },
    /// The coordinator's own broker could not start.
    #[error(transparent)]
    Broker(#[from] broker::StartBrokerError),
    /// The external broker URL is malformed.
    #[error(transparent)]
    BrokerUrl(#[from] starling_net::BrokerUrlError),
    /// The REST API's certificate or key is unusable.
    #[error("{0}; pass PEM files to --tls-cert and --tls-key")]
    RestTls(#[from] server_tls::ServerTlsError),
    /// The broker did not accept the coordinator's connection (or its TLS
    /// settings are unusable).
    #[error(transparent)]
    BrokerConnect(#[from] mqtt::client::ConnectError),
    /// The database could not be opened.
    #[error(transparent)]
    Database(#[from] store::OpenStoreError),
    /// The coordinator's signing key could not be loaded or created.
    #[error(transparent)]
    Key(#[from] signing::KeyError),
    /// Access control could not be set up (random bytes, the Mosquitto files).
    #[error(transparent)]
    Access(#[from] access::AccessError),
    /// The MQTT login settings contradict each other.
    #[error("{0}")]
    MqttLogin(&'static str),
    /// The data directory could not be created.
    #[error(
        "cannot create data directory {path}: {source}; pass --data-dir with a writable directory"
    )]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The placement policy is unknown.
    #[error("{0}; pass --policy with one of them")]
    Policy(#[from] starling_placement::UnknownPolicy),
    /// A learned policy's model is unusable.
    #[error("{0}")]
    PolicyModel(starling_placement::PolicyError),
    /// The model file given with --model cannot be used.
    #[error("{0}; pass --model with a file from `starling-coordinator train`, or leave it out to run the shipped model")]
    Model(#[from] models::ModelReadError),
    /// The model drives another policy than --policy names.
    #[error("model file {path} drives policy {model}, but --policy is {policy}; pass --policy {model} or a {policy} model")]
    ModelPolicy {
        /// The model file.
        path: std::path::PathBuf,
        /// The policy it drives.
        model: &'static str,
        /// The policy asked for.
        policy: String,
    },
    /// Federation could not start.
    #[error(transparent)]
    Federation(#[from] federation::FederationError),
    /// The topic prefix is invalid.
    #[error("{0}; pass --topic-prefix like starling/v1")]
    TopicPrefix(#[from] starling_proto::TopicError),
    /// Artifact URLs under the public URL would not fit in an assignment.
    #[error("public URL {url} is too long: artifact URLs under it exceed the {max}-byte limit of an assignment; pass a shorter --public-url")]
    PublicUrl {
        /// The public URL.
        url: String,
        /// The limit on a whole artifact URL.
        max: usize,
    },
}

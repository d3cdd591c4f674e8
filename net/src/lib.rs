//! Plumbing that Starling's agent, coordinator and `starling` CLI share:
//! broker URLs ([`BrokerAddress`]), TLS client configuration for MQTT and
//! HTTPS ([`tls`]), and the parsers for durations and sizes that every
//! settings surface (flags, environment, TOML, task manifests) reads.
//!
//! It knows nothing of Starling's messages or REST types; each consumer picks
//! only the transports it uses (features `mqtt` and `http`), so the CLI links
//! no MQTT client.

pub mod address;
pub mod join_file;
#[cfg(feature = "mqtt")]
pub mod mqtt;
pub mod tls;
pub mod units;

pub use address::{BrokerAddress, BrokerUrlError};
#[cfg(feature = "clap")]
pub use join_file::JoinArgs;
pub use join_file::{JoinFile, JoinFileError};
pub use tls::{MqttTlsFiles, TlsError};
pub use units::{parse_duration, parse_size, DurationError, SizeError};

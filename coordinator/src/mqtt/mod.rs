//! The coordinator's MQTT side: the embedded broker (`broker`), the client's
//! event loop and the handling of what nodes publish (`inbound` checks a
//! message without I/O, `ingest` applies it), and what the
//! coordinator publishes to them (`publish`). No other module names rumqttc
//! or rumqttd.

pub mod broker;
pub mod client;
pub mod inbound;
pub mod ingest;
pub mod publish;

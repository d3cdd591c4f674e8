//! The coordinator's MQTT side: its own broker, a Mosquitto child (`broker`), the client's
//! event loop and the handling of what nodes publish (`inbound` checks a
//! message without I/O, `session` reads the broker within each node's budget, `ingest` applies it, `handler` spreads messages
//! over workers by node), and what the
//! coordinator publishes to them (`publish`). No other module names rumqttc
//! or runs the broker.

pub mod broker;
pub mod client;
pub mod handler;
pub mod inbound;
pub mod ingest;
pub mod publish;
pub mod session;

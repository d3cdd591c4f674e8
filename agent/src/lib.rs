//! Starling's edge agent: probes the device, talks MQTT with the coordinator,
//! and runs verified wasm tasks under limits.

pub mod wasm;

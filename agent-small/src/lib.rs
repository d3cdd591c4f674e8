//! Starling's agent without a compiler. The package holds only the
//! `starling-agent-small` binary, built from `agent/src/main.rs` against the
//! agent library without its `cranelift` feature (see Cargo.toml).

//! The wasmtime engine Starling runs tasks with, defined once.
//!
//! A module compiled ahead of time loads only into an engine whose settings
//! match the compiling engine's (wasmtime checks the version, the target and
//! every compiler and runtime setting, and refuses a mismatch). The agent
//! builds its engine with [`config`]; the coordinator, compiling for a node,
//! builds one with [`config_for`] the node's target. Both come from here, so
//! they cannot drift apart; [`engine_id`] names the result, and a node
//! reports it so the coordinator compiles only for engines it can match.
//!
//! Without features this crate links no compiler: the small agent runs only
//! modules compiled for it. `compile` adds Cranelift for the host (the JIT
//! agent), `cross` every target Cranelift supports (the coordinator).

#[cfg(feature = "compile")]
mod precompile;

#[cfg(feature = "compile")]
pub use precompile::{PrecompileError, Precompiler};

use wasmtime::{Config, ModuleVersionStrategy};

/// Bumped whenever [`config`] changes in a way that changes compiled code or
/// what the runtime expects of it, so that a cached artifact compiled under
/// the old settings is never offered to an engine with the new ones.
const SETTINGS_REVISION: u32 = 1;

/// The engine settings every Starling agent runs modules with.
///
/// - Epoch interruption: the agent's wall-time limits and cancels stop a
///   running module at the next tick.
pub fn config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config
}

/// [`config`], compiling for `target` (a target triple such as
/// `aarch64-unknown-linux`) instead of this host.
#[cfg(feature = "compile")]
pub fn config_for(target: &str) -> Result<Config, PrecompileError> {
    let mut config = config();
    config
        .target(target)
        .map_err(|error| PrecompileError::Target {
            target: target.to_owned(),
            detail: format!("{error:#}"),
        })?;
    Ok(config)
}

/// The identity of the engine [`config`] builds: wasmtime's version as its
/// precompiled artifacts record it, and Starling's settings revision, e.g.
/// `wasmtime-48/starling-1`. Two engines with the same identity and target
/// load each other's artifacts.
pub fn engine_id() -> String {
    format!(
        "wasmtime-{}/starling-{SETTINGS_REVISION}",
        ModuleVersionStrategy::default().as_str()
    )
}

/// This host's target as wasmtime reads a triple: architecture and
/// operating system (`x86_64-unknown-linux`). Wasmtime checks only those two
/// parts of a precompiled artifact's triple against the engine's.
pub fn host_target() -> String {
    format!(
        "{}-unknown-{}",
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_id_names_wasmtime_s_major_version() {
        let id = engine_id();
        assert!(id.starts_with("wasmtime-"), "{id}");
        let major = id
            .trim_start_matches("wasmtime-")
            .split('/')
            .next()
            .unwrap();
        assert!(major.parse::<u32>().unwrap() >= 48, "{id}");
        assert!(
            id.ends_with(&format!("/starling-{SETTINGS_REVISION}")),
            "{id}"
        );
    }

    #[test]
    fn the_host_target_is_a_triple_wasmtime_reads() {
        let target = host_target();
        assert_eq!(target.split('-').count(), 3, "{target}");
        assert!(target.starts_with(std::env::consts::ARCH));
    }
}

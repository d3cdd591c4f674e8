//! Loading machine code the coordinator compiled for this node: the one place
//! in the agent that runs unsafe code.
//!
//! `wasmtime::Module::deserialize` maps the bytes in as executable code with
//! only light checks: bytes crafted by an attacker could run anything, with
//! the agent's rights. So the agent loads only bytes it can trace to its
//! coordinator: the assignment names their sha256 (`Assignment::precompiled`)
//! and its ed25519 signature, verified against the key pinned at enrollment
//! before the runner sees the assignment, covers that digest. [`load`] hashes
//! the bytes again right before loading them, whatever checked them earlier
//! (the artifact cache does too), so the check and the unsafe call stand
//! together and nothing between a download and the load can swap the bytes.

#![allow(unsafe_code)]

use starling_proto::Digest;
use wasmtime::{Engine, Module, Precompiled};

use crate::artifact::sha256;

/// Why precompiled code was not loaded; the executor reports it as
/// `ExecError::PrecompiledRefused`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refused(pub(crate) String);

/// `bytes` as a module of `engine`, provided they hash to `expected`: the
/// precompiled digest of an assignment whose signature verified.
pub(crate) fn load(engine: &Engine, bytes: &[u8], expected: &Digest) -> Result<Module, Refused> {
    let actual = sha256(bytes);
    if actual != *expected {
        return Err(Refused(format!(
            "its sha256 is {actual}, not the {expected} the assignment names"
        )));
    }
    // A component, or bytes that are not wasmtime's at all: refused before
    // wasmtime parses them as code.
    if Engine::detect_precompiled(bytes) != Some(Precompiled::Module) {
        return Err(Refused(
            "the bytes are not a module precompiled by wasmtime".to_owned(),
        ));
    }
    // SAFETY: `Module::deserialize` is sound for bytes that wasmtime's own
    // `Engine::precompile_module` produced, unmodified. These bytes hash to
    // `expected` (checked just above), and `expected` comes from an
    // assignment signed by the coordinator this node enrolled with, which put
    // there the digest of what its `starling_wasm::Precompiler` compiled for
    // this node's engine and target. An engine or version mismatch is not
    // unsafe: wasmtime checks both and answers with an error, mapped below.
    let module = unsafe { Module::deserialize(engine, bytes) };
    module.map_err(|error| Refused(format!("wasmtime cannot load it here: {error:#}")))
}

#[cfg(all(test, feature = "cranelift"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn precompiled(engine: &Engine) -> Vec<u8> {
        let module = wat::parse_str(r#"(module (func (export "_start")))"#).unwrap();
        engine.precompile_module(&module).unwrap()
    }

    #[test]
    fn loads_what_hashes_to_the_named_digest() {
        let engine = Engine::new(&starling_wasm::config()).unwrap();
        let bytes = precompiled(&engine);
        let module = load(&engine, &bytes, &sha256(&bytes)).unwrap();
        assert!(module.get_export("_start").is_some());
    }

    #[test]
    fn refuses_altered_bytes_before_loading_them() {
        let engine = Engine::new(&starling_wasm::config()).unwrap();
        let bytes = precompiled(&engine);
        let named = sha256(&bytes);
        // One byte of the code changed: the digest no longer matches.
        let mut altered = bytes.clone();
        let middle = altered.len() / 2;
        altered[middle] ^= 0x01;
        let error = load(&engine, &altered, &named).unwrap_err();
        assert!(error.to_string().contains("sha256"), "{error}");
        // Consistent bytes that are not wasmtime's: the digest matches (an
        // attacker named it) and they are still refused before any load.
        let plain = wat::parse_str(r#"(module)"#).unwrap();
        let error = load(&engine, &plain, &sha256(&plain)).unwrap_err();
        assert!(
            error.to_string().contains("not a module precompiled"),
            "{error}"
        );
    }

    #[test]
    fn an_engine_with_other_settings_refuses_the_code() {
        let compiling = Engine::new(&starling_wasm::config()).unwrap();
        let bytes = precompiled(&compiling);
        let mut other = wasmtime::Config::new();
        other.epoch_interruption(false);
        let engine = Engine::new(&other).unwrap();
        let error = load(&engine, &bytes, &sha256(&bytes)).unwrap_err();
        assert!(error.to_string().contains("cannot load it here"), "{error}");
    }
}

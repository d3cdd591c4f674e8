//! Ahead-of-time compilation for a node's target: what the coordinator runs
//! so that a device without a compiler gets machine code it can load.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use wasmtime::{Engine, Precompiled};

use crate::config_for;

/// Why a module could not be compiled for a target.
#[derive(Debug, thiserror::Error)]
pub enum PrecompileError {
    /// Cranelift has no backend for the target, or the triple is malformed.
    #[error("cannot compile for target {target}: {detail}")]
    Target {
        /// The triple asked for.
        target: String,
        /// What wasmtime said.
        detail: String,
    },
    /// The module did not compile (invalid, or a feature the engine lacks).
    #[error("the module does not compile for {target}: {detail}")]
    Module {
        /// The triple compiled for.
        target: String,
        /// What wasmtime said.
        detail: String,
    },
}

/// Compiles modules for other machines, one engine per target, each built
/// with the settings agents run modules with.
#[derive(Default)]
pub struct Precompiler {
    engines: Mutex<HashMap<String, Engine>>,
}

impl std::fmt::Debug for Precompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Precompiler").finish_non_exhaustive()
    }
}

impl Precompiler {
    /// A precompiler with no engine built yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine compiling for `target`, built on first use.
    fn engine(&self, target: &str) -> Result<Engine, PrecompileError> {
        let mut engines = self.engines.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(engine) = engines.get(target) {
            return Ok(engine.clone());
        }
        let engine =
            Engine::new(&config_for(target)?).map_err(|error| PrecompileError::Target {
                target: target.to_owned(),
                detail: format!("{error:#}"),
            })?;
        engines.insert(target.to_owned(), engine.clone());
        Ok(engine)
    }

    /// Whether modules can be compiled for `target` here.
    pub fn supports(&self, target: &str) -> bool {
        self.engine(target).is_ok()
    }

    /// `module` (a binary WebAssembly module) compiled for `target`: the
    /// bytes an agent of the same [`engine_id`](crate::engine_id) on that
    /// target loads without compiling.
    pub fn precompile(&self, module: &[u8], target: &str) -> Result<Vec<u8>, PrecompileError> {
        let engine = self.engine(target)?;
        let compiled =
            engine
                .precompile_module(module)
                .map_err(|error| PrecompileError::Module {
                    target: target.to_owned(),
                    detail: format!("{error:#}"),
                })?;
        // wasmtime's own output; a mismatch here is a wasmtime bug, not bad input.
        debug_assert_eq!(
            Engine::detect_precompiled(&compiled),
            Some(Precompiled::Module)
        );
        Ok(compiled)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const HELLO: &str = r#"(module (func (export "_start")))"#;

    #[test]
    fn compiles_for_the_host_and_says_what_it_made() {
        let module = wat::parse_str(HELLO).unwrap();
        let precompiler = Precompiler::new();
        let compiled = precompiler
            .precompile(&module, &crate::host_target())
            .unwrap();
        assert_eq!(
            Engine::detect_precompiled(&compiled),
            Some(Precompiled::Module)
        );
        // Deterministic: the coordinator's cache may compile twice and keep either.
        assert_eq!(
            compiled,
            precompiler
                .precompile(&module, &crate::host_target())
                .unwrap()
        );
    }

    #[test]
    fn refuses_what_is_not_a_module_and_targets_it_cannot_compile_for() {
        let precompiler = Precompiler::new();
        let error = precompiler
            .precompile(b"\0asm\x01\0\0\0\x01", &crate::host_target())
            .unwrap_err();
        assert!(matches!(error, PrecompileError::Module { .. }), "{error:?}");
        assert!(!precompiler.supports("mips-unknown-linux"));
        assert!(!precompiler.supports("not a triple"));
        let error = precompiler
            .precompile(&wat::parse_str(HELLO).unwrap(), "mips-unknown-linux")
            .unwrap_err();
        assert!(error.to_string().contains("mips-unknown-linux"), "{error}");
    }

    /// The coordinator links every architecture (`cross`): a Pi's code is
    /// compiled on an x86 server.
    #[cfg(feature = "cross")]
    #[test]
    fn compiles_for_other_architectures() {
        let module = wat::parse_str(HELLO).unwrap();
        let precompiler = Precompiler::new();
        for target in ["aarch64-unknown-linux", "x86_64-unknown-linux"] {
            assert!(precompiler.supports(target), "{target}");
            let compiled = precompiler.precompile(&module, target).unwrap();
            assert_eq!(
                Engine::detect_precompiled(&compiled),
                Some(Precompiled::Module)
            );
        }
        let arm = precompiler
            .precompile(&module, "aarch64-unknown-linux")
            .unwrap();
        let x86 = precompiler
            .precompile(&module, "x86_64-unknown-linux")
            .unwrap();
        assert_ne!(arm, x86);
    }
}

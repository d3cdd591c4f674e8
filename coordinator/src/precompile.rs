//! Modules compiled ahead of time for nodes that carry no compiler.
//!
//! A node's capability says whether it compiles wasm itself and, when it
//! does not, the engine and target its code must be built for. This
//! coordinator compiles for such a node only when the engine is its own
//! (the same wasmtime and settings, `starling_wasm::engine_id`) and Cranelift
//! has a backend for the target; otherwise the node is not offered wasm work
//! at all ([`Precompile::serves`], applied to the cluster view). Code is
//! compiled on the first assignment that needs it and kept in the store per
//! module, target and engine; every later assignment names the stored
//! digest, and agents fetch the bytes from `GET /api/v1/artifacts/{digest}`.

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use starling_proto::{Digest, NodeId, PrecompiledModule, Runtime, WasmEngine};
use starling_wasm::Precompiler;

use crate::registry::NodeRegistry;
use crate::store::{PrecompiledKey, Store, StoreError, TaskRecord};
use crate::task::unix_now_ms;

/// Why an assignment's precompiled code could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum PrecompileFailure {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The module is not in the store (it was placed, so this is a bug or
    /// a hand-edited database).
    #[error("module {0} is not stored")]
    MissingModule(Digest),
    /// The node's engine or target is not one this coordinator compiles for
    /// (it was placed from an older capability report).
    #[error("this coordinator cannot compile for node {node} ({engine} on {target}; its own engine is {own})")]
    Unserved {
        /// The node.
        node: String,
        /// Its engine.
        engine: String,
        /// Its target.
        target: String,
        /// This coordinator's engine.
        own: String,
    },
    /// Compilation failed.
    #[error(transparent)]
    Compile(#[from] starling_wasm::PrecompileError),
    /// The compile thread ended without a result.
    #[error("the compile thread failed: {0}")]
    Thread(String),
    /// The artifact URL would not fit an assignment.
    #[error("the precompiled module's URL {0} is too long for an assignment")]
    Url(String),
}

/// What the cluster view and the publisher use to give nodes without a
/// compiler the code they can run.
#[derive(Clone)]
pub(crate) struct Precompile {
    store: Store,
    registry: Arc<NodeRegistry>,
    precompiler: Arc<Precompiler>,
    engine: String,
}

impl std::fmt::Debug for Precompile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Precompile")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl Precompile {
    /// Compiles with this build's engine, caching in `store`; nodes' engines
    /// are read from `registry`.
    pub(crate) fn new(store: Store, registry: Arc<NodeRegistry>) -> Self {
        Self {
            store,
            registry,
            precompiler: Arc::new(Precompiler::new()),
            engine: starling_wasm::engine_id(),
        }
    }

    /// Whether a node running wasm as `wasm` says can run wasm tasks from
    /// this coordinator: it compiles them itself, or this coordinator can
    /// compile for its engine and target.
    pub(crate) fn serves(&self, wasm: &WasmEngine) -> bool {
        wasm.compiles
            || (wasm.engine.as_str() == self.engine && self.precompiler.supports(&wasm.target))
    }

    /// The precompiled code an assignment of `task` to `node` must carry:
    /// `None` for a node that compiles (or a task that is not wasm), the
    /// stored or freshly compiled code otherwise.
    pub(crate) async fn for_assignment(
        &self,
        task: &TaskRecord,
        node: &NodeId,
        public_url: &str,
    ) -> Result<Option<PrecompiledModule>, PrecompileFailure> {
        if task.spec.runtime != Runtime::Wasm {
            return Ok(None);
        }
        let wasm = match self.registry.read().get(node) {
            Some(entry) => entry.capability.wasm.clone(),
            // A node the registry forgot since placement: nothing to go by,
            // and an agent that compiles is what older reports mean.
            None => return Ok(None),
        };
        if wasm.compiles {
            return Ok(None);
        }
        if !self.serves(&wasm) {
            return Err(PrecompileFailure::Unserved {
                node: node.to_string(),
                engine: wasm.engine.to_string(),
                target: wasm.target.to_string(),
                own: self.engine.clone(),
            });
        }
        let module = &task.spec.artifact;
        let key = PrecompiledKey {
            module,
            target: &wasm.target,
            engine: &self.engine,
        };
        let digest = match self.store.precompiled_digest(&key).await? {
            Some(digest) => digest,
            None => {
                let bytes = self
                    .store
                    .artifact(module)
                    .await?
                    .ok_or(PrecompileFailure::MissingModule(*module))?;
                let precompiler = Arc::clone(&self.precompiler);
                let target = wasm.target.to_string();
                let started = std::time::Instant::now();
                let compiled =
                    tokio::task::spawn_blocking(move || precompiler.precompile(&bytes, &target))
                        .await
                        .map_err(|e| PrecompileFailure::Thread(e.to_string()))??;
                let digest = Digest(Sha256::digest(&compiled).into());
                tracing::info!(
                    module = %module,
                    target = %wasm.target,
                    engine = %self.engine,
                    bytes = compiled.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "compiled a module for nodes without a compiler"
                );
                self.store
                    .put_precompiled(&key, &digest, &compiled, unix_now_ms())
                    .await?
            }
        };
        let url = format!("{public_url}/api/v1/artifacts/{}", digest.to_hex());
        let url = heapless::String::try_from(url.as_str())
            .map_err(|_| PrecompileFailure::Url(url.clone()))?;
        Ok(Some(PrecompiledModule { digest, url }))
    }
}

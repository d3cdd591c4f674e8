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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cluster_view::cluster_view;
    use crate::registry::tests::capability;
    use crate::task::TaskStatus;

    const NOW: u64 = 1_000_000;

    /// A minimal WASI command: `_start` that does nothing.
    fn module() -> Vec<u8> {
        wat::parse_str(r#"(module (func (export "_start")))"#).unwrap()
    }

    fn task(artifact: Digest, runtime: Runtime) -> TaskRecord {
        let mut task = TaskRecord {
            status: TaskStatus::Assigned,
            updated_ms: NOW,
            attempt: 1,
            ..TaskRecord::sample("t1")
        };
        task.spec.artifact = artifact;
        task.spec.runtime = runtime;
        task.spec.created_ms = NOW;
        task
    }

    fn wasm(compiles: bool, engine: &str, target: &str) -> WasmEngine {
        WasmEngine {
            compiles,
            engine: engine.try_into().unwrap(),
            target: target.try_into().unwrap(),
        }
    }

    /// A store with the module, a registry with a JIT node, a small node of
    /// this build's engine and one of another engine.
    async fn fixture(dir: &std::path::Path) -> (Precompile, Digest) {
        let store = Store::open(&format!("sqlite://{}", dir.join("p.db").display()))
            .await
            .unwrap();
        let bytes = module();
        let digest = Digest(Sha256::digest(&bytes).into());
        store
            .put_artifact(&digest, &bytes, Runtime::Wasm, "", NOW)
            .await
            .unwrap();
        let registry = Arc::new(NodeRegistry::new());
        let own = starling_wasm::engine_id();
        for (id, engine) in [
            ("jit", WasmEngine::default()),
            ("small", wasm(false, &own, &starling_wasm::host_target())),
            ("pi", wasm(false, &own, "aarch64-unknown-linux")),
            (
                "foreign",
                wasm(false, "wasmtime-12/starling-1", "x86_64-unknown-linux"),
            ),
            ("mips", wasm(false, &own, "mips-unknown-linux")),
        ] {
            let mut capability = capability(id);
            capability.wasm = engine;
            registry
                .write()
                .apply_capability(&capability.node_id.clone(), capability, NOW)
                .unwrap();
        }
        (Precompile::new(store, registry), digest)
    }

    #[tokio::test]
    async fn nodes_without_a_compiler_get_code_for_their_target_compiled_once() {
        let dir = tempfile::tempdir().unwrap();
        let (precompile, digest) = fixture(dir.path()).await;
        let record = task(digest, Runtime::Wasm);
        let node = |id: &str| NodeId::new(id).unwrap();
        let url = "http://coordinator:7878";

        // The JIT node compiles for itself; an OpenCL task is never compiled.
        assert_eq!(
            precompile
                .for_assignment(&record, &node("jit"), url)
                .await
                .unwrap(),
            None
        );
        let kernel = task(digest, Runtime::Opencl);
        assert_eq!(
            precompile
                .for_assignment(&kernel, &node("small"), url)
                .await
                .unwrap(),
            None
        );

        let small = precompile
            .for_assignment(&record, &node("small"), url)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            small.url.as_str(),
            format!("{url}/api/v1/artifacts/{}", small.digest.to_hex())
        );
        let bytes = precompile
            .store
            .precompiled_bytes(&small.digest)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(Digest(Sha256::digest(&bytes).into()), small.digest);
        // The same code again, from the store; another target, other code.
        let again = precompile
            .for_assignment(&record, &node("small"), url)
            .await
            .unwrap();
        assert_eq!(again, Some(small.clone()));
        let pi = precompile
            .for_assignment(&record, &node("pi"), url)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(pi.digest, small.digest);

        // Engines and targets this coordinator cannot compile for fail the
        // attempt here rather than reach the node.
        for id in ["foreign", "mips"] {
            let failure = precompile
                .for_assignment(&record, &node(id), url)
                .await
                .unwrap_err();
            assert!(
                matches!(failure, PrecompileFailure::Unserved { .. }),
                "{failure}"
            );
        }
    }

    #[tokio::test]
    async fn the_view_offers_wasm_only_to_nodes_that_can_run_it() {
        let dir = tempfile::tempdir().unwrap();
        let (precompile, _) = fixture(dir.path()).await;
        let silence = crate::domain::liveness::Silence {
            now_ms: NOW,
            timeout_ms: u64::MAX,
            ingest_lag_ms: 0,
            listening_since_ms: 0,
        };
        let (view, ids) = cluster_view(&precompile.registry.read(), &silence, |wasm| {
            precompile.serves(wasm)
        });
        let runs_wasm: Vec<(&str, bool)> = ids
            .iter()
            .zip(&view.nodes)
            .map(|(id, node)| (id.id.as_str(), node.runtimes.contains(&Runtime::Wasm)))
            .collect();
        assert_eq!(
            runs_wasm,
            [
                ("foreign", false),
                ("jit", true),
                ("mips", false),
                ("pi", true),
                ("small", true)
            ]
        );
    }
}

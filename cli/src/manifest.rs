//! Task manifests (`task.toml`): what a task author declares about a module so
//! that `starling run` submits it with the right class, demand and deadline,
//! and, for an OpenCL task, the `[opencl]` section that `starling publish`
//! packs with the kernel source. Also the duration and size syntax (`10s`,
//! `16MiB`) the CLI accepts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use starling_opencl::{KernelSpec, Package};

use starling_api::{TaskDemand, TaskGrants, TaskKind};
use starling_net::parse_duration;

/// How many directories up `find_for` looks for `{stem}/task.toml` (a module
/// built into `tasks/target/wasm32-wasip1/release/` has its manifest in
/// `tasks/{stem}/task.toml`).
const SEARCH_DEPTH: usize = 4;

/// A task manifest.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Manifest {
    /// The task's name.
    pub name: Option<String>,
    /// Dominant resource.
    #[serde(default)]
    pub class: TaskKind,
    /// Default deadline from submission (`10s`, `500ms`, `2m`).
    pub deadline: Option<String>,
    /// Estimated work, seconds on one reference core.
    pub work_seconds: Option<f64>,
    /// Resources needed.
    #[serde(default)]
    pub demand: TaskDemand,
    /// The `[grants]` section: `clock = true`, `random = true` (wasm tasks).
    #[serde(default)]
    pub grants: TaskGrants,
    /// The `[opencl]` section as written: `source` (the `.cl` file, relative to
    /// the manifest) and the fields of a [`KernelSpec`].
    #[serde(default)]
    pub opencl: Option<toml::Table>,
    /// The `[opencl]` section, read and resolved by [`Manifest::load`].
    #[serde(skip)]
    pub kernel: Option<KernelSection>,
}

/// A manifest's `[opencl]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelSection {
    /// The kernel source file, resolved against the manifest's directory.
    pub source: PathBuf,
    /// How to launch it.
    pub spec: KernelSpec,
}

/// Why a manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read manifest {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid manifest.
    #[error("manifest {path} is invalid: {detail}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

impl Manifest {
    /// Reads and checks a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |detail: String| ManifestError::Invalid {
            path: path.to_path_buf(),
            detail,
        };
        let mut manifest: Manifest =
            toml::from_str(&text).map_err(|error| invalid(error.to_string()))?;
        if let Some(table) = &manifest.opencl {
            let mut table = table.clone();
            let source = match table.remove("source") {
                Some(toml::Value::String(source)) => source,
                _ => return Err(invalid(
                    "[opencl] needs `source = \"FILE.cl\"`, the kernel source beside the manifest"
                        .to_string(),
                )),
            };
            let spec: KernelSpec = toml::Value::Table(table)
                .try_into()
                .map_err(|error| invalid(format!("[opencl]: {error}")))?;
            spec.validate()
                .map_err(|error| invalid(error.to_string()))?;
            let directory = path.parent().unwrap_or(Path::new("."));
            manifest.kernel = Some(KernelSection {
                source: directory.join(source),
                spec,
            });
        }
        if let Some(deadline) = &manifest.deadline {
            parse_duration(deadline).map_err(|detail| ManifestError::Invalid {
                path: path.to_path_buf(),
                detail: format!("deadline: {detail}"),
            })?;
        }
        Ok(manifest)
    }

    /// The OpenCL package this manifest describes: its kernel source read from
    /// disk and checked against the spec, as the coordinator will check it.
    pub fn package(&self, path: &Path) -> Result<Package, ManifestError> {
        let invalid = |detail: String| ManifestError::Invalid {
            path: path.to_path_buf(),
            detail,
        };
        let kernel = self.kernel.as_ref().ok_or_else(|| {
            invalid(
                "it has no [opencl] section; an OpenCL task needs one (see tasks/saxpy/task.toml)"
                    .to_string(),
            )
        })?;
        let source =
            std::fs::read_to_string(&kernel.source).map_err(|source| ManifestError::Read {
                path: kernel.source.clone(),
                source,
            })?;
        Package::new(source, kernel.spec.clone()).map_err(|error| invalid(error.to_string()))
    }

    /// The manifest's deadline, if it has a valid one.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
            .as_deref()
            .and_then(|text| parse_duration(text).ok())
    }

    /// Finds the manifest for a module: `task.toml` or `{stem}.toml` beside it,
    /// or `{stem}/task.toml` in one of the directories above it.
    pub fn find_for(module: &Path) -> Option<PathBuf> {
        let directory = module.parent()?;
        let stem = module.file_stem()?.to_str()?;
        let beside = [
            directory.join("task.toml"),
            directory.join(format!("{stem}.toml")),
        ];
        if let Some(found) = beside.into_iter().find(|path| path.is_file()) {
            return Some(found);
        }
        directory
            .ancestors()
            .take(SEARCH_DEPTH + 1)
            .map(|ancestor| ancestor.join(stem).join("task.toml"))
            .find(|path| path.is_file())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_from_the_manifest_and_unknown_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.toml");
        std::fs::write(&path, "name = \"t\"\n[grants]\nclock = true\n").unwrap();
        let grants = Manifest::load(&path).unwrap().grants;
        assert!(grants.clock);
        assert!(!grants.random);
        std::fs::write(&path, "name = \"t\"\n").unwrap();
        assert_eq!(Manifest::load(&path).unwrap().grants, TaskGrants::default());
        // A misspelt or unsupported grant must not silently mean "no grant".
        std::fs::write(&path, "[grants]\nnetwork = true\n").unwrap();
        assert!(matches!(
            Manifest::load(&path),
            Err(ManifestError::Invalid { .. })
        ));
        let primes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tasks/primes/task.toml");
        assert_eq!(
            Manifest::load(&primes).unwrap().grants,
            TaskGrants::default()
        );
    }

    #[test]
    fn manifests_are_found_beside_or_above_the_module() {
        let root = tempfile::tempdir().unwrap();
        let release = root.path().join("target/wasm32-wasip1/release");
        std::fs::create_dir_all(&release).unwrap();
        std::fs::create_dir_all(root.path().join("wordcount")).unwrap();
        let manifest = root.path().join("wordcount/task.toml");
        std::fs::write(
            &manifest,
            "name = \"wordcount\"\nclass = \"io\"\ndeadline = \"10s\"\nwork_seconds = 0.05\n[demand]\ncpu_cores = 1.0\nmemory_mb = 32\ngpu = false\nio_mbps = 20.0\n",
        )
        .unwrap();
        let module = release.join("wordcount.wasm");
        assert_eq!(Manifest::find_for(&module), Some(manifest.clone()));
        let loaded = Manifest::load(&manifest).unwrap();
        assert_eq!(loaded.class, TaskKind::Io);
        assert_eq!(loaded.deadline(), Some(Duration::from_secs(10)));
        assert_eq!(loaded.demand.memory_mb, 32);
        assert_eq!(Manifest::find_for(&release.join("other.wasm")), None);

        let bad = root.path().join("bad.toml");
        std::fs::write(&bad, "class = \"quantum\"\n").unwrap();
        assert!(matches!(
            Manifest::load(&bad),
            Err(ManifestError::Invalid { .. })
        ));
    }

    #[test]
    fn the_example_kernels_manifests_pack_and_a_bad_section_is_refused() {
        let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tasks");
        for name in ["saxpy", "matmul"] {
            let path = tasks.join(name).join("task.toml");
            let manifest = Manifest::load(&path).unwrap();
            assert_eq!(manifest.class, TaskKind::Gpu);
            let package = manifest.package(&path).unwrap();
            assert_eq!(package.spec.kernel, name);
            // What `starling publish` uploads is what the coordinator accepts.
            assert_eq!(Package::from_bytes(&package.to_bytes()).unwrap(), package);
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.toml");
        std::fs::write(
            &path,
            "[opencl]\nkernel = \"k\"\nglobal = [\"1\"]\nargs = []\n",
        )
        .unwrap();
        let error = Manifest::load(&path).unwrap_err().to_string();
        assert!(error.contains("source"), "{error}");
        std::fs::write(
            &path,
            "[opencl]\nsource = \"k.cl\"\nkernel = \"k\"\nglobal = [\"n\"]\nargs = []\n",
        )
        .unwrap();
        let error = Manifest::load(&path).unwrap_err().to_string();
        assert!(
            error.contains("n"),
            "an unknown name in an expression: {error}"
        );
        let wasm_only = Manifest {
            kernel: None,
            ..Manifest::load(&tasks.join("wordcount/task.toml")).unwrap()
        };
        assert!(wasm_only.package(&path).is_err());
    }
}

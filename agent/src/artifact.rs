//! Module fetching and the content-addressed cache. A module is fetched by
//! HTTP GET from the assignment's URL, hashed while it streams in, and written
//! to `<data dir>/artifacts/sha256/<hex>` only after its digest matched. Cached
//! files are hashed again on every read, so a file changed on disk is refetched
//! rather than run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use starling_proto::{Digest, FailureReason};

use crate::link::Throughput;

/// Why a module could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server has no artifact at that URL.
    #[error("the artifact server has no module at {url} (HTTP 404)")]
    NotFound {
        /// The URL.
        url: String,
    },
    /// The server answered with another error status.
    #[error("fetching {url} failed with HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The request could not be made or the body not read.
    #[error("cannot fetch {url}: {detail}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        detail: String,
    },
    /// The module is larger than the agent accepts.
    #[error("the module at {url} is larger than the {max_bytes}-byte limit")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit.
        max_bytes: u64,
    },
    /// The bytes hash to something other than the assignment's digest.
    #[error("the module from {url} has sha256 {actual}, not the expected {expected}")]
    DigestMismatch {
        /// The URL.
        url: String,
        /// The digest the assignment named.
        expected: Digest,
        /// The digest of what arrived.
        actual: Digest,
    },
    /// The cache could not be written.
    #[error("cannot write the module cache at {path}: {source}")]
    Cache {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl FetchError {
    /// The wire code for this failure.
    pub fn failure_reason(&self) -> FailureReason {
        match self {
            FetchError::DigestMismatch { .. } => FailureReason::DigestMismatch,
            FetchError::Cache { .. } => FailureReason::Internal,
            _ => FailureReason::FetchFailed,
        }
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    /// The cache directory could not be created.
    #[error("cannot create the module cache directory {path}: {source}; check --data-dir")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// A module's bytes and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedModule {
    /// The verified bytes.
    pub bytes: Vec<u8>,
    /// Whether they came from the cache rather than the network.
    pub cache_hit: bool,
}

/// Fetches modules and keeps verified copies on disk.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    directory: PathBuf,
    http: reqwest::Client,
    max_bytes: u64,
    /// The downloads' smoothed bandwidth: what the node's link toward the
    /// coordinator carries (telemetry reports it).
    throughput: Arc<Throughput>,
}

impl ArtifactStore {
    /// Opens (creating if needed) the cache under `data_dir`.
    pub fn open(data_dir: &Path, max_bytes: u64) -> Result<Self, OpenStoreError> {
        Self::open_with_ca(data_dir, max_bytes, None)
    }

    /// Opens the cache; `https://` artifact URLs trust `ca_file`, or the
    /// system roots without one.
    pub fn open_with_ca(
        data_dir: &Path,
        max_bytes: u64,
        ca_file: Option<&Path>,
    ) -> Result<Self, OpenStoreError> {
        let directory = data_dir.join("artifacts").join("sha256");
        std::fs::create_dir_all(&directory).map_err(|source| OpenStoreError::CreateDir {
            path: directory.clone(),
            source,
        })?;
        let http = starling_net::tls::http_client(ca_file)
            .map_err(|e| OpenStoreError::Client(e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| OpenStoreError::Client(e.to_string()))?;
        Ok(Self {
            directory,
            http,
            max_bytes,
            throughput: Arc::default(),
        })
    }

    /// The bandwidth its downloads measured, shared with every clone.
    pub fn throughput(&self) -> Arc<Throughput> {
        Arc::clone(&self.throughput)
    }

    /// Where a module with this digest is cached.
    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.directory.join(digest.to_hex())
    }

    /// The module with `digest`: from the cache when a copy there still hashes
    /// right, otherwise from `url`, verified, then cached.
    pub async fn get(&self, digest: &Digest, url: &str) -> Result<FetchedModule, FetchError> {
        if let Some(bytes) = self.cached(digest).await {
            return Ok(FetchedModule {
                bytes,
                cache_hit: true,
            });
        }
        let bytes = self.download(url).await?;
        let (bytes, actual) = hashed(bytes).await;
        if actual != *digest {
            return Err(FetchError::DigestMismatch {
                url: url.to_owned(),
                expected: *digest,
                actual,
            });
        }
        self.store(digest, &bytes).await?;
        Ok(FetchedModule {
            bytes,
            cache_hit: false,
        })
    }

    async fn cached(&self, digest: &Digest) -> Option<Vec<u8>> {
        let path = self.path_of(digest);
        let bytes = tokio::fs::read(&path).await.ok()?;
        let (bytes, actual) = hashed(bytes).await;
        if actual == *digest {
            return Some(bytes);
        }
        tracing::warn!(path = %path.display(), "cached module no longer matches its digest; refetching");
        let _ = tokio::fs::remove_file(&path).await;
        None
    }

    async fn download(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let transport = |e: reqwest::Error| FetchError::Transport {
            url: url.to_owned(),
            detail: error_chain(&e),
        };
        let started = Instant::now();
        let mut response = self.http.get(url).send().await.map_err(transport)?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(FetchError::NotFound {
                url: url.to_owned(),
            });
        }
        if !status.is_success() {
            return Err(FetchError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
            });
        }
        let too_large = || FetchError::TooLarge {
            url: url.to_owned(),
            max_bytes: self.max_bytes,
        };
        if response
            .content_length()
            .is_some_and(|len| len > self.max_bytes)
        {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if (bytes.len() + chunk.len()) as u64 > self.max_bytes {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        self.throughput
            .record(bytes.len() as u64, started.elapsed());
        Ok(bytes)
    }

    async fn store(&self, digest: &Digest, bytes: &[u8]) -> Result<(), FetchError> {
        let path = self.path_of(digest);
        // Write under a unique name, then rename: a crash never leaves a
        // partial file under the digest's name, and concurrent fetches of the
        // same module do not interleave.
        let temporary = self.directory.join(format!(
            ".{}.{}.partial",
            digest.to_hex(),
            std::process::id() as u64 * 1_000_000 + u64::from(rand_suffix())
        ));
        let cache_error = |source| FetchError::Cache {
            path: temporary.clone(),
            source,
        };
        tokio::fs::write(&temporary, bytes)
            .await
            .map_err(cache_error)?;
        tokio::fs::rename(&temporary, &path)
            .await
            .map_err(|source| FetchError::Cache {
                path: path.clone(),
                source,
            })
    }
}

/// A cheap per-call suffix for temporary names (not security relevant).
fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// The sha256 of `bytes` as a wire digest.
pub fn sha256(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

/// `bytes` and their sha256, hashed on the blocking pool: a module may be
/// tens of MB, and the agent's runtime has a single worker, which must not
/// stop moving MQTT messages while it hashes.
async fn hashed(bytes: Vec<u8>) -> (Vec<u8>, Digest) {
    match tokio::task::spawn_blocking(move || {
        let digest = sha256(&bytes);
        (bytes, digest)
    })
    .await
    {
        Ok(result) => result,
        // The closure cannot panic (hashing a slice), and the pool is only
        // shut down with the runtime; a digest of zeros then matches nothing,
        // so the bytes are refused rather than trusted.
        Err(_) => (Vec::new(), Digest([0; 32])),
    }
}

/// An error and its sources on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

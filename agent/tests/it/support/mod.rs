//! Test helpers: a real Mosquitto on an ephemeral port (the workspace's shared
//! harness, `starling-tests`), a tiny HTTP server that serves modules from
//! memory and counts requests, and signed assignments as a coordinator makes
//! them.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub use starling_tests::Mosquitto;

use ed25519_dalek::{Signer, SigningKey};
use starling_proto::{
    Assignment, Digest, ExecLimits, Grants, NodeId, Runtime, TaskId, PROTOCOL_VERSION,
};

/// Sends the agent's logs to the test's captured output (shown when a test
/// fails, or with `--nocapture`).
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}

/// The coordinator key of the tests (a fixed seed: nothing secret here).
pub fn coordinator_key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

/// Its public half, as `AgentConfig::coordinator_key` takes it.
pub fn coordinator_public_key() -> [u8; 32] {
    coordinator_key().verifying_key().to_bytes()
}

/// Signs an assignment as the coordinator does: over `signed_bytes()`.
pub fn sign(mut assignment: Assignment, key: &SigningKey) -> Assignment {
    assignment.signature = key
        .sign(&assignment.signed_bytes().unwrap())
        .to_bytes()
        .to_vec();
    assignment
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An unsigned wasm assignment (attempt 1) for `node`, valid for a minute
/// from now; sign it with [`sign`].
pub fn unsigned_assignment(
    node: &str,
    task: &str,
    digest: Digest,
    url: &str,
    input: &[u8],
    limits: ExecLimits,
) -> Assignment {
    let now = now_ms();
    Assignment {
        v: PROTOCOL_VERSION,
        node_id: NodeId::new(node).unwrap(),
        task_id: TaskId::new(task).unwrap(),
        attempt: 1,
        runtime: Runtime::Wasm,
        artifact: digest,
        artifact_url: heapless::String::try_from(url).unwrap(),
        args: heapless::Vec::new(),
        input: input.to_vec(),
        limits,
        power_level: 1,
        deadline_unix_ms: None,
        grants: Grants::default(),
        publisher: None,
        precompiled: None,
        leader_epoch: None,
        issued_unix_ms: now,
        expires_unix_ms: now + 60_000,
        signature: Vec::new(),
    }
}

/// An attempt of the endless [`LOOP_WAT`] module for `node`, with a minute
/// of wall time: it runs until cancelled. Unsigned: the runner trusts the
/// session to have verified it.
pub fn spin_assignment(node: &str, task: &str, url: &str, digest: Digest) -> Assignment {
    unsigned_assignment(
        node,
        task,
        digest,
        url,
        b"",
        ExecLimits {
            wall_ms: 60_000,
            ..ExecLimits::default()
        },
    )
}

/// [`unsigned_assignment`] signed with the test coordinator key.
pub fn signed_assignment(
    node: &str,
    task: &str,
    digest: Digest,
    url: &str,
    input: &[u8],
    limits: ExecLimits,
) -> Assignment {
    sign(
        unsigned_assignment(node, task, digest, url, input, limits),
        &coordinator_key(),
    )
}

/// Serves fixed bodies by path; anything else is a 404.
pub struct HttpServer {
    pub base: String,
    routes: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    hits: Arc<AtomicUsize>,
}

impl HttpServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let hits = Arc::new(AtomicUsize::new(0));
        let (task_routes, task_hits) = (Arc::clone(&routes), Arc::clone(&hits));
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let routes = Arc::clone(&task_routes);
                let hits = Arc::clone(&task_hits);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    hits.fetch_add(1, Ordering::SeqCst);
                    let text = String::from_utf8_lossy(&request);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let body = routes.lock().unwrap().get(&path).cloned();
                    let response = match body {
                        Some(body) => {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/wasm\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
                    };
                    let _ = socket.write_all(&response).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { base, routes, hits }
    }

    /// Serves `body` at `path` and returns the full URL.
    pub fn serve(&self, path: &str, body: Vec<u8>) -> String {
        self.routes.lock().unwrap().insert(path.to_owned(), body);
        format!("{}{path}", self.base)
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Copies stdin to stdout.
pub const ECHO_WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start")
    (local $n i32)
    (loop $again
      (i32.store (i32.const 0) (i32.const 1024))
      (i32.store (i32.const 4) (i32.const 65536))
      (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $n (i32.load (i32.const 8)))
      (if (i32.gt_u (local.get $n) (i32.const 0))
        (then
          (i32.store (i32.const 16) (i32.const 1024))
          (i32.store (i32.const 20) (local.get $n))
          (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
          (br $again))))))
"#;

/// Spins forever.
pub const LOOP_WAT: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))"#;

/// Counts to 2^32 - 1 in a loop (about 3 s of CPU), then writes "done".
/// Long enough to kill or disturb an agent while it runs, short enough to
/// finish in a test.
pub const COUNT_WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "done")
  (func (export "_start")
    (local $i i32)
    (loop $again
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const -1))))
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 4))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#;

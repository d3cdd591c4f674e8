//! Fetching modules by digest: verification, 404s, and the on-disk cache.

use crate::support;

use crate::support::HttpServer;
use starling_agent::artifact::{sha256, ArtifactStore, FetchError};
use starling_proto::{Digest, FailureReason};

#[tokio::test]
async fn verified_module_is_cached_and_not_refetched() {
    let server = HttpServer::start().await;
    let bytes = wat::parse_str(support::ECHO_WAT).unwrap();
    let digest = sha256(&bytes);
    let url = server.serve(&format!("/artifacts/{digest}"), bytes.clone());
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path(), 1 << 20).unwrap();

    let first = store.get(&digest, &url).await.unwrap();
    assert_eq!(first.bytes, bytes);
    assert!(!first.cache_hit);
    assert_eq!(server.hits(), 1);
    assert_eq!(std::fs::read(store.path_of(&digest)).unwrap(), bytes);

    let second = store.get(&digest, &url).await.unwrap();
    assert!(second.cache_hit);
    assert_eq!(second.bytes, bytes);
    assert_eq!(server.hits(), 1, "a cache hit must not touch the network");

    // A fresh store over the same directory (an agent restart) still hits.
    let reopened = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    assert!(reopened.get(&digest, &url).await.unwrap().cache_hit);
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn tampered_cache_file_is_refetched() {
    let server = HttpServer::start().await;
    let bytes = b"\0asm\x01\0\0\0".to_vec();
    let digest = sha256(&bytes);
    let url = server.serve("/m", bytes.clone());
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    store.get(&digest, &url).await.unwrap();
    std::fs::write(store.path_of(&digest), b"evil").unwrap();
    let again = store.get(&digest, &url).await.unwrap();
    assert!(!again.cache_hit);
    assert_eq!(again.bytes, bytes);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn digest_mismatch_is_refused_and_not_cached() {
    let server = HttpServer::start().await;
    let url = server.serve("/wrong", b"not the module you asked for".to_vec());
    let expected = Digest([7; 32]);
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    let error = store.get(&expected, &url).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::DigestMismatch { expected: e, .. } if *e == expected),
        "{error}"
    );
    assert_eq!(error.failure_reason(), FailureReason::DigestMismatch);
    assert!(!store.path_of(&expected).exists());
}

#[tokio::test]
async fn missing_module_is_fetch_failed() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    let url = format!("{}/nothing-here", server.base);
    let error = store.get(&Digest([1; 32]), &url).await.unwrap_err();
    assert!(matches!(error, FetchError::NotFound { .. }), "{error}");
    assert_eq!(error.failure_reason(), FailureReason::FetchFailed);

    // Nobody listening at all is a fetch failure too, not a panic.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let error = store
        .get(&Digest([1; 32]), &format!("http://127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    assert!(matches!(error, FetchError::Transport { .. }), "{error}");
    assert_eq!(error.failure_reason(), FailureReason::FetchFailed);
}

#[tokio::test]
async fn oversize_module_is_refused() {
    let server = HttpServer::start().await;
    let bytes = vec![0u8; 4096];
    let url = server.serve("/big", bytes.clone());
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::open(dir.path(), 1024).unwrap();
    let error = store.get(&sha256(&bytes), &url).await.unwrap_err();
    assert!(matches!(error, FetchError::TooLarge { .. }), "{error}");
}

//! How many connections the API holds open, and which one gives way when
//! that many are open.
//!
//! A connection that never sends a byte costs the client nothing and the
//! coordinator a file descriptor; a thousand of them, opened in well under
//! a second, used to take REST, enrollment, artifact downloads and the
//! console down together (issue 33). Three bounds hold now:
//!
//! - a cap on open connections ([`ConnectionLimit`]), below the process's
//!   descriptor limit ([`connection_cap`]), so accepting never runs out of
//!   descriptors that the database, the broker link and the files need;
//! - at the cap, the oldest connection that has not sent a byte yet is
//!   closed to make room: a client with a request gets in, and only a
//!   silent one gives way (when every open connection has spoken, the new
//!   one is closed instead);
//! - and no connection waits longer than the first-request timeout for its
//!   first request (axum-server's, set where the server is built).

use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Descriptors kept out of the connection cap for everything else the
/// coordinator opens: its database pool, the broker link, Mosquitto's
/// pipes, gossip sockets, artifacts being read, logs.
pub(crate) const RESERVED_DESCRIPTORS: u64 = 256;

/// The most connections the API holds at once: `wanted`, or fewer when the
/// descriptor limit (`soft_limit`, `None`: unlimited) leaves less room
/// beside [`RESERVED_DESCRIPTORS`]; at least 16.
pub(crate) fn connection_cap(wanted: usize, soft_limit: Option<u64>) -> usize {
    let room = soft_limit.map_or(u64::MAX, |limit| limit.saturating_sub(RESERVED_DESCRIPTORS));
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    wanted.min(room).max(16)
}

/// Raises this process's soft descriptor limit to its hard limit (systemd
/// starts services with a soft limit of 1,024 and a much higher hard one)
/// and returns the soft limit in force after, `None` when unlimited.
pub(crate) fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, "could not raise the descriptor limit to its hard limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The acceptor that holds the API to its connection cap (plain HTTP, and
/// under TLS as the inner acceptor, so the cap counts handshakes too).
#[derive(Clone)]
pub(crate) struct ConnectionLimit {
    shared: Arc<Limits>,
}

/// What the acceptor and every connection it let in share.
struct Limits {
    max: usize,
    state: Mutex<State>,
    /// Silent connections closed to make room.
    evicted: AtomicU64,
    /// Connections closed at once because every open one had spoken.
    refused: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Connections counted against the cap.
    open: usize,
    /// Connections that may not have sent a byte yet, oldest first. Ones
    /// that have since spoken or closed are skipped (and dropped) lazily.
    silent: VecDeque<Arc<Slot>>,
}

/// One connection's standing, shared by its stream and the acceptor.
#[derive(Default)]
struct Slot {
    /// Whether it has sent a byte.
    spoke: AtomicBool,
    /// Closed to make room (or closed): no longer counted.
    gone: AtomicBool,
    /// Whom to wake when it is evicted: its connection's reader.
    waker: Mutex<Option<Waker>>,
}

impl Slot {
    fn waker(&self) -> MutexGuard<'_, Option<Waker>> {
        self.waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Limits {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A reading of the connection counters for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionCounts {
    /// Open now (counted against the cap).
    pub(crate) open: usize,
    /// The cap.
    pub(crate) max: usize,
    /// Silent connections closed to make room, in all.
    pub(crate) evicted: u64,
    /// Connections closed on arrival with every open one busy, in all.
    pub(crate) refused: u64,
}

impl ConnectionLimit {
    /// A limit of `max` open connections.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            shared: Arc::new(Limits {
                max,
                state: Mutex::new(State::default()),
                evicted: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// The counters now.
    pub(crate) fn counts(&self) -> ConnectionCounts {
        ConnectionCounts {
            open: self.shared.state().open,
            max: self.shared.max,
            evicted: self.shared.evicted.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
        }
    }

    /// Counts a new connection in, evicting the oldest silent one when the
    /// cap is reached; `None` when every open connection has spoken.
    fn admit(&self) -> Option<Ticket> {
        let mut state = self.shared.state();
        if state.open >= self.shared.max {
            let victim = loop {
                match state.silent.pop_front() {
                    None => break None,
                    Some(slot)
                        if slot.spoke.load(Ordering::Acquire)
                            || slot.gone.load(Ordering::Acquire) => {}
                    Some(slot) => break Some(slot),
                }
            };
            let Some(victim) = victim else {
                let refused = self.shared.refused.fetch_add(1, Ordering::Relaxed) + 1;
                if refused == 1 || refused.is_multiple_of(1000) {
                    tracing::warn!(
                        cap = self.shared.max,
                        refused,
                        "REST connections at the cap, all of them busy: closing new ones"
                    );
                }
                return None;
            };
            victim.gone.store(true, Ordering::Release);
            state.open -= 1;
            let evicted = self.shared.evicted.fetch_add(1, Ordering::Relaxed) + 1;
            // A flood evicts thousands: the first, then every thousandth.
            if evicted == 1 || evicted.is_multiple_of(1000) {
                tracing::warn!(
                    cap = self.shared.max,
                    evicted,
                    "REST connections at the cap: closing the oldest silent ones to make room"
                );
            }
            let waker = victim.waker().take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        // Spoken and closed connections leave the queue when they reach its
        // front; past twice the cap, the rest are swept too.
        if state.silent.len() >= self.shared.max.saturating_mul(2) {
            state.silent.retain(|slot| {
                !slot.spoke.load(Ordering::Acquire) && !slot.gone.load(Ordering::Acquire)
            });
        }
        let slot = Arc::new(Slot::default());
        state.open += 1;
        state.silent.push_back(slot.clone());
        Some(Ticket {
            shared: self.shared.clone(),
            slot,
        })
    }
}

/// A connection's place under the cap, given back when it closes.
struct Ticket {
    shared: Arc<Limits>,
    slot: Arc<Slot>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        if !self.slot.gone.swap(true, Ordering::AcqRel) {
            state.open = state.open.saturating_sub(1);
        }
    }
}

/// An accepted stream under the cap: reads fail once it was evicted.
pub(crate) struct Limited {
    stream: TcpStream,
    ticket: Ticket,
}

impl<S> Accept<TcpStream, S> for ConnectionLimit {
    type Stream = Limited;
    type Service = S;
    type Future = Ready<io::Result<(Limited, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        ready(match self.admit() {
            Some(ticket) => Ok((Limited { stream, ticket }, service)),
            None => Err(io::Error::other(
                "connection cap reached and every open connection is busy",
            )),
        })
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let slot = self.ticket.slot.clone();
        if !slot.spoke.load(Ordering::Acquire) {
            if slot.gone.load(Ordering::Acquire) {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "closed to make room: silent at the connection cap",
                )));
            }
            // Registered before the read, so an eviction between the two
            // still wakes this reader.
            *slot.waker() = Some(cx.waker().clone());
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            slot.spoke.store(true, Ordering::Release);
            slot.waker().take();
        }
        read
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_reserved_descriptors_free() {
        assert_eq!(connection_cap(4096, Some(1024)), 768);
        assert_eq!(connection_cap(4096, Some(65536)), 4096);
        assert_eq!(connection_cap(4096, None), 4096);
        assert_eq!(connection_cap(4096, Some(100)), 16, "never below 16");
    }

    #[test]
    fn at_the_cap_the_oldest_silent_connection_gives_way() {
        let limit = ConnectionLimit::new(3);
        let first = limit.admit().unwrap();
        let second = limit.admit().unwrap();
        let third = limit.admit().unwrap();
        // The first one spoke: it stays; the second is the oldest silent.
        first.slot.spoke.store(true, Ordering::Release);
        let fourth = limit.admit().expect("a silent one makes room");
        assert!(!first.slot.gone.load(Ordering::Acquire));
        assert!(second.slot.gone.load(Ordering::Acquire), "evicted");
        assert!(!third.slot.gone.load(Ordering::Acquire));
        let counts = limit.counts();
        assert_eq!((counts.open, counts.evicted), (3, 1));
        // The evicted one's close does not count twice.
        drop(second);
        assert_eq!(limit.counts().open, 3);
        // All that remain spoke: the next one is refused, and nothing is
        // evicted.
        third.slot.spoke.store(true, Ordering::Release);
        fourth.slot.spoke.store(true, Ordering::Release);
        assert!(limit.admit().is_none());
        let counts = limit.counts();
        assert_eq!((counts.open, counts.evicted, counts.refused), (3, 1, 1));
        // One closes: room again.
        drop(third);
        assert_eq!(limit.counts().open, 2);
        let _fifth = limit.admit().expect("room after a close");
        assert_eq!(limit.counts().open, 3);
        drop(first);
        drop(fourth);
    }

    #[tokio::test]
    async fn an_evicted_connection_reads_an_error_and_a_speaking_one_its_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limit = ConnectionLimit::new(1);

        let _silent_client = TcpStream::connect(address).await.unwrap();
        let (silent, _) = listener.accept().await.unwrap();
        let (mut silent, ()) = limit.accept(silent, ()).await.unwrap();
        let reader = tokio::spawn(async move {
            let mut buf = [0_u8; 8];
            silent.read(&mut buf).await
        });
        tokio::task::yield_now().await;

        let mut talker_client = TcpStream::connect(address).await.unwrap();
        let (talker, _) = listener.accept().await.unwrap();
        let (mut talker, ()) = limit.accept(talker, ()).await.unwrap();
        let error = reader.await.unwrap().expect_err("evicted");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);

        talker_client.write_all(b"GET").await.unwrap();
        let mut buf = [0_u8; 3];
        talker.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"GET");
        assert_eq!(limit.counts().open, 1);
    }
}

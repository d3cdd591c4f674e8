//! Full state sync (memberlist's push/pull): two members exchange their
//! whole membership and their newest digest of every site over one TCP
//! connection on the gossip port. A joiner does it with a seed at once, so
//! it knows every member the seed knows instead of the few one datagram
//! holds; every member does it with a random peer periodically, so members
//! that joined at the same moment, or missed an update, converge.
//!
//! A frame is a 4-byte length and a sealed datagram ([`super::wire`], kind
//! `Sync`): only key holders are heard, a recorded frame is refused like a
//! recorded datagram, and each exchange is bounded in bytes and in time.
//! foca is only touched by the gossip loop: this module moves bytes, and
//! hands what it read to the loop ([`Exchange`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use foca::Member;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::wire::{self, Kind};
use super::MemberId;
use crate::federation::key::ClusterKey;

/// Largest frame read or written: a membership of thousands and a digest
/// per site fit many times over.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;
/// Most members or digests in a frame.
const MAX_ITEMS: usize = 16_384;
/// A whole exchange, connect to last byte.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// Inbound exchanges served at once; more are closed unanswered (the
/// joiner backs off and comes back). Each takes milliseconds.
const MAX_INBOUND: usize = 32;
/// memberlist's push/pull interval, before scaling with membership.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// What one member sends another.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    /// Its whole membership, itself included, down members too.
    pub members: Vec<Member<MemberId>>,
    /// Its newest broadcast of each site's digest, as spread (bytes): sent
    /// when joining, and in answer to a joiner. Periodic syncs carry
    /// membership only, since digests are republished anyway.
    pub digests: Vec<Vec<u8>>,
    /// The sender is joining: answer with every digest too.
    pub want_digests: bool,
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Connecting, reading or writing failed.
    #[error("state sync with {peer}: {reason}")]
    Io {
        /// The other member.
        peer: SocketAddr,
        /// The OS's words.
        reason: String,
    },
    /// It took longer than [`EXCHANGE_TIMEOUT`].
    #[error("state sync with {0} timed out")]
    Timeout(SocketAddr),
    /// A frame over [`MAX_FRAME`].
    #[error("state sync frame of {0} bytes exceeds {MAX_FRAME}")]
    Oversize(usize),
    /// Did not open with the cluster key.
    #[error("state sync frame does not authenticate: {0}")]
    Forged(String),
    /// Authenticated but not a state.
    #[error("state sync frame is not a state: {0}")]
    Malformed(String),
    /// The loop is gone or refused the frame (replayed, stale).
    #[error("state sync refused: {0}")]
    Refused(String),
}

/// A state read off the wire, for the loop to check (clock, nonce) and apply.
#[derive(Debug)]
pub struct Received {
    /// Who sent it (the TCP peer).
    pub peer: SocketAddr,
    /// The seal's nonce.
    pub nonce: [u8; ring::aead::NONCE_LEN],
    /// The sender's clock.
    pub sent_ms: u64,
    /// The state.
    pub state: State,
}

/// What the server asks of the loop: check and apply `received`, and answer
/// with this member's state (or why it was refused).
#[derive(Debug)]
pub struct Exchange {
    /// What the peer pushed.
    pub received: Received,
    /// The loop's answer.
    pub reply: oneshot::Sender<Result<State, String>>,
}

/// Encodes and seals `state`.
pub fn seal(key: &ClusterKey, state: &State, now_ms: u64) -> Result<Vec<u8>, SyncError> {
    let body = postcard::to_allocvec(state).map_err(|e| SyncError::Malformed(e.to_string()))?;
    let sealed = key
        .seal(&wire::frame(Kind::Sync, now_ms, &body))
        .map_err(|e| SyncError::Forged(e.to_string()))?;
    if sealed.len() > MAX_FRAME {
        return Err(SyncError::Oversize(sealed.len()));
    }
    Ok(sealed)
}

/// Opens a frame and decodes its state.
pub fn open(
    key: &ClusterKey,
    peer: SocketAddr,
    mut sealed: Vec<u8>,
) -> Result<Received, SyncError> {
    let nonce = wire::nonce(&sealed).ok_or_else(|| SyncError::Forged("too short".into()))?;
    let plain = key
        .open(&mut sealed)
        .map_err(|e| SyncError::Forged(e.to_string()))?;
    let opened = wire::parse(plain).map_err(|e| SyncError::Malformed(e.to_string()))?;
    if opened.kind != Kind::Sync {
        return Err(SyncError::Malformed(format!(
            "a {:?} datagram",
            opened.kind
        )));
    }
    let state: State =
        postcard::from_bytes(opened.body).map_err(|e| SyncError::Malformed(e.to_string()))?;
    if state.members.len() > MAX_ITEMS || state.digests.len() > MAX_ITEMS {
        return Err(SyncError::Malformed(format!(
            "{} members and {} digests exceed {MAX_ITEMS}",
            state.members.len(),
            state.digests.len()
        )));
    }
    Ok(Received {
        peer,
        nonce,
        sent_ms: opened.sent_ms,
        state,
    })
}

async fn write_frame(stream: &mut TcpStream, sealed: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(sealed.len()).unwrap_or(u32::MAX);
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(sealed).await?;
    stream.flush().await
}

async fn read_frame(stream: &mut TcpStream, peer: SocketAddr) -> Result<Vec<u8>, SyncError> {
    let io = |e: std::io::Error| SyncError::Io {
        peer,
        reason: e.to_string(),
    };
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.map_err(io)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(SyncError::Oversize(len));
    }
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame).await.map_err(io)?;
    Ok(frame)
}

/// Pushes `sealed` (this member's state) to `peer` and reads its state back.
pub async fn exchange(
    key: &ClusterKey,
    peer: SocketAddr,
    sealed: Vec<u8>,
) -> Result<Received, SyncError> {
    let io = |e: std::io::Error| SyncError::Io {
        peer,
        reason: e.to_string(),
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, async {
        let mut stream = TcpStream::connect(peer).await.map_err(io)?;
        write_frame(&mut stream, &sealed).await.map_err(io)?;
        let frame = read_frame(&mut stream, peer).await?;
        open(key, peer, frame)
    })
    .await
    .map_err(|_| SyncError::Timeout(peer))?
}

/// Serves inbound exchanges until the loop's channel closes: reads a
/// state, hands it to the loop, writes the loop's answer.
pub async fn serve(listener: TcpListener, key: Arc<ClusterKey>, loop_tx: mpsc::Sender<Exchange>) {
    let slots = Arc::new(Semaphore::new(MAX_INBOUND));
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "state sync accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if loop_tx.is_closed() {
            return;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "state sync refused: {MAX_INBOUND} already in progress");
            continue;
        };
        let key = key.clone();
        let loop_tx = loop_tx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let served = tokio::time::timeout(EXCHANGE_TIMEOUT, async {
                let frame = read_frame(&mut stream, peer).await?;
                let received = open(&key, peer, frame)?;
                let (reply, answer) = oneshot::channel();
                loop_tx
                    .send(Exchange { received, reply })
                    .await
                    .map_err(|_| SyncError::Refused("the gossip loop stopped".into()))?;
                let state = answer
                    .await
                    .map_err(|_| SyncError::Refused("the gossip loop stopped".into()))?
                    .map_err(SyncError::Refused)?;
                let sealed = seal(&key, &state, crate::task::unix_now_ms())?;
                write_frame(&mut stream, &sealed)
                    .await
                    .map_err(|e| SyncError::Io {
                        peer,
                        reason: e.to_string(),
                    })
            })
            .await;
            match served {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%error, "inbound state sync failed"),
                Err(_) => tracing::debug!(%peer, "inbound state sync timed out"),
            }
        });
    }
}

/// How often to sync with a random peer among `members`: memberlist's
/// interval, lengthened logarithmically past 32 members ([`scale`]) so a
/// large federation's sync traffic grows slowly.
pub fn interval(members: usize) -> Duration {
    INTERVAL.mul_f64(scale(members))
}

/// memberlist's push/pull scale: 1 up to 32 members, then
/// `⌈log2(members / 32)⌉ + 1`.
pub fn scale(members: usize) -> f64 {
    const SCALE_THRESHOLD: f64 = 32.0;
    if members as f64 <= SCALE_THRESHOLD {
        return 1.0;
    }
    ((members as f64).log2() - SCALE_THRESHOLD.log2()).ceil() + 1.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn key() -> ClusterKey {
        ClusterKey::parse(&ClusterKey::generate().unwrap()).unwrap()
    }

    #[test]
    fn a_state_round_trips_sealed_and_only_under_its_key() {
        let key = key();
        let member = MemberId {
            site: "a".into(),
            addr: "127.0.0.1:7946".parse().unwrap(),
            bump: 3,
        };
        let state = State {
            members: vec![Member::alive(member.clone())],
            digests: vec![vec![1, 2, 3]],
            want_digests: true,
        };
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let sealed = seal(&key, &state, 42).unwrap();
        let received = open(&key, peer, sealed.clone()).unwrap();
        assert_eq!(received.sent_ms, 42);
        assert_eq!(received.state.members[0].id(), &member);
        assert_eq!(received.state.digests, vec![vec![1, 2, 3]]);
        assert!(matches!(
            open(&self::key(), peer, sealed.clone()),
            Err(SyncError::Forged(_))
        ));
        let mut tampered = sealed;
        tampered[20] ^= 1;
        assert!(matches!(
            open(&key, peer, tampered),
            Err(SyncError::Forged(_))
        ));
        // A sealed datagram of another kind is not a state.
        let nack = key.seal(&wire::frame(Kind::Nack, 42, b"x")).unwrap();
        assert!(matches!(
            open(&key, peer, nack),
            Err(SyncError::Malformed(_))
        ));
    }

    #[test]
    fn the_interval_grows_logarithmically_past_32_members() {
        assert_eq!(interval(3), INTERVAL);
        assert_eq!(interval(32), INTERVAL);
        assert_eq!(interval(33), INTERVAL * 2);
        assert_eq!(interval(64), INTERVAL * 2);
        assert_eq!(interval(200), INTERVAL * 4);
        assert_eq!(scale(10), 1.0);
        assert_eq!(scale(200), 4.0);
    }

    #[tokio::test]
    async fn an_oversize_or_unauthenticated_frame_is_refused_before_the_loop_sees_it() {
        let key = Arc::new(key());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(serve(listener, key.clone(), tx));
        // A length over the bound: the server closes without reading on.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(&(MAX_FRAME as u32 + 1).to_be_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(stream.read(&mut buf).await.unwrap(), 0);
        // Sealed with another key.
        let forged = seal(&self::key(), &State::default(), crate::task::unix_now_ms()).unwrap();
        let refused = exchange(&key, addr, forged).await;
        assert!(refused.is_err(), "{refused:?}");
        assert!(rx.try_recv().is_err());
        // A good one reaches the loop, whose answer comes back.
        let good = seal(&key, &State::default(), crate::task::unix_now_ms()).unwrap();
        let answering = tokio::spawn(async move {
            let exchange = rx.recv().await.unwrap();
            exchange
                .reply
                .send(Ok(State {
                    members: Vec::new(),
                    digests: vec![vec![9]],
                    want_digests: false,
                }))
                .unwrap();
        });
        let back = exchange(&key, addr, good).await.unwrap();
        answering.await.unwrap();
        assert_eq!(back.state.digests, vec![vec![9]]);
    }
}

//! Site digests on foca's custom broadcasts: decoded, checked and offered
//! to the site table; versioned, so a newer digest of a site replaces an
//! older one still being spread ([`DigestKey`]). The bytes of each site's
//! newest digest are kept as they arrived, so a state sync passes them on
//! unchanged ([`Latest`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use foca::{BroadcastHandler, Invalidates};
use starling_proto::site::MAX_DIGEST_BYTES;
use starling_proto::{DecodeError, SiteDigest};
use tokio::sync::broadcast;

use super::{GossipEvent, MemberId};
use crate::federation::identity::{open_digest, OpenDigestError, Trust};
use crate::federation::sites::SiteTable;

/// Why a received digest was dropped.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// Longer than a digest may be.
    #[error("site digest of {0} bytes exceeds {MAX_DIGEST_BYTES}")]
    Oversize(usize),
    /// Not a digest.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Not signed by the site it names, with a certificate this federation
    /// trusts (forged, another root's, expired, revoked).
    #[error(transparent)]
    Signature(#[from] OpenDigestError),
}

/// Identifies a digest in foca's dissemination backlog: a newer version of
/// the same site replaces an older one still being spread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestKey {
    site: String,
    version: u64,
}

impl Invalidates for DigestKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.site == other.site && self.version >= other.version
    }
}

/// Each site's newest digest as it arrived (bytes), by site.
pub(super) type Latest = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// Decodes digests off the wire into the site table. foca holds one; the
/// gossip loop a clone, for digests that arrive by state sync.
#[derive(Clone)]
pub(super) struct DigestHandler {
    pub(super) table: Arc<Mutex<SiteTable>>,
    pub(super) events: broadcast::Sender<GossipEvent>,
    pub(super) latest: Latest,
    /// Checks that each digest is signed by its site; `None` takes them
    /// unsigned (benchmark members without credentials).
    pub(super) trust: Option<Arc<Trust>>,
}

impl DigestHandler {
    /// The newest digest of every site known, as it arrived.
    pub(super) fn latest(&self) -> Vec<Vec<u8>> {
        lock(&self.latest).values().cloned().collect()
    }
}

impl BroadcastHandler<MemberId> for DigestHandler {
    type Key = DigestKey;
    type Error = DigestError;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&MemberId>,
    ) -> Result<Option<DigestKey>, DigestError> {
        let digest: SiteDigest = match &self.trust {
            Some(trust) => open_digest(trust, data, crate::task::unix_now_ms())?,
            None if data.len() > MAX_DIGEST_BYTES => return Err(DigestError::Oversize(data.len())),
            None => starling_proto::decode(data)?,
        };
        let key = DigestKey {
            site: digest.site.to_string(),
            version: digest.version,
        };
        let mut table = lock(&self.table);
        let own = digest.site.as_str() == table.own();
        let site = key.site.clone();
        let version = key.version;
        if !table.offer(digest, Instant::now()) {
            return Ok(None);
        }
        drop(table);
        lock(&self.latest).insert(site.clone(), data.to_vec());
        // Our own publication (no sender) is spread; an echo of an older one
        // of ours is not news to anyone.
        if sender.is_some() && !own {
            let _ = self.events.send(GossipEvent::Digest { site, version });
        }
        Ok((sender.is_none() || !own).then_some(key))
    }
}

pub(super) fn lock<T>(table: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every write is a single field update or insert: a panic mid-way leaves
    // the table consistent.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn digest(site: &str, version: u64) -> SiteDigest {
        super::super::tests::digest(site, version)
    }

    #[test]
    fn digests_that_do_not_decode_are_refused_and_stale_ones_not_spread() {
        let table = Arc::new(Mutex::new(SiteTable::new(
            "a",
            "127.0.0.1:1".parse().unwrap(),
            Instant::now(),
        )));
        let (events, _) = broadcast::channel(8);
        let mut handler = DigestHandler {
            table: table.clone(),
            events,
            latest: Latest::default(),
            trust: None,
        };
        let sender = MemberId {
            site: "b".into(),
            addr: "127.0.0.1:2".parse().unwrap(),
            bump: 1,
        };
        assert!(matches!(
            handler.receive_item(&[0u8; MAX_DIGEST_BYTES + 1], Some(&sender)),
            Err(DigestError::Oversize(_))
        ));
        assert!(matches!(
            handler.receive_item(b"\xa1\x61v\x01", Some(&sender)),
            Err(DigestError::Decode(_))
        ));
        let fresh = starling_proto::encode(&digest("b", 5)).unwrap();
        assert!(handler
            .receive_item(&fresh, Some(&sender))
            .unwrap()
            .is_some());
        // The same again, or older: not news, not spread further.
        assert!(handler
            .receive_item(&fresh, Some(&sender))
            .unwrap()
            .is_none());
        let stale = starling_proto::encode(&digest("b", 4)).unwrap();
        assert!(handler
            .receive_item(&stale, Some(&sender))
            .unwrap()
            .is_none());
        assert_eq!(lock(&table).entries(Instant::now()).len(), 2);
        // The newest is kept as it arrived, for state syncs.
        assert_eq!(handler.latest(), vec![fresh.clone()]);
        let newer = DigestKey {
            site: "b".into(),
            version: 6,
        };
        let older = DigestKey {
            site: "b".into(),
            version: 5,
        };
        assert!(newer.invalidates(&older) && !older.invalidates(&newer));
    }
}

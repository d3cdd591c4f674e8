//! Whether this coordinator leads its site, and under which term. A single
//! coordinator (SQLite) always leads and has no term; a replica on a shared
//! PostgreSQL leads only while it holds the site's lease
//! (`loops::lease`), under the lease's epoch. The scheduler, the outbox,
//! failure detection, attempt review and the federation forwarder act only
//! while [`Leadership::is_leader`]; the store fences their writes with
//! [`Leadership::fence`], and assignments carry the term to agents.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// This coordinator's standing in its site; cheap to clone and share.
#[derive(Debug, Clone, Default)]
pub struct Leadership {
    /// `None` for a single coordinator; for a replica, its current term
    /// (0 while it does not lead: terms start at 1).
    term: Option<Arc<AtomicU64>>,
}

/// What a leader-only write must check in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// A single coordinator: nothing to check.
    None,
    /// A replica that leads under this term: the lease must still hold it.
    Term(u64),
    /// A replica that does not lead: the write must not happen.
    NotLeader,
}

impl Leadership {
    /// A single coordinator: it leads, always, without a term.
    pub fn single() -> Self {
        Self { term: None }
    }

    /// A replica, not leading until [`Leadership::lead`].
    pub fn replica() -> Self {
        Self {
            term: Some(Arc::new(AtomicU64::new(0))),
        }
    }

    /// Whether this coordinator leads now.
    pub fn is_leader(&self) -> bool {
        match &self.term {
            None => true,
            Some(term) => term.load(Ordering::SeqCst) != 0,
        }
    }

    /// The term this replica leads under; `None` for a single coordinator or
    /// a replica that does not lead.
    pub fn term(&self) -> Option<u64> {
        let term = self.term.as_ref()?.load(Ordering::SeqCst);
        (term != 0).then_some(term)
    }

    /// Whether this coordinator is one of several replicas.
    pub fn is_replica(&self) -> bool {
        self.term.is_some()
    }

    /// What a leader-only write checks.
    pub fn fence(&self) -> Fence {
        match (&self.term, self.term()) {
            (None, _) => Fence::None,
            (Some(_), Some(term)) => Fence::Term(term),
            (Some(_), None) => Fence::NotLeader,
        }
    }

    /// Starts leading under `term` (a replica; ignored by a single one).
    pub fn lead(&self, term: u64) {
        if let Some(current) = &self.term {
            current.store(term, Ordering::SeqCst);
        }
    }

    /// Stops leading.
    pub fn step_down(&self) {
        if let Some(current) = &self.term {
            current.store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_coordinator_always_leads_without_a_term() {
        let single = Leadership::single();
        assert!(single.is_leader());
        assert_eq!(single.term(), None);
        assert_eq!(single.fence(), Fence::None);
        single.step_down();
        assert!(single.is_leader(), "nothing to step down from");
    }

    #[test]
    fn a_replica_leads_only_inside_its_term_and_every_clone_sees_it() {
        let replica = Leadership::replica();
        let seen_by_a_loop = replica.clone();
        assert!(!seen_by_a_loop.is_leader());
        assert_eq!(seen_by_a_loop.fence(), Fence::NotLeader);
        replica.lead(3);
        assert!(seen_by_a_loop.is_leader());
        assert_eq!(seen_by_a_loop.fence(), Fence::Term(3));
        replica.step_down();
        assert_eq!(seen_by_a_loop.term(), None);
        assert_eq!(seen_by_a_loop.fence(), Fence::NotLeader);
    }
}

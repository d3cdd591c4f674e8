//! The console's sign-in sessions: an in-memory table from a random 256-bit
//! session id (the cookie's value) to what the session may do. The API token
//! a user signed in with never leaves the server: the table keeps its sha256,
//! which the gate checks against the store on every request, so revoking the
//! token ends its sessions at their next request. The table is bounded and
//! forgets expired sessions; a restart forgets them all (users sign in again).
//!
//! A plain struct with the clock passed in, so its rules are tested without
//! a server.

use std::collections::HashMap;
use std::sync::Mutex;

use starling_api::Role;

use crate::access;

/// How long a session lives after sign-in, ms (12 hours: a working day).
pub(crate) const SESSION_TTL_MS: u64 = 12 * 3600 * 1000;

/// Most sessions held at once; signing in past it drops the session closest
/// to expiry, so a flood of sign-ins cannot grow memory without bound.
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// Most sessions one token holds at once (a person's browsers and devices):
/// past it, signing in with that token drops the token's own session
/// closest to expiry, so a flood of sign-ins with one token, a viewer's
/// say, never pushes out anyone else's session.
pub(crate) const MAX_SESSIONS_PER_TOKEN: usize = 32;

/// What a session was opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An API token (the bootstrap `--api-token` or a stored one), by its
    /// sha256 in hex: checked again on every request.
    Token {
        /// sha256 of the token, 64 hex digits.
        hash: String,
    },
    /// The coordinator enforces no token (`--api-token` unset): the console
    /// is open like the API, and the session only carries the CSRF token.
    Open,
}

/// One signed-in browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The role it had at sign-in (the gate uses the role the token has now).
    pub(crate) role: Role,
    /// What it was opened with.
    pub(crate) credential: Credential,
    /// The secret every POST form of this session carries (64 hex digits).
    pub(crate) csrf: String,
    /// When it ends, Unix ms.
    pub(crate) expires_ms: u64,
}

/// Random bytes could not be had for a session id or a CSRF token.
#[derive(Debug, thiserror::Error)]
#[error("no random bytes for a console session: {0}")]
pub(crate) struct NoRandomness(String);

/// A new session's id: what the cookie carries, and nothing else does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionId(pub(crate) String);

fn random_hex() -> Result<String, NoRandomness> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| NoRandomness(error.to_string()))?;
    Ok(hex::encode(bytes))
}

/// Drops the session closest to expiry among those `which` selects.
fn remove_oldest(table: &mut HashMap<String, Session>, which: impl Fn(&Session) -> bool) {
    if let Some(oldest) = table
        .iter()
        .filter(|(_, session)| which(session))
        .min_by_key(|(_, session)| session.expires_ms)
        .map(|(key, _)| key.clone())
    {
        table.remove(&oldest);
    }
}

/// The table. Keys are the sha256 of session ids, so a lookup's timing says
/// nothing about how close a guessed id came to a real one.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    table: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the lock leaves a consistent map (every
        // change is one insert or remove), so a poisoned lock is used as is.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a session; returns its id for the cookie.
    pub(crate) fn open(
        &self,
        role: Role,
        credential: Credential,
        now_ms: u64,
    ) -> Result<(SessionId, Session), NoRandomness> {
        let id = random_hex()?;
        let session = Session {
            role,
            credential,
            csrf: random_hex()?,
            expires_ms: now_ms.saturating_add(SESSION_TTL_MS),
        };
        let mut table = self.table();
        if table.len() >= MAX_SESSIONS {
            table.retain(|_, session| session.expires_ms > now_ms);
        }
        // The token's own sessions first (open mode has no token: there,
        // only the table's bound applies).
        if matches!(session.credential, Credential::Token { .. }) {
            let own = table
                .values()
                .filter(|held| held.credential == session.credential)
                .count();
            if own >= MAX_SESSIONS_PER_TOKEN {
                remove_oldest(&mut table, |held| held.credential == session.credential);
            }
        }
        if table.len() >= MAX_SESSIONS {
            remove_oldest(&mut table, |_| true);
        }
        table.insert(access::sha256_hex(&id), session.clone());
        Ok((SessionId(id), session))
    }

    /// The live session with this id, if any (an expired one is forgotten).
    pub(crate) fn get(&self, id: &str, now_ms: u64) -> Option<Session> {
        let key = access::sha256_hex(id);
        let mut table = self.table();
        match table.get(&key) {
            Some(session) if session.expires_ms > now_ms => Some(session.clone()),
            Some(_) => {
                table.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends a session (sign-out, or its token was revoked).
    pub(crate) fn close(&self, id: &str) {
        self.table().remove(&access::sha256_hex(id));
    }

    /// Ends every session opened with the token of this hash.
    pub(crate) fn close_token(&self, hash: &str) {
        self.table().retain(
            |_, session| !matches!(&session.credential, Credential::Token { hash: held } if held == hash),
        );
    }

    /// Sessions held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn token(hash: &str) -> Credential {
        Credential::Token {
            hash: hash.to_string(),
        }
    }

    #[test]
    fn a_session_is_found_by_its_id_until_it_expires() {
        let sessions = Sessions::default();
        let (id, opened) = sessions.open(Role::Viewer, token("h"), 1_000).unwrap();
        assert_eq!(id.0.len(), 64);
        assert_eq!(opened.csrf.len(), 64);
        assert_ne!(id.0, opened.csrf);
        assert_eq!(sessions.get(&id.0, 2_000), Some(opened.clone()));
        assert_eq!(sessions.get("not-an-id", 2_000), None);
        assert_eq!(sessions.get(&id.0, 1_000 + SESSION_TTL_MS), None);
        // Expired sessions are forgotten when met.
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn closing_ends_a_session_and_a_token_ends_all_of_its_own() {
        let sessions = Sessions::default();
        let (a, _) = sessions.open(Role::Admin, token("x"), 0).unwrap();
        let (b, _) = sessions.open(Role::Admin, token("x"), 0).unwrap();
        let (c, _) = sessions.open(Role::Viewer, token("y"), 0).unwrap();
        sessions.close(&a.0);
        assert!(sessions.get(&a.0, 1).is_none());
        assert!(sessions.get(&b.0, 1).is_some());
        sessions.close_token("x");
        assert!(sessions.get(&b.0, 1).is_none());
        assert!(sessions.get(&c.0, 1).is_some());
    }

    #[test]
    fn one_token_signing_in_again_and_again_pushes_out_only_its_own_sessions() {
        let sessions = Sessions::default();
        let (admin, _) = sessions.open(Role::Admin, token("admin"), 0).unwrap();
        let mut viewer = Vec::new();
        for i in 1..=10_000u64 {
            viewer.push(sessions.open(Role::Viewer, token("viewer"), i).unwrap().0);
        }
        assert!(
            sessions.get(&admin.0, 10_001).is_some(),
            "the admin kept its session"
        );
        assert_eq!(sessions.len(), 1 + MAX_SESSIONS_PER_TOKEN);
        // The viewer's newest sessions are the ones it keeps.
        let kept = viewer.len() - MAX_SESSIONS_PER_TOKEN;
        assert!(sessions.get(&viewer[kept - 1].0, 10_001).is_none());
        assert!(viewer[kept..]
            .iter()
            .all(|id| sessions.get(&id.0, 10_001).is_some()));
    }

    #[test]
    fn the_table_stays_bounded() {
        let sessions = Sessions::default();
        let mut first = None;
        for i in 0..=MAX_SESSIONS as u64 {
            let (id, _) = sessions.open(Role::Viewer, Credential::Open, i).unwrap();
            first.get_or_insert(id);
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        // The one closest to expiry made room.
        assert!(sessions.get(&first.unwrap().0, 10).is_none());
    }
}

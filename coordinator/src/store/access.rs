//! The store's half of access control: API tokens, join tokens and node
//! credentials (migration `0004_access.sql`). Only hashes go in; the secrets
//! themselves are made and shown by the callers in `http` and `access`.

use crate::store::{with_pool, Backend, Store, StoreError};
use starling_api::Role;

fn to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_db(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// An API token as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokenRecord {
    /// The token's id (for `starling api-token revoke`).
    pub id: String,
    /// Who or what it is for.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// When it was created, Unix milliseconds.
    pub created_ms: u64,
    /// When it was revoked, Unix milliseconds.
    pub revoked_ms: Option<u64>,
}

/// A node's stored credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCredentialRow {
    /// The node id (= MQTT user name).
    pub node_id: String,
    /// sha256 of its MQTT password, hex.
    pub password_sha256: String,
    /// Its Mosquitto `$7$` hash line.
    pub mosquitto_hash: String,
    /// When it enrolled, Unix milliseconds.
    pub created_ms: u64,
    /// When it was revoked, Unix milliseconds.
    pub revoked_ms: Option<u64>,
    /// The ed25519 public key its reports are signed with, 64 hex digits;
    /// `None` for a node enrolled before reports were signed.
    pub report_key: Option<String>,
}

/// What an enrollment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnrollOutcome {
    /// The credentials were stored and a use of the join token spent.
    Enrolled,
    /// The join token is unknown, expired or used up: nothing changed.
    BadToken,
    /// The node is enrolled and not revoked: nothing changed.
    AlreadyEnrolled,
}

/// Inserts or replaces a node's credentials, un-revoking them.
const UPSERT_CREDENTIALS: &str = "INSERT INTO node_credentials (node_id, password_sha256, mosquitto_hash, created_ms, revoked_ms, report_key) \
     VALUES ($1, $2, $3, $4, NULL, $5) \
     ON CONFLICT (node_id) DO UPDATE SET password_sha256 = excluded.password_sha256, \
     mosquitto_hash = excluded.mosquitto_hash, created_ms = excluded.created_ms, revoked_ms = NULL, \
     report_key = excluded.report_key";

/// A new key starts its counters afresh: the old key's marks go with it.
const FORGET_REPORT_MARKS: &str = "DELETE FROM report_marks WHERE node_id = $1";

type ApiTokenRow = (String, String, String, i64, Option<i64>);
type CredentialRow = (String, String, String, i64, Option<i64>, Option<String>);

/// A `node_credentials` row as the rest of the coordinator sees it.
fn credential_row(
    (node_id, password_sha256, mosquitto_hash, created_ms, revoked_ms, report_key): CredentialRow,
) -> NodeCredentialRow {
    NodeCredentialRow {
        node_id,
        password_sha256,
        mosquitto_hash,
        created_ms: from_db(created_ms),
        revoked_ms: revoked_ms.map(from_db),
        report_key,
    }
}

/// The credentials a node is stored with: the hashes of its MQTT password
/// and the public key its reports are signed with (64 hex digits).
#[derive(Debug, Clone, Copy)]
pub struct NewCredentials<'a> {
    /// sha256 of the MQTT password, hex.
    pub password_sha256: &'a str,
    /// The Mosquitto `$7$` hash line of the password.
    pub mosquitto_hash: &'a str,
    /// The node's report key.
    pub report_key: &'a str,
}

fn api_token_record(row: ApiTokenRow) -> Result<ApiTokenRecord, StoreError> {
    let (id, name, role, created_ms, revoked_ms) = row;
    Ok(ApiTokenRecord {
        id,
        name,
        role: role
            .parse()
            .map_err(|error: starling_api::UnknownRole| StoreError::Corrupt {
                column: "api_tokens.role",
                detail: error.to_string(),
            })?,
        created_ms: from_db(created_ms),
        revoked_ms: revoked_ms.map(from_db),
    })
}

impl Store {
    /// Stores a new API token by the sha256 of its secret.
    pub async fn insert_api_token(
        &self,
        id: &str,
        name: &str,
        role: Role,
        token_sha256: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO api_tokens (id, name, role, token_sha256, created_ms) VALUES ($1, $2, $3, $4, $5)";
        with_pool!(self, pool => sqlx::query(sql)
            .bind(id)
            .bind(name)
            .bind(role.as_str())
            .bind(token_sha256)
            .bind(to_db(now_ms))
            .execute(pool)
            .await
            .map(|_| ()))?;
        Ok(())
    }

    /// The live (not revoked) API token whose secret hashes to `token_sha256`.
    pub async fn api_token_by_hash(
        &self,
        token_sha256: &str,
    ) -> Result<Option<(ApiTokenRecord, String)>, StoreError> {
        let sql = "SELECT id, name, role, created_ms, revoked_ms, token_sha256 FROM api_tokens \
                   WHERE token_sha256 = $1 AND revoked_ms IS NULL";
        let row: Option<(String, String, String, i64, Option<i64>, String)> = with_pool!(self, pool => sqlx::query_as(sql).bind(token_sha256).fetch_optional(pool).await)?;
        row.map(|(id, name, role, created, revoked, hash)| {
            Ok((api_token_record((id, name, role, created, revoked))?, hash))
        })
        .transpose()
    }

    /// Every API token, oldest first.
    pub async fn api_tokens(&self) -> Result<Vec<ApiTokenRecord>, StoreError> {
        let sql =
            "SELECT id, name, role, created_ms, revoked_ms FROM api_tokens ORDER BY created_ms, id";
        let rows: Vec<ApiTokenRow> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        rows.into_iter().map(api_token_record).collect()
    }

    /// Revokes an API token; false when no live token has this id.
    pub async fn revoke_api_token(&self, id: &str, now_ms: u64) -> Result<bool, StoreError> {
        let sql = "UPDATE api_tokens SET revoked_ms = $2 WHERE id = $1 AND revoked_ms IS NULL";
        let done = with_pool!(self, pool => sqlx::query(sql).bind(id).bind(to_db(now_ms)).execute(pool).await.map(|done| done.rows_affected()))?;
        Ok(done == 1)
    }

    /// Stores a join token by the sha256 of its secret.
    pub async fn insert_join_token(
        &self,
        id: &str,
        token_sha256: &str,
        uses: u32,
        expires_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO join_tokens (id, token_sha256, created_ms, expires_ms, uses_left) \
                   VALUES ($1, $2, $3, $4, $5)";
        with_pool!(self, pool => sqlx::query(sql)
            .bind(id)
            .bind(token_sha256)
            .bind(to_db(now_ms))
            .bind(to_db(expires_ms))
            .bind(i64::from(uses))
            .execute(pool)
            .await
            .map(|_| ()))?;
        Ok(())
    }

    /// Enrolls `node_id` with a join token, in one transaction: the token's
    /// use is spent and the credentials stored, or nothing changes.
    pub async fn enroll_node(
        &self,
        join_token_sha256: &str,
        node_id: &str,
        credentials: NewCredentials<'_>,
        now_ms: u64,
    ) -> Result<EnrollOutcome, StoreError> {
        // The spend comes first: it is the write that takes SQLite's lock.
        let spend = "UPDATE join_tokens SET uses_left = uses_left - 1 \
                     WHERE token_sha256 = $1 AND uses_left > 0 AND expires_ms > $2";
        let enrolled =
            "SELECT node_id FROM node_credentials WHERE node_id = $1 AND revoked_ms IS NULL";
        let outcome = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let spent = sqlx::query(spend)
                .bind(join_token_sha256)
                .bind(to_db(now_ms))
                .execute(&mut *tx)
                .await?;
            if spent.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(EnrollOutcome::BadToken);
            }
            let existing: Option<(String,)> =
                sqlx::query_as(enrolled).bind(node_id).fetch_optional(&mut *tx).await?;
            if existing.is_some() {
                tx.rollback().await?;
                return Ok(EnrollOutcome::AlreadyEnrolled);
            }
            sqlx::query(UPSERT_CREDENTIALS)
                .bind(node_id)
                .bind(credentials.password_sha256)
                .bind(credentials.mosquitto_hash)
                .bind(to_db(now_ms))
                .bind(credentials.report_key)
                .execute(&mut *tx)
                .await?;
            sqlx::query(FORGET_REPORT_MARKS).bind(node_id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok::<EnrollOutcome, sqlx::Error>(EnrollOutcome::Enrolled)
        })?;
        Ok(outcome)
    }

    /// Stores (or replaces, un-revoking) a node's credentials without a join
    /// token: for the coordinator's own local agent (`starling up`).
    pub async fn set_node_credentials(
        &self,
        node_id: &str,
        credentials: NewCredentials<'_>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query(UPSERT_CREDENTIALS)
                .bind(node_id)
                .bind(credentials.password_sha256)
                .bind(credentials.mosquitto_hash)
                .bind(to_db(now_ms))
                .bind(credentials.report_key)
                .execute(&mut *tx)
                .await?;
            sqlx::query(FORGET_REPORT_MARKS).bind(node_id).execute(&mut *tx).await?;
            tx.commit().await
        })?;
        Ok(())
    }

    /// Revokes a node's credentials; false when it has none that are live.
    pub async fn revoke_node_credentials(
        &self,
        node_id: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql =
            "UPDATE node_credentials SET revoked_ms = $2 WHERE node_id = $1 AND revoked_ms IS NULL";
        let done = with_pool!(self, pool => sqlx::query(sql).bind(node_id).bind(to_db(now_ms)).execute(pool).await.map(|done| done.rows_affected()))?;
        Ok(done == 1)
    }

    /// One node's credentials, revoked or not; `None` when it never enrolled.
    pub async fn node_credential(
        &self,
        node_id: &str,
    ) -> Result<Option<NodeCredentialRow>, StoreError> {
        let sql =
            "SELECT node_id, password_sha256, mosquitto_hash, created_ms, revoked_ms, report_key \
                   FROM node_credentials WHERE node_id = $1";
        let row: Option<CredentialRow> =
            with_pool!(self, pool => sqlx::query_as(sql).bind(node_id).fetch_optional(pool).await)?;
        Ok(row.map(credential_row))
    }

    /// Every node's credentials, revoked ones included, by node id.
    pub async fn node_credentials(&self) -> Result<Vec<NodeCredentialRow>, StoreError> {
        let sql =
            "SELECT node_id, password_sha256, mosquitto_hash, created_ms, revoked_ms, report_key \
                   FROM node_credentials ORDER BY node_id";
        let rows: Vec<CredentialRow> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        Ok(rows.into_iter().map(credential_row).collect())
    }

    /// Every node's highest accepted report counter per report channel:
    /// `(node id, channel, counter)`.
    pub async fn report_marks(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let sql = "SELECT node_id, channel, counter FROM report_marks";
        let rows: Vec<(String, String, i64)> =
            with_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(node, channel, counter)| (node, channel, from_db(counter)))
            .collect())
    }

    /// Raises a node's report mark on `channel` to `counter` (never lowers it).
    pub async fn raise_report_mark(
        &self,
        node_id: &str,
        channel: &str,
        counter: u64,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO report_marks (node_id, channel, counter) VALUES ($1, $2, $3) \
                   ON CONFLICT (node_id, channel) DO UPDATE SET counter = excluded.counter \
                   WHERE excluded.counter > report_marks.counter";
        with_pool!(self, pool => sqlx::query(sql).bind(node_id).bind(channel).bind(to_db(counter)).execute(pool).await.map(|_| ()))?;
        Ok(())
    }
}

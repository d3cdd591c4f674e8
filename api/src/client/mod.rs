//! A small typed client of the coordinator's REST API, used by the `starling`
//! CLI (and usable by tests and tools). Refusals come back as
//! [`ClientError::Api`] with the [`ErrorCode`] as a type.

use reqwest::StatusCode;
use serde::de::DeserializeOwned;

mod stream;

pub use stream::{EventFilter, EventStream, StreamMessage};

use crate::{
    ApiError, ApiTokenCreated, ApiTokenList, ArtifactSignature, ArtifactStored, BatchSubmitted,
    CreateApiToken, CreateJoinToken, EnrollRequest, ErrorCode, Health, Identity, JoinTokenCreated,
    NodeCredentials, NodeDetail, NodeList, NodeRevoked, SiteList, SubmitTask, TaskDetail, TaskList,
};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator could not be reached at all.
    #[error("cannot reach the coordinator at {url}: {detail}; start it (starling-coordinator serve) or pass --coordinator URL / STARLING_URL")]
    Unreachable {
        /// The base URL.
        url: String,
        /// What went wrong.
        detail: String,
    },
    /// The coordinator answered with an error.
    #[error("{message} ({status}, {label})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error code, as a type; [`ErrorCode::Unknown`] for a code this
        /// client does not know or an answer that is not the API's JSON.
        code: ErrorCode,
        /// The code as the answer wrote it, or the status's reason phrase
        /// when the body was not the API's JSON (a proxy's page).
        label: String,
        /// The coordinator's message.
        message: String,
    },
    /// An id cannot name a resource in a URL path.
    #[error("{kind} {id:?} cannot be named in a URL: it is empty, \".\" or \"..\"")]
    InvalidId {
        /// Which id (`node id`, `task id`, ...).
        kind: &'static str,
        /// The id as given.
        id: String,
    },
    /// The answer was not what this client expects.
    #[error("unexpected answer from the coordinator at {url}: {detail}")]
    Protocol {
        /// The URL called.
        url: String,
        /// What was wrong.
        detail: String,
    },
}

/// A REST client bound to one coordinator.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

fn describe(error: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if text.contains("certificate") {
        text.push_str(
            " (for an https:// coordinator, trust its CA with --ca-file / STARLING_CA_FILE)",
        );
    }
    text
}

/// A response's whole body.
async fn read_body(response: reqwest::Response, url: &str) -> Result<Vec<u8>, ClientError> {
    response
        .bytes()
        .await
        .map(|body| body.to_vec())
        .map_err(|error| ClientError::Protocol {
            url: url.to_string(),
            detail: describe(&error),
        })
}

impl Client {
    /// A client of the coordinator at `base` (`http://host:port`), sending
    /// `token` as a bearer token when given.
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|token| !token.is_empty()),
            http: reqwest::Client::new(),
        }
    }

    /// A client that trusts `ca_file` (or the system roots without one) for
    /// an `https://` coordinator.
    pub fn with_ca_file(
        base: &str,
        token: Option<String>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client, ClientError> {
        let unusable = |detail: String| ClientError::Unreachable {
            url: base.to_string(),
            detail,
        };
        let http = starling_net::tls::http_client(ca_file)
            .map_err(|e| unusable(e.to_string()))?
            .build()
            .map_err(|e| unusable(describe(&e)))?;
        Ok(Client {
            http,
            ..Client::new(base, token)
        })
    }

    /// The coordinator's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    /// The URL of `{prefix}/{id}{suffix}` with `id` as one path segment.
    fn id_url(
        &self,
        prefix: &str,
        kind: &'static str,
        id: &str,
        suffix: &str,
    ) -> Result<String, ClientError> {
        Ok(self.url(&format!("{prefix}/{}{suffix}", path_segment(kind, id)?)))
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<T, ClientError> {
        let response = self.respond(request, url).await?;
        let body = read_body(response, url).await?;
        serde_json::from_slice(&body).map_err(|error| ClientError::Protocol {
            url: url.to_string(),
            detail: error.to_string(),
        })
    }

    /// Sends a request with the token; a refusal comes back as
    /// [`ClientError::Api`], a success as the response with its body unread.
    async fn respond(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, ClientError> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.map_err(|error| {
            if error.is_connect() || error.is_timeout() || error.is_request() {
                ClientError::Unreachable {
                    url: self.base.clone(),
                    detail: describe(&error),
                }
            } else {
                ClientError::Protocol {
                    url: url.to_string(),
                    detail: describe(&error),
                }
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = read_body(response, url).await?;
        Err(match serde_json::from_slice::<ApiError>(&body) {
            Ok(error) => ClientError::Api {
                status: status.as_u16(),
                code: error.error,
                label: wire_code(&body).unwrap_or_else(|| error.error.to_string()),
                message: error.message,
            },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                code: ErrorCode::Unknown,
                label: status
                    .canonical_reason()
                    .unwrap_or("error")
                    .to_ascii_lowercase(),
                message: String::from_utf8_lossy(&body).trim().to_string(),
            },
        })
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        let url = self.url("/health");
        self.send(self.http.get(&url), &url).await
    }

    /// `GET /nodes`.
    pub async fn nodes(&self) -> Result<NodeList, ClientError> {
        let url = self.url("/nodes");
        self.send(self.http.get(&url), &url).await
    }

    /// `GET /sites`.
    pub async fn sites(&self) -> Result<SiteList, ClientError> {
        let url = self.url("/sites");
        self.send(self.http.get(&url), &url).await
    }

    /// `GET /nodes/{id}`.
    pub async fn node(&self, id: &str) -> Result<NodeDetail, ClientError> {
        let url = self.id_url("/nodes", "node id", id, "")?;
        self.send(self.http.get(&url), &url).await
    }

    /// `POST /artifacts` with a module's bytes.
    pub async fn publish(&self, artifact: Vec<u8>) -> Result<ArtifactStored, ClientError> {
        let url = self.url("/artifacts");
        let media_type = if starling_opencl::Package::looks_like(&artifact) {
            starling_opencl::package::MEDIA_TYPE
        } else {
            "application/wasm"
        };
        let request = self
            .http
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, media_type)
            .body(artifact);
        self.send(request, &url).await
    }

    /// `POST /tasks`.
    pub async fn submit(&self, task: &SubmitTask) -> Result<TaskDetail, ClientError> {
        let url = self.url("/tasks");
        self.send(self.http.post(&url).json(task), &url).await
    }

    /// `POST /tasks:batch` ([`crate::SubmitBatch`]): at most [`crate::MAX_BATCH_TASKS`] tasks, all
    /// created or, when one is refused, none (the refusal's message names
    /// the item: [`crate::batch_item_index`]).
    pub async fn submit_batch(&self, tasks: &[SubmitTask]) -> Result<BatchSubmitted, ClientError> {
        /// [`SubmitBatch`] over borrowed tasks, so they are not copied to be sent.
        #[derive(serde::Serialize)]
        struct Batch<'a> {
            tasks: &'a [SubmitTask],
        }
        let url = self.url("/tasks:batch");
        self.send(self.http.post(&url).json(&Batch { tasks }), &url)
            .await
    }

    /// `GET /tasks`, optionally filtered by state.
    pub async fn tasks(&self, state: Option<&str>, limit: u32) -> Result<TaskList, ClientError> {
        let url = self.url("/tasks");
        let mut query = vec![("limit", limit.to_string())];
        if let Some(state) = state {
            query.push(("state", state.to_string()));
        }
        self.send(self.http.get(&url).query(&query), &url).await
    }

    /// `GET /tasks/{id}`.
    pub async fn task(&self, id: &str) -> Result<TaskDetail, ClientError> {
        let url = self.id_url("/tasks", "task id", id, "")?;
        self.send(self.http.get(&url), &url).await
    }

    /// `GET /tasks/{id}?wait=…`: a long poll that answers once the task has
    /// ended, or after `wait` (at most 60 s) with the task as it stands.
    pub async fn task_wait(
        &self,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<TaskDetail, ClientError> {
        let url = self.id_url("/tasks", "task id", id, "")?;
        let wait = format!("{}ms", wait.as_millis());
        self.send(self.http.get(&url).query(&[("wait", wait)]), &url)
            .await
    }

    /// `GET /events`: the live event stream, filtered, resuming after
    /// `resume` (an id the stream gave) when given.
    pub async fn events(
        &self,
        filter: &EventFilter,
        resume: Option<&str>,
    ) -> Result<EventStream, ClientError> {
        let url = self.url("/events");
        let mut query = Vec::new();
        if let Some(task) = &filter.task {
            query.push(("task", task.clone()));
        }
        if let Some(node) = &filter.node {
            query.push(("node", node.clone()));
        }
        if !filter.kinds.is_empty() {
            let kinds: Vec<&str> = filter.kinds.iter().map(|kind| kind.as_str()).collect();
            query.push(("kind", kinds.join(",")));
        }
        let mut request = self
            .http
            .get(&url)
            .query(&query)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(resume) = resume {
            request = request.header("Last-Event-ID", resume);
        }
        let response = self.respond(request, &url).await?;
        Ok(EventStream::new(response, url))
    }

    /// `POST /tasks/{id}/cancel`.
    pub async fn cancel(&self, id: &str) -> Result<TaskDetail, ClientError> {
        let url = self.id_url("/tasks", "task id", id, "/cancel")?;
        self.send(self.http.post(&url), &url).await
    }

    /// `GET /identity`: the coordinator's public key and protocol version.
    pub async fn identity(&self) -> Result<Identity, ClientError> {
        let url = self.url("/identity");
        self.send(self.http.get(&url), &url).await
    }

    /// `POST /enroll`: a node's credentials for a join token.
    pub async fn enroll(&self, request: &EnrollRequest) -> Result<NodeCredentials, ClientError> {
        let url = self.url("/enroll");
        self.send(self.http.post(&url).json(request), &url).await
    }

    /// `POST /join-tokens`.
    pub async fn create_join_token(
        &self,
        request: &CreateJoinToken,
    ) -> Result<JoinTokenCreated, ClientError> {
        let url = self.url("/join-tokens");
        self.send(self.http.post(&url).json(request), &url).await
    }

    /// `POST /artifacts/{digest}/signature`.
    pub async fn sign_artifact(
        &self,
        digest: &str,
        signature: &ArtifactSignature,
    ) -> Result<ArtifactSignature, ClientError> {
        let url = self.id_url("/artifacts", "artifact digest", digest, "/signature")?;
        self.send(self.http.post(&url).json(signature), &url).await
    }

    /// `POST /nodes/{id}/revoke`.
    pub async fn revoke_node(&self, id: &str) -> Result<NodeRevoked, ClientError> {
        let url = self.id_url("/nodes", "node id", id, "/revoke")?;
        self.send(self.http.post(&url), &url).await
    }

    /// `POST /api-tokens`.
    pub async fn create_api_token(
        &self,
        request: &CreateApiToken,
    ) -> Result<ApiTokenCreated, ClientError> {
        let url = self.url("/api-tokens");
        self.send(self.http.post(&url).json(request), &url).await
    }

    /// `GET /api-tokens`.
    pub async fn api_tokens(&self) -> Result<ApiTokenList, ClientError> {
        let url = self.url("/api-tokens");
        self.send(self.http.get(&url), &url).await
    }

    /// `POST /api-tokens/{id}/revoke`.
    pub async fn revoke_api_token(&self, id: &str) -> Result<ApiTokenList, ClientError> {
        let url = self.id_url("/api-tokens", "API token id", id, "/revoke")?;
        self.send(self.http.post(&url), &url).await
    }
}

/// `id` as one URL path segment: every byte but ASCII letters, digits, `-`,
/// `_`, `.` and `~` (RFC 3986's unreserved set) percent-encoded, so an id
/// holding `/`, `?`, `#` or `%` still names one resource. Empty, `.` and
/// `..` are refused: URL parsers remove dot segments, percent-encoded ones
/// too (`%2E%2E`), so the request would reach another resource.
fn path_segment(kind: &'static str, id: &str) -> Result<String, ClientError> {
    if matches!(id, "" | "." | "..") {
        return Err(ClientError::InvalidId {
            kind,
            id: id.to_string(),
        });
    }
    let mut segment = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(segment)
}

/// The `error` field of an error body exactly as sent, so a code newer than
/// this client is still shown by name.
fn wire_code(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Code {
        error: String,
    }
    serde_json::from_slice::<Code>(body)
        .ok()
        .map(|code| code.error)
}

impl ClientError {
    /// The error code of an API error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => StatusCode::from_u16(*status).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        let client = Client::new("http://127.0.0.1:1/", None);
        for (id, encoded) in [
            ("pi-1_a", "pi-1_a"),
            ("a/b", "a%2Fb"),
            ("a?b#c", "a%3Fb%23c"),
            ("100%", "100%25"),
            ("site:plant-b", "site%3Aplant-b"),
            ("v1.2", "v1.2"),
            ("é", "%C3%A9"),
        ] {
            let url = client.id_url("/nodes", "node id", id, "/revoke").unwrap();
            assert_eq!(
                url,
                format!("http://127.0.0.1:1/api/v1/nodes/{encoded}/revoke")
            );
            let parsed = reqwest::Url::parse(&url).unwrap();
            let segments: Vec<&str> = parsed.path_segments().unwrap().collect();
            assert_eq!(segments, ["api", "v1", "nodes", encoded, "revoke"], "{id}");
        }
    }

    #[test]
    fn dot_segments_and_empty_ids_are_refused() {
        let client = Client::new("http://127.0.0.1:1", None);
        for id in ["", ".", ".."] {
            let error = client.id_url("/tasks", "task id", id, "").unwrap_err();
            assert!(
                matches!(&error, ClientError::InvalidId { kind: "task id", id: given } if given == id),
                "{error}"
            );
        }
    }
}

//! The live event stream (`GET /api/v1/events`, Server-Sent Events) and the
//! wait of a long poll on one task: both read the coordinator's live feed.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use starling_api::{ErrorCode, EventKind, StreamPosition};
use std::sync::Arc;

use crate::http::error::HttpError;
use crate::http::Shared;
use crate::live::{Delivery, Filter};

/// How often an idle stream sends a comment, so proxies and clients see
/// the connection is alive.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The stream's filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct EventsQuery {
    /// Only events of this task.
    task: Option<String>,
    /// Only events of this node (its changes, its telemetry, and task changes
    /// of attempts on it).
    node: Option<String>,
    /// Only these kinds, comma-separated: task, node, telemetry, site.
    kind: Option<String>,
}

/// Parses `kind=task,node`.
fn kinds(text: &str) -> Result<Vec<EventKind>, HttpError> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<EventKind>()
                .map_err(|error| HttpError::new(ErrorCode::InvalidQuery, error.to_string()))
        })
        .collect()
}

/// The position a client resumes from (`Last-Event-ID`), if it sent one.
fn resume_position(headers: &HeaderMap) -> Result<Option<StreamPosition>, HttpError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        HttpError::new(
            ErrorCode::InvalidQuery,
            "Last-Event-ID must be an id: the stream gave, like 18c0f3a2-42",
        )
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    text.parse::<StreamPosition>()
        .map(Some)
        .map_err(|error| HttpError::new(ErrorCode::InvalidQuery, error.to_string()))
}

/// One delivery as an SSE event.
fn sse_event(delivery: Delivery) -> Event {
    match delivery {
        Delivery::Event(stamped) => Event::default()
            .event(stamped.event.kind().as_str())
            .id(stamped.position.to_string())
            .data(stamped.json.as_str()),
        Delivery::Reset(reset) => Event::default()
            .event("reset")
            .data(serde_json::to_string(&reset).unwrap_or_else(|_| "{}".to_owned())),
    }
}

/// Streams live events: task state changes, node changes, telemetry samples
/// (at most one a second per node) and site changes.
///
/// Each event's `id` is a position to send back in `Last-Event-ID` to resume
/// after a disconnect; a `reset` event says events were lost (the position is
/// not held any more, or the client read too slowly) and the client should
/// re-read current state. An idle stream sends a keep-alive comment every 15 s.
#[utoipa::path(
    get,
    path = "/api/v1/events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")
    ),
    responses(
        (status = 200, description = "A stream of events (text/event-stream); each `data` is a LiveEvent", content_type = "text/event-stream", body = starling_api::LiveEvent),
        (status = 400, description = "An unknown kind, or a malformed Last-Event-ID", body = starling_api::ApiError),
        (status = 401, description = "Missing or unknown token", body = starling_api::ApiError)
    )
)]
pub(crate) async fn events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, HttpError> {
    let Query(query) = query
        .map_err(|rejection| HttpError::new(ErrorCode::InvalidQuery, rejection.body_text()))?;
    let filter = Filter {
        kinds: query.kind.as_deref().map(kinds).transpose()?,
        task: query.task,
        node: query.node,
    };
    let resume = resume_position(&headers)?;
    let subscription = shared.feed.subscribe(filter, resume);
    let state = (subscription, shared, headers, std::time::Instant::now());
    let stream = futures_util::stream::unfold(
        state,
        |(mut subscription, shared, headers, mut checked)| async move {
            loop {
                let delivery = tokio::time::timeout(RECHECK, subscription.next()).await;
                if checked.elapsed() >= RECHECK {
                    checked = std::time::Instant::now();
                    if !still_allowed(&shared, &headers).await {
                        // Revoked (or signed out): the stream ends, and the
                        // client's reconnect meets the 401.
                        return None;
                    }
                }
                match delivery {
                    Err(_) => continue,
                    Ok(delivery) => {
                        return Some((
                            Ok(sse_event(delivery?)),
                            (subscription, shared, headers, checked),
                        ))
                    }
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// How often an open stream checks that its caller's token (or console
/// session) still stands, so a revoked token's stream ends within this.
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

/// Whether the caller of a stream may still read it: its bearer token, or
/// else its console session, still gives a role that reads events. Always
/// on an open coordinator (no `--api-token`).
async fn still_allowed(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(bootstrap) = shared.api_token.as_deref() else {
        return true;
    };
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let role = match bearer {
        Some(token) => crate::http::auth::caller_role(shared, bootstrap, Some(token)).await,
        None => crate::http::auth::session_caller(shared, headers)
            .await
            .map(|caller| caller.map(|caller| caller.role)),
    };
    matches!(role, Ok(Some(role)) if role.allows(starling_api::Role::Viewer))
}

/// Waits until task `id` has ended or `wait` has passed, whichever is
/// first; then the caller reads the task as it stands. Only a change to an
/// ended state (or lost events) ends the wait early, so a task that runs
/// costs one read at its end rather than one per state.
pub(crate) async fn wait_for_end(shared: &Shared, id: &str, wait: Duration) {
    let filter = Filter {
        kinds: Some(vec![EventKind::Task]),
        task: Some(id.to_owned()),
        node: None,
    };
    let mut subscription = shared.feed.subscribe(filter, None);
    // Subscribed before this read, so an end recorded in between is seen.
    match shared.tasks().record(id).await {
        Ok(Some(task)) if !task.status.is_terminal() => {}
        _ => return,
    }
    let ended = async {
        while let Some(delivery) = subscription.next().await {
            match delivery {
                Delivery::Event(stamped) => match &stamped.event {
                    starling_api::LiveEvent::Task(change) if change.status.is_terminal() => return,
                    _ => {}
                },
                Delivery::Reset(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(wait, ended).await;
}

/// The longest a long poll waits.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// Parses `wait=30s` (at most [`MAX_WAIT`]).
pub(crate) fn parse_wait(text: &str) -> Result<Duration, HttpError> {
    let wait = starling_net::units::parse_duration(text).map_err(|error| {
        HttpError::new(
            ErrorCode::InvalidQuery,
            format!("wait={text:?}: {error}; give a duration like 30s or 500ms (at most 60s)"),
        )
    })?;
    Ok(wait.min(MAX_WAIT))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_refuse_unknown_names() {
        assert_eq!(
            kinds("task, node").unwrap(),
            vec![EventKind::Task, EventKind::Node]
        );
        assert!(kinds("task,bogus").is_err());
        assert_eq!(kinds("").unwrap(), vec![]);
    }

    #[test]
    fn waits_are_capped() {
        assert_eq!(parse_wait("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_wait("10m").unwrap(), MAX_WAIT);
        assert!(parse_wait("soon").is_err());
    }

    #[test]
    fn last_event_id_must_be_a_position() {
        let mut headers = HeaderMap::new();
        assert_eq!(resume_position(&headers).unwrap(), None);
        headers.insert("last-event-id", "1f-3".parse().unwrap());
        assert_eq!(
            resume_position(&headers).unwrap(),
            Some(StreamPosition { boot: 0x1f, seq: 3 })
        );
        headers.insert("last-event-id", "yesterday".parse().unwrap());
        assert!(resume_position(&headers).is_err());
    }
}

//! The client side of the live event stream: `GET /api/v1/events` read as
//! Server-Sent Events (parsed by `eventsource-stream`) into typed messages.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};

use super::ClientError;
use crate::events::{EventKind, LiveEvent, StreamReset};

/// Which events to ask for; empty parts ask for everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only events of this task.
    pub task: Option<String>,
    /// Only events of this node.
    pub node: Option<String>,
    /// Only these kinds; empty for all.
    pub kinds: Vec<EventKind>,
}

/// One message of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamMessage {
    /// An event, with the id to resume after it.
    Event {
        /// Its id (send it back as `Last-Event-ID` to resume after it).
        id: String,
        /// The event.
        event: LiveEvent,
    },
    /// Events were lost to this client; re-read state and subscribe again.
    Reset(StreamReset),
}

type Events = Pin<
    Box<
        dyn Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// An open event stream.
pub struct EventStream {
    events: Events,
    url: String,
    last_id: Option<String>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("url", &self.url)
            .field("last_id", &self.last_id)
            .finish_non_exhaustive()
    }
}

impl EventStream {
    pub(crate) fn new(response: reqwest::Response, url: String) -> EventStream {
        use eventsource_stream::Eventsource as _;
        EventStream {
            events: Box::pin(response.bytes_stream().eventsource()),
            url,
            last_id: None,
        }
    }

    /// The id of the last event received: where to resume after a
    /// disconnect.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// The next message; `None` when the coordinator ended the stream.
    /// Kinds this client does not know (from a newer coordinator) are
    /// skipped.
    pub async fn next(&mut self) -> Option<Result<StreamMessage, ClientError>> {
        loop {
            let event = match self.events.next().await? {
                Ok(event) => event,
                Err(error) => {
                    return Some(Err(ClientError::Protocol {
                        url: self.url.clone(),
                        detail: format!("the event stream broke: {error}"),
                    }))
                }
            };
            let malformed = |error: serde_json::Error| ClientError::Protocol {
                url: self.url.clone(),
                detail: format!("a {} event that is not valid JSON: {error}", event.event),
            };
            if event.event == "reset" {
                return Some(
                    serde_json::from_str::<StreamReset>(&event.data)
                        .map(StreamMessage::Reset)
                        .map_err(malformed),
                );
            }
            if event.event.parse::<EventKind>().is_err() {
                continue;
            }
            if !event.id.is_empty() {
                self.last_id = Some(event.id.clone());
            }
            return Some(
                serde_json::from_str::<LiveEvent>(&event.data)
                    .map(|live| StreamMessage::Event {
                        id: event.id.clone(),
                        event: live,
                    })
                    .map_err(malformed),
            );
        }
    }
}

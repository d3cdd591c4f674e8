//! `GET /console/events`: the live feed as HTML fragments for htmx's SSE
//! extension. Each page opens one stream naming what it shows (`view=` and
//! the page's filters); the stream subscribes to the same feed as
//! `GET /api/v1/events` and sends, per change, the fragment to swap in:
//! `n-HEX` a fleet row's cells, `t-HEX` a task row's (HEX: the id in hex),
//! `node-live` / `task-live` a detail page's live section, and
//! `fleet-rows` / `task-rows` a list's whole table body when rows come or
//! go. The session is checked again every few
//! seconds, so a revoked token's stream ends.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use starling_api::{EventKind, LiveEvent, NodeChangeKind, Role, TaskDetail};

use super::fragments::{node_cells, node_event, task_cells, task_event};
use super::layout::{Caller, ConsoleError};
use super::pages::fleet::{fleet_page, pager, rows as fleet_rows, summary, FleetQuery};
use super::pages::node::{live_section as node_live, node_view};
use super::pages::task::live_section as task_live;
use super::pages::tasks::{rows as task_rows, task_page, TaskQuery};
use crate::http::auth::session_caller;
use crate::http::error::HttpError;
use crate::http::views::task_summary;
use crate::http::Shared;
use crate::live::{Delivery, Filter, Subscription};
use crate::task::unix_now_ms;

/// How often a stream checks that its session (and token) still lives.
const RECHECK: Duration = Duration::from_secs(5);

/// Least time between two table reloads one stream asks for.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Which page the stream serves.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ViewQuery {
    view: Option<String>,
    id: Option<String>,
}

/// What a stream watches, and what it knows of the page it feeds.
enum Watch {
    /// The fleet page: the node ids it shows.
    Fleet {
        query: FleetQuery,
        shown: HashSet<String>,
    },
    /// The task list: the task ids it shows.
    Tasks {
        query: TaskQuery,
        shown: HashSet<String>,
    },
    /// One task's page.
    Task { id: String },
    /// One node's page.
    Node { id: String },
}

impl Watch {
    fn filter(&self) -> Filter {
        let (kinds, task, node) = match self {
            Watch::Fleet { .. } => (vec![EventKind::Node, EventKind::Telemetry], None, None),
            Watch::Tasks { .. } => (vec![EventKind::Task], None, None),
            Watch::Task { id } => (vec![EventKind::Task], Some(id.clone()), None),
            Watch::Node { id } => (
                vec![EventKind::Node, EventKind::Telemetry],
                None,
                Some(id.clone()),
            ),
        };
        Filter {
            kinds: Some(kinds),
            task,
            node,
        }
    }
}

/// One open stream.
struct Stream {
    shared: Arc<Shared>,
    caller: Caller,
    headers: HeaderMap,
    watch: Watch,
    subscription: Subscription,
    out: VecDeque<Event>,
    checked: Instant,
    last_reload: Option<Instant>,
    reload_due: bool,
    /// The feed position of the newest event this stream has taken in (or
    /// of its subscription): what it reads must reflect at least that.
    seen: u64,
}

fn fragment(name: &str, markup: maud::Markup) -> Event {
    Event::default().event(name).data(markup.into_string())
}

impl Stream {
    /// Sends a table reload now, or once [`RELOAD_INTERVAL`] has passed.
    async fn reload(&mut self) -> Result<(), ConsoleError> {
        if self
            .last_reload
            .is_some_and(|last| last.elapsed() < RELOAD_INTERVAL)
        {
            self.reload_due = true;
            return Ok(());
        }
        self.reload_due = false;
        self.last_reload = Some(Instant::now());
        match &mut self.watch {
            // The table's rows are sent whole, in the stream: row events
            // that follow apply to them, in order (a page reloading its
            // table by a request of its own could miss the events sent
            // while that request was under way).
            Watch::Fleet { query, shown } => {
                let page = fleet_page(&self.shared, query);
                let now: HashSet<String> = page.rows.iter().map(|row| row.id.clone()).collect();
                if now != *shown {
                    *shown = now;
                    let rows = fleet_rows(&page, &self.caller, unix_now_ms());
                    self.out.push_back(fragment("fleet-rows", rows));
                    self.out
                        .push_back(fragment("fleet-summary", summary(&page)));
                    self.out
                        .push_back(fragment("fleet-pager", pager(&page, query)));
                }
            }
            Watch::Tasks { query, shown } => {
                let (tasks, _) = task_page(&self.shared, query, Some(self.seen)).await?;
                *shown = tasks.iter().map(|task| task.id.clone()).collect();
                self.out
                    .push_back(fragment("task-rows", task_rows(&tasks, unix_now_ms())));
            }
            Watch::Task { id } => {
                let shared = &self.shared;
                let read = shared
                    .console
                    .reads
                    .task_details
                    .get(
                        id,
                        self.seen,
                        || shared.feed.latest_seq(),
                        || async {
                            shared
                                .tasks()
                                .detail(id)
                                .await
                                .map(TaskDetail::from)
                                .map_err(HttpError::from)
                        },
                    )
                    .await;
                let task = match read {
                    Ok(task) => task,
                    Err(error) => return Err(ConsoleError::from_http(error).await),
                };
                self.out.push_back(fragment("task-live", task_live(&task)));
            }
            Watch::Node { id } => {
                if let Some((view, _)) = node_view(&self.shared, id) {
                    self.out
                        .push_back(fragment("node-live", node_live(&view, unix_now_ms())));
                }
            }
        }
        Ok(())
    }

    /// Turns one feed event into the fragments the page needs.
    async fn handle(&mut self, event: &LiveEvent) -> Result<(), ConsoleError> {
        let now_ms = unix_now_ms();
        match &self.watch {
            Watch::Fleet { shown, query } => {
                let Some(id) = event.node_id() else {
                    return Ok(());
                };
                if shown.contains(id) {
                    if let Some((view, _)) = node_view(&self.shared, id) {
                        let row = node_cells(&view, &self.caller, now_ms);
                        self.out.push_back(fragment(&node_event(id), row));
                    }
                    if matches!(event, LiveEvent::Node(_)) {
                        // A state changed: the counts follow (rare events,
                        // so counting the fleet again is cheap enough).
                        let page = fleet_page(&self.shared, query);
                        self.out
                            .push_back(fragment("fleet-summary", summary(&page)));
                    }
                } else if matches!(event, LiveEvent::Node(change) if change.change != NodeChangeKind::Revoked)
                {
                    // A node this page does not show appeared or changed:
                    // it may belong on it now.
                    self.reload().await?;
                }
            }
            Watch::Tasks { shown, .. } => {
                let Some(id) = event.task_id() else {
                    return Ok(());
                };
                if shown.contains(id) {
                    let shared = &self.shared;
                    let tasks = shared.tasks();
                    let record = shared
                        .console
                        .reads
                        .tasks
                        .get(
                            &id.to_owned(),
                            self.seen,
                            || shared.feed.latest_seq(),
                            || tasks.record(id),
                        )
                        .await?;
                    if let Some(record) = &*record {
                        let row = task_cells(&task_summary(record.clone()), now_ms);
                        self.out.push_back(fragment(&task_event(id), row));
                    }
                } else {
                    self.reload().await?;
                }
            }
            Watch::Task { .. } | Watch::Node { .. } => {
                // Detail pages always show the latest; throttled like reloads.
                self.reload().await?;
            }
        }
        Ok(())
    }

    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Some(event);
            }
            let wait = if self.reload_due {
                RELOAD_INTERVAL
                    .saturating_sub(self.last_reload.map_or(RELOAD_INTERVAL, |at| at.elapsed()))
            } else {
                RECHECK
            };
            let delivery = tokio::time::timeout(wait, self.subscription.next()).await;
            if self.checked.elapsed() >= RECHECK {
                self.checked = Instant::now();
                match session_caller(&self.shared, &self.headers).await {
                    Ok(Some(caller)) if caller.role.allows(Role::Viewer) => {}
                    // Signed out, expired or revoked: the stream ends, and
                    // the browser's reconnect is sent to sign in.
                    _ => return None,
                }
            }
            let handled = match delivery {
                Err(_) if self.reload_due => self.reload().await,
                Err(_) => Ok(()),
                Ok(None) => return None,
                Ok(Some(Delivery::Reset(_))) => {
                    // Events were lost: start again from now and re-read.
                    self.subscription = self.shared.feed.subscribe(self.watch.filter(), None);
                    self.seen = self.shared.feed.latest_seq();
                    self.last_reload = None;
                    self.reload().await
                }
                Ok(Some(Delivery::Event(stamped))) => {
                    self.seen = self.seen.max(stamped.position.seq);
                    self.handle(&stamped.event).await
                }
            };
            if let Err(error) = handled {
                tracing::warn!(%error, "console stream ends");
                return None;
            }
        }
    }
}

/// `GET /console/events` (viewer).
pub(crate) async fn console_events(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(view): Query<ViewQuery>,
    Query(fleet): Query<FleetQuery>,
    Query(tasks): Query<TaskQuery>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    let watch = match (view.view.as_deref(), view.id) {
        // What the page shows is sent again below, once subscribed.
        (Some("fleet"), _) => Watch::Fleet {
            query: fleet,
            shown: HashSet::new(),
        },
        (Some("tasks"), _) => Watch::Tasks {
            query: tasks,
            shown: HashSet::new(),
        },
        (Some("task"), Some(id)) => Watch::Task { id },
        (Some("node"), Some(id)) => Watch::Node { id },
        _ => {
            return Err(ConsoleError::BadRequest(
                "view= must be fleet, tasks, task (with id=) or node (with id=)".to_owned(),
            ))
        }
    };
    let subscription = shared.feed.subscribe(watch.filter(), None);
    let seen = shared.feed.latest_seq();
    let mut stream = Stream {
        shared,
        caller,
        headers,
        watch,
        subscription,
        out: VecDeque::new(),
        checked: Instant::now(),
        last_reload: None,
        reload_due: false,
        seen,
    };
    // The page was rendered before this stream subscribed: whatever changed
    // in between (a short task can run to its end in that gap) would be
    // lost. The stream's first fragments are therefore what the page shows,
    // read after subscribing; every change after that follows as an event.
    stream.reload().await?;
    let events = futures_util::stream::unfold(stream, |mut stream| async move {
        stream
            .next()
            .await
            .map(|event| (Ok::<Event, Infallible>(event), stream))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

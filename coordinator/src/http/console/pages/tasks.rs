//! The task list (`/tasks`): filters by state (in the store's query), and by
//! node, artifact and age over the newest tasks the API may list; rows
//! change state live.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;
use starling_api::{TaskStatus, TaskSummary};

use super::super::fragments::task_row;
use super::super::layout::{page, respond, Caller, ConsoleError, Section};
use crate::http::views::task_summary;
use crate::http::Shared;
use crate::http::MAX_LIST_LIMIT;
use crate::task::unix_now_ms;

/// Tasks on one page of the list.
pub(crate) const PAGE_SIZE: usize = 100;

/// The list's filters, as the GET form sends them (empty means any).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct TaskQuery {
    pub(crate) state: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) artifact: Option<String>,
    /// Only tasks created in the last this many minutes.
    pub(crate) minutes: Option<String>,
    pub(crate) page: Option<usize>,
}

fn given(value: &Option<String>) -> Option<&str> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|value| !value.is_empty())
}

impl TaskQuery {
    /// The state asked for, refused with the API's words when unknown.
    pub(crate) fn status(&self) -> Result<Option<TaskStatus>, ConsoleError> {
        given(&self.state)
            .map(str::parse::<TaskStatus>)
            .transpose()
            .map_err(|error| ConsoleError::BadRequest(error.to_string()))
    }

    fn minutes(&self) -> Result<Option<u64>, ConsoleError> {
        given(&self.minutes)
            .map(|minutes| {
                minutes.parse::<u64>().map_err(|_| {
                    ConsoleError::BadRequest(format!("minutes {minutes:?} is not a whole number"))
                })
            })
            .transpose()
    }

    /// The query string that asks for this filter again (on `page`).
    pub(crate) fn to_query(&self, page: usize) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in [
            ("state", &self.state),
            ("node", &self.node),
            ("artifact", &self.artifact),
            ("minutes", &self.minutes),
        ] {
            if let Some(value) = given(value) {
                query.append_pair(name, value);
            }
        }
        if page > 0 {
            query.append_pair("page", &page.to_string());
        }
        query.finish()
    }

    /// Whether a task passes the filters the store does not apply.
    fn matches(&self, task: &TaskSummary, since_ms: Option<u64>) -> bool {
        given(&self.node).is_none_or(|node| task.node_id.as_deref() == Some(node))
            && given(&self.artifact)
                .is_none_or(|prefix| task.artifact.starts_with(&prefix.to_ascii_lowercase()))
            && since_ms.is_none_or(|since| task.created_ms >= since)
    }
}

/// The newest tasks (as many as the API lists at most) that pass `keep`,
/// as the API summarises them.
pub(crate) async fn recent_tasks(
    shared: &Shared,
    keep: impl Fn(&TaskSummary) -> bool,
) -> Result<Vec<TaskSummary>, ConsoleError> {
    Ok(shared
        .tasks()
        .list(None, MAX_LIST_LIMIT)
        .await?
        .into_iter()
        .map(task_summary)
        .filter(|task| keep(task))
        .collect())
}

/// The page of tasks `query` asks for, and how many matched.
pub(crate) async fn task_page(
    shared: &Shared,
    query: &TaskQuery,
    shared_read: Option<u64>,
) -> Result<(Vec<TaskSummary>, usize), ConsoleError> {
    let status = query.status()?;
    let since_ms = query
        .minutes()?
        .map(|minutes| unix_now_ms().saturating_sub(minutes.saturating_mul(60_000)));
    let tasks = shared.tasks();
    let read = || tasks.list(status, MAX_LIST_LIMIT);
    let records = match shared_read {
        // A stream's, shared with the other streams of this list (`reads`).
        Some(at_least) => {
            shared
                .console
                .reads
                .task_lists
                .get(&status, at_least, || shared.feed.latest_seq(), read)
                .await?
        }
        None => Arc::new(read().await?),
    };
    let matched: Vec<TaskSummary> = records
        .iter()
        .cloned()
        .map(task_summary)
        .filter(|task| query.matches(task, since_ms))
        .collect();
    let count = matched.len();
    let first = query.page.unwrap_or(0).saturating_mul(PAGE_SIZE);
    Ok((
        matched.into_iter().skip(first).take(PAGE_SIZE).collect(),
        count,
    ))
}

/// The table's rows (also what the console's stream sends when they change).
pub(crate) fn rows(tasks: &[TaskSummary], now_ms: u64) -> Markup {
    html! {
        @for task in tasks { (task_row(task, now_ms)) }
        @if tasks.is_empty() {
            tr.empty { td colspan="9" { span.muted { "No task matches." } } }
        }
    }
}

fn filters(query: &TaskQuery) -> Markup {
    html! {
        form.filters method="get" action="/tasks" {
            label { "State"
                select name="state" {
                    option value="" { "any" }
                    @for status in TaskStatus::ALL {
                        option value=(status.as_str()) selected[given(&query.state) == Some(status.as_str())] { (status.as_str()) }
                    }
                }
            }
            label { "Node" input type="text" name="node" value=[given(&query.node)]; }
            label { "Artifact" input type="text" name="artifact" placeholder="digest prefix" value=[given(&query.artifact)]; }
            label { "Created in the last" input type="number" min="1" name="minutes" placeholder="minutes" value=[given(&query.minutes)]; }
            button type="submit" { "Filter" }
            a href="/tasks" { "Clear" }
        }
    }
}

/// `GET /tasks`.
pub(crate) async fn tasks(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<TaskQuery>,
) -> Result<Response, ConsoleError> {
    let now_ms = unix_now_ms();
    let (tasks, matched) = task_page(&shared, &query, None).await?;
    let page_number = query.page.unwrap_or(0);
    let pages = matched.div_ceil(PAGE_SIZE).max(1);
    let stream = format!("/console/events?view=tasks&{}", query.to_query(page_number));
    let body = html! {
        h1 { "Tasks" }
        (filters(&query))
        p.muted { "Filters by node, artifact and time look at the newest " (MAX_LIST_LIMIT) " tasks (of the chosen state)." }
        div sse-connect=(stream) {
            table #tasks {
                thead { tr { th { "Task" } th { "State" } th { "Artifact" } th { "Node" } th.num { "Attempt" } th.num { "Priority" } th { "Created" } th { "Updated" } th { "Reason" } } }
                tbody #task-rows sse-swap="task-rows" hx-swap="innerHTML" {
                    (rows(&tasks, now_ms))
                }
            }
        }
        div.pager {
            span { (matched) " matching, page " (page_number + 1) " of " (pages) }
            @if page_number > 0 { a href={ "/tasks?" (query.to_query(page_number - 1)) } { "← newer" } }
            @if page_number + 1 < pages { a href={ "/tasks?" (query.to_query(page_number + 1)) } { "older →" } }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Tasks", &caller, Section::Tasks, body),
    ))
}

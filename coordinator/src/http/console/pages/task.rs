//! A task's page (`/tasks/{id}`): its state, attempts and events on a
//! timeline, its output (text when it is UTF-8, else hex with a base64
//! download), and the placement explanation. The detail is read with the
//! REST API's own `task_detail`; the console's stream sends it again when
//! the task changes.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use base64::Engine as _;
use maud::{html, Markup};
use starling_api::TaskDetail;

use super::super::explain::explanation;
use super::super::fragments::segment;
use super::super::layout::{bytes, page, respond, task_badge, utc, Caller, ConsoleError, Section};
use crate::http::Shared;

/// Bytes of binary output shown as hex (the download has all of it).
const HEX_SHOWN: usize = 4096;

/// A task's detail as the REST API reads it, or the console's refusal.
pub(crate) async fn read_task(shared: &Shared, id: &str) -> Result<TaskDetail, ConsoleError> {
    match shared.tasks().detail(id).await {
        Ok(history) => Ok(history.into()),
        Err(error) => Err(ConsoleError::from_http(error.into()).await),
    }
}

/// A hex dump: offset, 16 bytes, their printable characters.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (line, chunk) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|byte| format!("{byte:02x}")).collect();
        let text: String = chunk
            .iter()
            .map(|&byte| {
                if byte.is_ascii_graphic() || byte == b' ' {
                    char::from(byte)
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  {text}\n",
            line * 16,
            hex.join(" ")
        ));
    }
    out
}

fn output(task: &TaskDetail) -> Markup {
    html! {
        h2 { "Output" }
        @if let Some(text) = &task.output_text {
            @if text.is_empty() { p.muted { "Empty." } } @else { pre.output #output { (text) } }
        } @else if let Some(encoded) = &task.output_base64 {
            @let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap_or_default();
            p {
                (bytes(decoded.len() as u64)) " of binary output. "
                a download={ "task-" (task.id) ".bin" } href={ "data:application/octet-stream;base64," (encoded) } { "Download" }
            }
            pre.output #output { (hex_dump(&decoded[..decoded.len().min(HEX_SHOWN)])) }
            @if decoded.len() > HEX_SHOWN { p.muted { "The first " (HEX_SHOWN) " bytes are shown." } }
        } @else {
            p.muted { "None yet." }
        }
    }
}

fn timeline(task: &TaskDetail) -> Markup {
    let mut events = task.events.clone();
    events.sort_by_key(|event| event.received_ms);
    html! {
        h2 { "Attempts" }
        @if task.attempts.is_empty() {
            p.muted { "Not assigned yet." }
        } @else {
            table {
                thead { tr { th.num { "Attempt" } th { "Node / site" } th.num { "Power level" } th { "Assigned" } th { "State" } th { "Finished" } } }
                tbody {
                    @for attempt in &task.attempts {
                        tr {
                            td.num { (attempt.attempt) }
                            td {
                                @if let Some(node) = &attempt.node_id { a href={ "/nodes/" (segment(node)) } { (node) } }
                                @if let Some(site) = &attempt.site { " site " (site) }
                            }
                            td.num { (attempt.power_level) }
                            td { (utc(attempt.assigned_ms)) }
                            td { (attempt.state) }
                            td { (attempt.finished_ms.map(utc).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
        h2 { "Timeline" }
        ol.timeline {
            li { span.mono { (utc(task.created_ms)) } " submitted" }
            @for event in &events {
                li {
                    span.mono { (utc(event.received_ms)) } " attempt " (event.attempt) ": " strong { (event.state) }
                    @if let Some(node) = &event.node_id { " on " a href={ "/nodes/" (segment(node)) } { (node) } }
                    @if let Some(site) = &event.site { " at site " (site) }
                    @if let Some(code) = event.exit_code { ", exit code " (code) }
                    @if event.output_bytes > 0 { ", " (bytes(event.output_bytes)) " of output" }
                    @if let Some(reason) = &event.reason { " — " (reason) }
                    @if let Some(message) = &event.message { ": " span.muted { (message) } }
                }
            }
        }
    }
}

/// The part of a task's page that changes: state, placement, timeline,
/// output and explanation.
pub(crate) fn live_section(task: &TaskDetail) -> Markup {
    html! {
        dl.facts {
            dt { "State" } dd #task-state { (task_badge(task.state)) }
            dt { "Node" } dd {
                @if let Some(node) = &task.node_id { a href={ "/nodes/" (segment(node)) } { (node) } }
                @else if let Some(site) = &task.site { "site " (site) (task.site_node.as_deref().map(|n| format!(" (node {n})")).unwrap_or_default()) }
                @else { span.muted { "not placed yet" } }
            }
            dt { "Attempt" } dd { (task.attempt) }
            dt { "Power level" } dd { (task.power_level.map_or("–".to_owned(), |level| level.to_string())) }
            @if let Some(reason) = &task.reason {
                dt { "Failure" } dd { (reason) (task.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()) }
            }
            @if let Some(code) = task.exit_code { dt { "Exit code" } dd { (code) } }
        }
        section #explanation {
            h2 { "Placement explanation" }
            @match &task.explanation {
                Some(value) => (explanation(value, task.node_id.as_deref())),
                None => p.muted { "Not placed yet: the explanation appears with the first decision." },
            }
        }
        section { (timeline(task)) }
        section { (output(task)) }
    }
}

/// `GET /tasks/{id}`.
pub(crate) async fn task(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let task = read_task(&shared, &id).await?;
    let stream = format!("/console/events?view=task&id={}", segment(&id));
    let body = html! {
        h1 { "Task " span.mono { (task.id) } }
        section {
            dl.facts {
                dt { "Artifact" } dd.mono { a href={ "/artifacts#a-" (task.artifact) } { (task.artifact) } " (" (task.runtime) ")" }
                dt { "Arguments" } dd.mono { (task.args.join(" ")) }
                dt { "Class / priority" } dd { (format!("{:?}", task.class).to_lowercase()) " / " (task.priority) }
                dt { "Work estimate" } dd { (format!("{:.2} s on a reference core", task.work_seconds)) }
                dt { "Limits" } dd { (task.limits.wall_ms) " ms wall, " (bytes(task.limits.memory_bytes)) " memory, " (bytes(task.limits.output_bytes)) " output" }
                dt { "Input" } dd { (bytes(task.input_bytes)) }
                dt { "Submitted" } dd { (utc(task.created_ms)) }
                @if let Some(deadline) = task.deadline_unix_ms { dt { "Deadline" } dd { (utc(deadline)) } }
                @if let Some(origin) = &task.origin_site { dt { "Forwarded from" } dd { "site " (origin) } }
            }
        }
        div sse-connect=(stream) {
            div #task-live sse-swap="task-live" hx-swap="innerHTML" {
                (live_section(&task))
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page(&format!("Task {id}"), &caller, Section::Tasks, body),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_dumps_show_offsets_and_printable_bytes() {
        let dump = hex_dump(b"ab\x00<");
        assert_eq!(dump, format!("00000000  {:<47}  ab.<\n", "61 62 00 3c"));
    }
}

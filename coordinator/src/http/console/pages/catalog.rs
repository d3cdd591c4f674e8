//! The read-only catalogue pages: artifacts (published modules and kernels,
//! with their publisher signatures) and sites (the federation's members,
//! their digests, and the tasks forwarded to them).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::html;

use super::super::fragments::segment;
use super::super::layout::{bytes, page, respond, Caller, ConsoleError, Section};
use crate::http::Shared;

/// Artifacts listed, newest first.
const ARTIFACTS_SHOWN: u32 = 200;

/// Forwards in flight listed on the sites page.
const FORWARDS_SHOWN: u32 = 100;

/// `GET /artifacts`.
pub(crate) async fn artifacts(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ConsoleError> {
    let rows = shared.artifacts().catalog(ARTIFACTS_SHOWN).await?;
    let body = html! {
        h1 { "Artifacts " span.muted { (rows.len()) " shown, newest first" } }
        table #artifacts {
            thead { tr { th { "Digest (sha256)" } th { "Runtime" } th.num { "Size" } th { "Publisher signature" } } }
            tbody {
                @for row in &rows {
                    tr id={ "a-" (row.digest) } {
                        td.mono.wrap { (row.digest) }
                        td { (row.info.map_or("?", |(_, runtime)| runtime.as_str())) }
                        td.num { (row.info.map_or("?".to_owned(), |(size, _)| bytes(size))) }
                        td {
                            @match &row.publisher {
                                Some(signature) => {
                                    span.badge.online { "signed" } " by key "
                                    span.mono { (hex::encode(&signature.key)) }
                                }
                                None => span.muted { "unsigned" },
                            }
                        }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="4" { span.muted { "Nothing published yet (starling publish FILE.wasm)." } } }
                }
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Artifacts", &caller, Section::Artifacts, body),
    ))
}

/// `GET /sites`: what `GET /api/v1/sites` answers, and the forwards in flight.
pub(crate) async fn sites(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ConsoleError> {
    let list = crate::service::sites::site_list(shared.federation.as_deref());
    let forwards = match shared.peers() {
        Ok(peers) => peers.open_forwards(FORWARDS_SHOWN).await?,
        Err(_) => Vec::new(),
    };
    let body = html! {
        h1 { "Sites" }
        @if !list.federated {
            section { p { "This coordinator does not federate (start it with " code { "--site" } " and " code { "--cluster-key" } ")." } }
        } @else {
            p { "This site: " strong { (list.site.as_deref().unwrap_or("?")) } }
            table #sites {
                thead { tr { th { "Site" } th { "State" } th { "REST API" } th.num { "Round trip" } th.num { "Digest age" }
                    th.num { "Nodes" } th.num { "Pending" } th.num { "Running" } th.num { "Watts" } th.num { "Artifacts held" } } }
                tbody {
                    @for site in &list.sites {
                        tr {
                            td { (site.site) }
                            td { span class={ "badge " (site.state.as_str()) } { (site.state.as_str()) } }
                            td.mono { (site.api_url.as_deref().unwrap_or("–")) }
                            td.num { (site.rtt_ms.map_or("–".to_owned(), |rtt| format!("{rtt:.1} ms"))) }
                            td.num { (site.digest_age_ms.map_or("–".to_owned(), |age| format!("{:.1} s", age as f64 / 1000.0))) }
                            @match &site.digest {
                                Some(digest) => {
                                    td.num { (digest.nodes) } td.num { (digest.pending) } td.num { (digest.running) }
                                    td.num { (format!("{:.0}", if digest.watts.abs() < 0.5 { 0.0 } else { digest.watts })) } td.num { (digest.artifacts.len()) }
                                }
                                None => { td colspan="5" { span.muted { "no digest yet" } } }
                            }
                        }
                    }
                }
            }
            h2 { "Tasks forwarded to other sites" }
            @if forwards.is_empty() {
                p.muted { "None in flight." }
            } @else {
                table {
                    thead { tr { th { "Task" } th.num { "Attempt" } th { "Site" } th { "Accepted" } th { "Cancel asked" } } }
                    tbody {
                        @for forward in &forwards {
                            tr {
                                td.mono { a href={ "/tasks/" (segment(&forward.task_id)) } { (forward.task_id) } }
                                td.num { (forward.attempt) }
                                td { (forward.site) }
                                td { @if forward.accepted { "yes" } @else { "not yet" } }
                                td { @if forward.cancel_requested { "yes" } @else { "no" } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Sites", &caller, Section::Sites, body),
    ))
}

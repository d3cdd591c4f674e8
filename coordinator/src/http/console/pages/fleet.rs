//! The fleet page (`/`): every node, filtered by state, arch, label and
//! site, a page of [`PAGE_SIZE`] at a time (only that page is rendered, so
//! 10 000 nodes stay fast), live rows, and bulk revoke for operators.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;
use starling_api::Role;

use super::super::fragments::{node_row, node_site, own_site, NodeState, NodeView};
use super::super::gate::FormFields;
use super::super::layout::{page, respond, Caller, ConsoleError, Section};
use super::node::revoke_one;
use crate::http::Shared;
use crate::registry::NodeEntry;
use crate::task::unix_now_ms;

/// Nodes on one page of the fleet.
pub(crate) const PAGE_SIZE: usize = 100;

/// Most nodes one bulk revoke may name (a page's worth).
const MAX_BULK: usize = PAGE_SIZE;

/// The fleet's filters, as the GET form sends them (empty means any).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct FleetQuery {
    pub(crate) state: Option<String>,
    pub(crate) arch: Option<String>,
    pub(crate) label: Option<String>,
    pub(crate) site: Option<String>,
    pub(crate) page: Option<usize>,
}

fn given(value: &Option<String>) -> Option<&str> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|value| !value.is_empty())
}

impl FleetQuery {
    /// The page asked for, from 0.
    pub(crate) fn page(&self) -> usize {
        self.page.unwrap_or(0)
    }

    /// The query string that asks for this filter again (on `page`).
    pub(crate) fn to_query(&self, page: usize) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in [
            ("state", &self.state),
            ("arch", &self.arch),
            ("label", &self.label),
            ("site", &self.site),
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

    /// Whether a node passes the filter.
    pub(crate) fn matches(&self, entry: &NodeEntry, state: NodeState, site: &str) -> bool {
        given(&self.state).is_none_or(|wanted| wanted == state.as_str())
            && given(&self.arch).is_none_or(|wanted| entry.capability.arch.as_str() == wanted)
            && given(&self.site).is_none_or(|wanted| wanted == site)
            && given(&self.label).is_none_or(|wanted| {
                // `key=value` matches that label; `key` any value of it.
                let (key, value) = match wanted.split_once('=') {
                    Some((key, value)) => (key, Some(value)),
                    None => (wanted, None),
                };
                entry.capability.labels.iter().any(|label| {
                    label.key.as_str() == key
                        && value.is_none_or(|value| label.value.as_str() == value)
                })
            })
    }
}

/// One page of the fleet under a filter.
pub(crate) struct FleetPage {
    pub(crate) rows: Vec<NodeView>,
    pub(crate) matched: usize,
    pub(crate) total: usize,
    pub(crate) online: usize,
    pub(crate) arches: BTreeSet<String>,
    pub(crate) sites: BTreeSet<String>,
}

/// Reads the page of nodes `query` asks for: only its rows are built (with
/// their sparkline history); the rest are counted.
pub(crate) fn fleet_page(shared: &Shared, query: &FleetQuery) -> FleetPage {
    let own = own_site(shared);
    let first = query.page().saturating_mul(PAGE_SIZE);
    let registry = shared.registry();
    let mut page = FleetPage {
        rows: Vec::new(),
        matched: 0,
        total: registry.len(),
        online: 0,
        arches: BTreeSet::new(),
        sites: BTreeSet::new(),
    };
    for entry in registry.nodes() {
        let id = entry.capability.node_id.as_str();
        let state = NodeState::of(entry, shared.mqtt_access.is_revoked(id));
        let site = node_site(entry, &own);
        if state == NodeState::Online {
            page.online += 1;
        }
        page.arches.insert(entry.capability.arch.to_string());
        if !query.matches(entry, state, &site) {
            page.sites.insert(site);
            continue;
        }
        page.sites.insert(site);
        if page.matched >= first && page.rows.len() < PAGE_SIZE {
            let samples = shared.console.history.samples(id);
            page.rows.push(NodeView::of(
                entry,
                state == NodeState::Revoked,
                &own,
                samples,
            ));
        }
        page.matched += 1;
    }
    page
}

/// The table's rows (also what the console's stream sends when they change).
pub(crate) fn rows(page: &FleetPage, caller: &Caller, now_ms: u64) -> Markup {
    html! {
        @for view in &page.rows {
            (node_row(view, caller, now_ms))
        }
        @if page.rows.is_empty() {
            tr.empty { td colspan="15" { span.muted { "No node matches. Agents appear here as they report." } } }
        }
    }
}

fn filters(query: &FleetQuery, page: &FleetPage) -> Markup {
    let selected = |value: &Option<String>, option: &str| given(value) == Some(option);
    html! {
        form.filters method="get" action="/" {
            label { "State"
                select name="state" {
                    option value="" { "any" }
                    @for state in NodeState::ALL {
                        option value=(state.as_str()) selected[selected(&query.state, state.as_str())] { (state.as_str()) }
                    }
                }
            }
            label { "Arch"
                select name="arch" {
                    option value="" { "any" }
                    @for arch in &page.arches {
                        option value=(arch) selected[selected(&query.arch, arch)] { (arch) }
                    }
                }
            }
            label { "Label" input type="text" name="label" placeholder="key or key=value" value=[given(&query.label)]; }
            label { "Site"
                select name="site" {
                    option value="" { "any" }
                    @for site in &page.sites {
                        option value=(site) selected[selected(&query.site, site)] { (site) }
                    }
                }
            }
            button type="submit" { "Filter" }
            a href="/" { "Clear" }
        }
    }
}

fn header_row(caller: &Caller) -> Markup {
    html! {
        tr {
            @if caller.may(Role::Operator) { th { span.muted { "✓" } } }
            th { "Node" } th { "State" } th { "MQTT" } th { "Heartbeat" } th { "Arch" }
            th.num { "Cores" } th.num { "Memory" } th.num { "GPUs" } th.num { "Power" }
            th.num { "CPU load" } th.num { "Memory used" } th.num { "RTT" } th { "Site" } th { "Labels" }
        }
    }
}

/// The counts beside the title.
pub(crate) fn summary(page: &FleetPage) -> Markup {
    html! { (page.total) " nodes, " (page.online) " online" }
}

/// The pager under the table.
pub(crate) fn pager(page: &FleetPage, query: &FleetQuery) -> Markup {
    let page_number = query.page();
    let pages = page.matched.div_ceil(PAGE_SIZE).max(1);
    html! {
        span { (page.matched) " matching, page " (page_number + 1) " of " (pages) }
        @if page_number > 0 {
            a href={ "/?" (query.to_query(page_number - 1)) } { "← previous" }
        }
        @if page_number + 1 < pages {
            a href={ "/?" (query.to_query(page_number + 1)) } { "next →" }
        }
    }
}

/// `GET /`: the fleet. The counts, rows and pager are swapped in by the
/// console's stream as nodes come and go.
pub(crate) async fn fleet(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<FleetQuery>,
) -> Response {
    let now_ms = unix_now_ms();
    let fleet = fleet_page(&shared, &query);
    let stream = format!(
        "/console/events?view=fleet&{}",
        query.to_query(query.page())
    );
    let body = html! {
        div sse-connect=(stream) {
            h1 { "Fleet " span.muted #fleet-summary sse-swap="fleet-summary" hx-swap="innerHTML" { (summary(&fleet)) } }
            (filters(&query, &fleet))
            @if caller.may(Role::Operator) {
                form #bulk method="post" action="/nodes/revoke" {
                    (caller.csrf_field())
                    div.actions {
                        button.danger type="submit" { "Revoke selected" }
                        span.muted { "Revoked nodes lose their MQTT credentials; their tasks are placed again." }
                    }
                }
            }
            table #fleet {
                thead { (header_row(&caller)) }
                tbody #fleet-rows sse-swap="fleet-rows" hx-swap="innerHTML" {
                    (rows(&fleet, &caller, now_ms))
                }
            }
            div.pager sse-swap="fleet-pager" hx-swap="innerHTML" { (pager(&fleet, &query)) }
        }
    };
    respond(
        axum::http::StatusCode::OK,
        page("Fleet", &caller, Section::Fleet, body),
    )
}

/// `POST /nodes/revoke` (operator): revokes every checked node, through the
/// REST API's own revoke, then shows the fleet again.
pub(crate) async fn revoke_many(
    State(shared): State<Arc<Shared>>,
    Extension(form): Extension<FormFields>,
) -> Result<Response, ConsoleError> {
    let nodes: Vec<&str> = form.all("node").collect();
    if nodes.is_empty() {
        return Err(ConsoleError::BadRequest(
            "no node was selected; tick the nodes to revoke".to_owned(),
        ));
    }
    if nodes.len() > MAX_BULK {
        return Err(ConsoleError::BadRequest(format!(
            "at most {MAX_BULK} nodes may be revoked at once"
        )));
    }
    // Each node goes through the REST logic on its own; one that fails
    // (revoked already, never enrolled) does not stop the others.
    let mut refused = Vec::new();
    for node in nodes {
        if let Err(error) = revoke_one(&shared, node).await {
            refused.push(format!("{node}: {error}"));
        }
    }
    if refused.is_empty() {
        Ok(Redirect::to("/?state=revoked").into_response())
    } else {
        Err(ConsoleError::BadRequest(format!(
            "the other nodes were revoked, but not these: {}",
            refused.join("; ")
        )))
    }
}

//! The placement explanation as a table: which nodes were filtered out and
//! why (a count per reason with example nodes), the scored candidates with
//! predicted finish and energy (the chosen one marked), and the summary as
//! "why it won". It reads the stored JSON (`TaskRecord.explanation`) and
//! shows whatever fields are present, so an explanation from an older or
//! newer engine still renders; fields it does not know are shown raw.

use maud::{html, Markup};
use serde_json::Value;

use super::fragments::segment;
use super::layout::utc;

/// Fields this renderer shows itself; the rest go in the raw view.
const KNOWN: &[&str] = &[
    "policy",
    "summary",
    "alternatives",
    "considered",
    "filtered",
    "forwarded_to",
    "estimated_finish_ms",
    "local",
];

fn number(value: Option<&Value>) -> Option<f64> {
    value
        .and_then(Value::as_f64)
        .filter(|number| number.is_finite())
}

fn text(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str)
}

/// A predicted finish: the engine's clock is Unix ms in the coordinator
/// (a small number only in the simulator's view).
fn finish(ms: Option<f64>) -> String {
    match ms {
        Some(ms) if ms > 1e12 => utc(ms as u64),
        Some(ms) => format!("{:.0} ms", ms),
        None => "–".to_owned(),
    }
}

fn node_link(id: &str) -> Markup {
    html! { a href={ "/nodes/" (segment(id)) } { (id) } }
}

fn filtered(value: &Value) -> Markup {
    let Some(reasons) = value.as_array() else {
        return html! {};
    };
    html! {
        h3 { "Filtered out" }
        @if reasons.is_empty() {
            p.muted { "No node was filtered out." }
        } @else {
            table.filtered {
                thead { tr { th { "Reason" } th.num { "Nodes" } th { "For example" } } }
                tbody {
                    @for reason in reasons {
                        tr {
                            td { (text(reason.get("reason")).unwrap_or("?")) }
                            td.num { (reason.get("count").and_then(Value::as_u64).map_or("?".to_owned(), |n| n.to_string())) }
                            td {
                                @for (i, node) in reason.get("nodes").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).enumerate() {
                                    @if i > 0 { ", " }
                                    (node_link(node))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn candidates(value: &Value, chosen: Option<&str>) -> Markup {
    let Some(alternatives) = value.as_array() else {
        return html! {};
    };
    // The engine lists the chosen candidate first when it placed the task.
    let chosen_index = chosen.and_then(|chosen| {
        alternatives
            .iter()
            .position(|alternative| text(alternative.get("node_id")) == Some(chosen))
    });
    html! {
        h3 { "Scored candidates" }
        @if alternatives.is_empty() {
            p.muted { "No candidate passed the filters." }
        } @else {
            table.candidates {
                thead { tr { th { "" } th { "Node" } th.num { "Power level" } th.num { "Score" } th.num { "Predicted finish" } th.num { "Energy (model)" } th { "Note" } } }
                tbody {
                    @for (i, alternative) in alternatives.iter().enumerate() {
                        tr class=[(chosen_index == Some(i)).then_some("chosen")] {
                            td { @if chosen_index == Some(i) { span.badge.task-succeeded { "chosen" } } }
                            td { @if let Some(node) = text(alternative.get("node_id")) { (node_link(node)) } }
                            td.num { (alternative.get("power_level").and_then(Value::as_u64).map_or("–".to_owned(), |l| l.to_string())) }
                            td.num { (number(alternative.get("score")).map_or("–".to_owned(), |s| format!("{s:.3}"))) }
                            td.num { (finish(number(alternative.get("finish_ms")))) }
                            td.num { (number(alternative.get("energy_joules")).map_or("–".to_owned(), |j| format!("≈ {j:.2} J"))) }
                            td.wrap { (text(alternative.get("note")).unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// Renders an explanation; `chosen` is the node the task was placed on.
pub(crate) fn explanation(value: &Value, chosen: Option<&str>) -> Markup {
    let Some(object) = value.as_object() else {
        return html! { pre { (value.to_string()) } };
    };
    let unknown: serde_json::Map<String, Value> = object
        .iter()
        .filter(|(key, _)| !KNOWN.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    html! {
        div.explanation {
            @if let Some(summary) = text(object.get("summary")) {
                p.why { strong { "Why it won: " } (summary) }
            }
            dl.facts {
                @if let Some(policy) = text(object.get("policy")) {
                    dt { "Policy" } dd { (policy) }
                }
                @if let Some(considered) = object.get("considered").and_then(Value::as_u64) {
                    dt { "Nodes considered" } dd { (considered) }
                }
                @if let Some(site) = text(object.get("forwarded_to")) {
                    dt { "Forwarded to site" } dd { (site) }
                    dt { "Estimated finish there" } dd { (finish(number(object.get("estimated_finish_ms")))) }
                }
            }
            @if let Some(value) = object.get("filtered") { (filtered(value)) }
            @if let Some(value) = object.get("alternatives") { (candidates(value, chosen)) }
            @if let Some(local) = object.get("local") {
                h3 { "What this site offered" }
                (explanation(local, None))
            }
            @if !unknown.is_empty() {
                details {
                    summary { "More fields" }
                    pre { (serde_json::to_string_pretty(&Value::Object(unknown)).unwrap_or_default()) }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_part_renders_and_the_chosen_node_is_marked() {
        let value = serde_json::json!({
            "policy": "heuristic",
            "summary": "pi-2 finishes first at level 1",
            "considered": 3,
            "filtered": [{"reason": "arch", "count": 1, "nodes": ["x86-<1>"]}],
            "alternatives": [
                {"node_id": "pi-2", "power_level": 1, "score": 0.9, "finish_ms": 120.0, "energy_joules": 1.5, "note": "fast"},
                {"node_id": "pi-3", "power_level": 0, "score": 0.4, "finish_ms": null, "energy_joules": null, "note": ""}
            ],
            "future": {"x": 1}
        });
        let html = explanation(&value, Some("pi-2")).into_string();
        assert!(
            html.contains("Why it won: </strong>pi-2 finishes first"),
            "{html}"
        );
        assert!(html.contains("Nodes considered"));
        assert!(
            html.contains("x86-&lt;1&gt;"),
            "node ids are escaped: {html}"
        );
        assert!(html.contains(r#"<tr class="chosen">"#));
        assert_eq!(html.matches("chosen").count(), 2, "one row marked: {html}");
        assert!(html.contains("120 ms") && html.contains("1.50 J"));
        assert!(html.contains("More fields") && html.contains("future"));
    }

    #[test]
    fn an_old_explanation_without_the_new_fields_renders() {
        let value = serde_json::json!({"policy": "random", "summary": "held", "alternatives": []});
        let html = explanation(&value, None).into_string();
        assert!(html.contains("No candidate passed the filters."));
        assert!(!html.contains("Filtered out"));
    }
}

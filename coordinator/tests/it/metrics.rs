//! `GET /metrics` with real values: nodes by state, tasks by state, the
//! queue and the placement decision-time histogram after a task runs and
//! another is held, event-stream clients as a stream opens and closes; the
//! held task's explanation names the node it ruled out and why; and the
//! Grafana dashboard (`deploy/grafana/starling.json`)
//! queries only metrics a live coordinator exports.

use crate::common;

use std::time::Duration;

use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

async fn scrape(http: &reqwest::Client, rest: &str) -> String {
    let answer = http.get(format!("{rest}/metrics")).send().await.unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.text().await.unwrap()
}

/// The value of `series` (its name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Like [`sample`], failing the test when the series is missing.
fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

/// Waits until the task's detail satisfies `done`, and returns it.
async fn task_until(
    http: &reqwest::Client,
    rest: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let url = format!("{rest}/api/v1/tasks/{id}");
    common::eventually(WAIT, what, || {
        let http = http.clone();
        let url = url.clone();
        let done = &done;
        async move {
            let task = common::get_json(&http, &url).await;
            done(&task).then_some(task)
        }
    })
    .await
}

/// The Starling metric names a PromQL expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("starling_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| exprs(item, out)),
        _ => {}
    }
}

#[tokio::test]
async fn metrics_count_nodes_tasks_the_queue_and_decision_time() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::start_coordinator(dir.path(), |_| {}).await;
    let rest = running.rest_url();
    let http = reqwest::Client::new();

    // Nothing yet: every state is listed, at zero; no round has decided.
    let text = scrape(&http, &rest).await;
    for state in ["online", "suspect", "offline", "revoked"] {
        assert_eq!(
            value(&text, &format!("starling_nodes{{state=\"{state}\"}}")),
            0.0
        );
    }
    assert_eq!(value(&text, "starling_queue_length"), 0.0);
    assert_eq!(
        value(&text, "starling_placement_decision_seconds_count"),
        0.0
    );
    assert!(text.contains("# TYPE starling_placement_decision_seconds histogram"));

    common::stand_in_agent(running.mqtt_url(), "metrics-a").await;
    common::eventually(WAIT, "metrics-a online in /metrics", || {
        let http = http.clone();
        let rest = rest.clone();
        async move {
            let text = scrape(&http, &rest).await;
            (sample(&text, "starling_nodes{state=\"online\"}") == Some(1.0)).then_some(())
        }
    })
    .await;

    // A task placed and run: the histogram has observed its round, and the
    // queue is empty again.
    let stored = common::upload(&http, &rest, common::minimal_wasm()).await;
    let digest = stored["digest"].as_str().unwrap().to_string();
    let task = common::submit(
        &http,
        &rest,
        &json!({"artifact": digest, "input_text": "hi"}),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();
    let done = task_until(&http, &rest, &id, "the task to succeed", |task| {
        task["state"] == "succeeded"
    })
    .await;
    assert_eq!(done["explanation"]["considered"], 1, "{done}");
    assert_eq!(done["explanation"]["filtered"], json!([]), "{done}");
    let text = scrape(&http, &rest).await;
    assert_eq!(value(&text, "starling_tasks{state=\"succeeded\"}"), 1.0);
    assert_eq!(value(&text, "starling_queue_length"), 0.0);
    let rounds = value(&text, "starling_placement_decision_seconds_count");
    assert!(rounds >= 1.0, "{text}");
    assert_eq!(
        value(
            &text,
            "starling_placement_decision_seconds_bucket{le=\"+Inf\"}"
        ),
        rounds
    );
    assert!(value(&text, "starling_placement_decision_seconds_sum") > 0.0);
    let buckets: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with("starling_placement_decision_seconds_bucket"))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(buckets.len() > 10, "{text}");
    assert!(buckets.windows(2).all(|pair| pair[0] <= pair[1]), "{text}");

    // A task no node can run (it wants an OpenCL device) is refused at
    // once, with the reason...
    let refused = http
        .post(format!("{rest}/api/v1/tasks"))
        .json(&json!({"artifact": digest, "demand": {"gpu": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"], "no_capable_node", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("1 × no OpenCL device"),
        "{refused}"
    );
    // ...or, asked to wait for such a node, parked: counted in the queue,
    // and its explanation names the node and the reason.
    let held = common::submit(
        &http,
        &rest,
        &json!({"artifact": digest, "demand": {"gpu": true}, "wait_for_node": true}),
    )
    .await;
    let held_id = held["id"].as_str().unwrap().to_string();
    let held = task_until(&http, &rest, &held_id, "the hold's explanation", |task| {
        task["explanation"].is_object()
    })
    .await;
    assert_eq!(held["state"], "pending", "{held}");
    let explanation = &held["explanation"];
    assert_eq!(explanation["considered"], 1, "{held}");
    assert_eq!(explanation["policy"], "capability check", "{held}");
    assert_eq!(
        explanation["filtered"],
        json!([{"reason": "gpu", "count": 1, "nodes": ["metrics-a"]}]),
        "{held}"
    );
    let text = scrape(&http, &rest).await;
    assert_eq!(value(&text, "starling_queue_length"), 1.0);
    assert_eq!(value(&text, "starling_tasks{state=\"pending\"}"), 1.0);
    assert!(value(&text, "starling_tasks_parked_total") >= 1.0, "{text}");

    // An event stream open is one client more; closed, one fewer.
    let before = value(&text, "starling_event_stream_clients");
    let stream = http
        .get(format!("{rest}/api/v1/events"))
        .send()
        .await
        .unwrap();
    assert!(stream.status().is_success(), "{}", stream.status());
    let clients = |expected: f64| {
        let http = http.clone();
        let rest = rest.clone();
        async move {
            common::eventually(WAIT, &format!("{expected} event-stream clients"), || {
                let http = http.clone();
                let rest = rest.clone();
                async move {
                    let text = scrape(&http, &rest).await;
                    (sample(&text, "starling_event_stream_clients") == Some(expected))
                        .then_some(text)
                }
            })
            .await
        }
    };
    clients(before + 1.0).await;
    drop(stream);
    let text = clients(before).await;

    // The dashboard's every query reads metrics this coordinator exports.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/starling.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    assert_eq!(dashboard["__inputs"][0]["name"], "DS_PROMETHEUS");
    let mut found = Vec::new();
    exprs(&dashboard, &mut found);
    assert!(found.len() >= 7, "{found:?}");
    for expr in &found {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr} reads no Starling metric");
        for name in names {
            let exported = text.lines().any(|line| {
                line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name}{{"))
            });
            assert!(
                exported,
                "the dashboard queries {name}, which /metrics does not export ({expr})"
            );
        }
    }
    running.shutdown().await;
}

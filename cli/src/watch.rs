//! `starling watch`: the coordinator's live events, one line each (or one
//! JSON object per line with `--json`), until interrupted. A dropped
//! connection is resumed from the last event seen; when the coordinator
//! says events were lost (`reset`), the gap is reported and watching goes on.

use std::io::Write;
use std::time::Duration;

use starling_api::client::{Client, EventFilter, StreamMessage};
use starling_api::{LiveEvent, StreamReset};

/// Wait before reconnecting after the coordinator closed the stream.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Why watching stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The coordinator refused the stream or could not be reached.
    #[error(transparent)]
    Client(#[from] starling_api::client::ClientError),
    /// Standard output is gone (a closed pipe).
    #[error("cannot write to stdout: {0}")]
    Output(#[from] std::io::Error),
}

/// Prints events matching `filter` until interrupted.
pub async fn watch(client: &Client, filter: &EventFilter, json: bool) -> Result<(), WatchError> {
    let mut resume: Option<String> = None;
    loop {
        let mut stream = tokio::select! {
            stream = client.events(filter, resume.as_deref()) => stream?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        loop {
            let message = tokio::select! {
                message = stream.next() => message,
                _ = tokio::signal::ctrl_c() => return Ok(()),
            };
            match message {
                None => break,
                Some(Err(error)) => {
                    eprintln!("starling: {error}; reconnecting");
                    break;
                }
                Some(Ok(StreamMessage::Event { id, event })) => {
                    print_event(&id, &event, json)?;
                }
                Some(Ok(StreamMessage::Reset(reset))) => report_reset(&reset, json)?,
            }
        }
        resume = stream.last_id().map(str::to_owned);
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

fn write_line(line: &str) -> Result<(), WatchError> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

fn print_event(id: &str, event: &LiveEvent, json: bool) -> Result<(), WatchError> {
    if json {
        let mut value = serde_json::to_value(event).map_err(std::io::Error::other)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("id".to_owned(), serde_json::Value::String(id.to_owned()));
        }
        return write_line(&value.to_string());
    }
    write_line(&describe(event))
}

fn report_reset(reset: &StreamReset, json: bool) -> Result<(), WatchError> {
    if json {
        let line = serde_json::json!({ "kind": "reset", "reason": reset.reason, "message": reset.message });
        return write_line(&line.to_string());
    }
    eprintln!(
        "starling: events were lost ({}): {}",
        reset.reason, reset.message
    );
    Ok(())
}

/// One event as a line for people.
pub fn describe(event: &LiveEvent) -> String {
    match event {
        LiveEvent::Task(change) => {
            let place = match (&change.node_id, &change.site) {
                (Some(node), _) => format!(" on {node}"),
                (None, Some(site)) => format!(" at site {site}"),
                (None, None) => String::new(),
            };
            let power = change
                .power_level
                .map(|level| format!(" power {level}"))
                .unwrap_or_default();
            let reason = change
                .reason
                .as_deref()
                .map(|reason| format!(" ({reason})"))
                .unwrap_or_default();
            format!(
                "task  {} {} attempt {}{place}{power}{reason}",
                change.task_id, change.status, change.attempt
            )
        }
        LiveEvent::Node(change) => {
            format!("node  {} {}", change.node_id, change.change.as_str())
        }
        LiveEvent::Telemetry(sample) => {
            let rtt = sample
                .rtt_ms
                .map(|rtt| format!(" rtt {rtt:.1} ms"))
                .unwrap_or_default();
            format!(
                "load  {} cpu {:.0}% mem {:.0}% power {} running {}{rtt}",
                sample.node_id,
                sample.cpu_load * 100.0,
                sample.memory_used * 100.0,
                sample.power_level,
                sample.running_tasks
            )
        }
        LiveEvent::Site(change) => format!("site  {} {}", change.site, change.state.as_str()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use starling_api::{TaskChange, TaskStatus};

    #[test]
    fn lines_say_what_changed_where() {
        let event = LiveEvent::Task(TaskChange {
            task_id: "t1".into(),
            status: TaskStatus::Failed,
            attempt: 2,
            node_id: Some("pi-4".into()),
            site: None,
            power_level: Some(1),
            reason: Some("node_lost".into()),
            at_ms: 1,
        });
        assert_eq!(
            describe(&event),
            "task  t1 failed attempt 2 on pi-4 power 1 (node_lost)"
        );
    }
}

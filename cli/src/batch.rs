//! `starling submit-batch FILE.jsonl`: many tasks in one request
//! (`POST /api/v1/tasks:batch`), all created or none.

use std::io::Read;
use std::path::Path;

use starling_api::client::{Client, ClientError};
use starling_api::{batch_item_index, BatchSubmitted, SubmitTask, MAX_BATCH_TASKS};

/// Why a batch was not submitted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitBatchError {
    /// The file cannot be read or does not hold a batch; nothing was sent.
    #[error("{0}")]
    Input(String),
    /// The coordinator refused the batch (a refused item named by its line) or failed.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What `--help` shows after the options.
pub(crate) const SUBMIT_BATCH_HELP: &str = "\
Each non-blank line of FILE is one task, as POST /api/v1/tasks takes it (SubmitTask in
GET /api/v1/openapi.json); the artifact is a digest `starling publish` printed:

  {\"artifact\": \"9f86d0…0a08\", \"input_text\": \"3\"}
  {\"artifact\": \"9f86d0…0a08\", \"args\": [\"--n\", \"4\"], \"priority\": 5, \"deadline_ms\": 60000}

At most 1000 tasks and 8 MiB a batch. Every task is checked before any is created: if
one is refused, none is, and the error names its line. Prints the new task ids in the
file's order, one a line (--json: the created tasks).

Examples:
  starling submit-batch tasks.jsonl
  seq 1 500 | jq -c '{artifact: \"9f86d0…0a08\", input_text: tostring}' | starling submit-batch -
  starling submit-batch tasks.jsonl | xargs -n1 starling task --wait

Exit status: 0 all created, 2 the file or a task refused (nothing created), 3 coordinator
unreachable.";

/// The tasks of a JSON-lines text and the line (from 1) each came from;
/// blank lines are skipped.
pub(crate) fn parse_lines(
    text: &str,
    source: &str,
) -> Result<Vec<(usize, SubmitTask)>, SubmitBatchError> {
    let mut tasks = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let task = serde_json::from_str::<SubmitTask>(line).map_err(|error| {
            SubmitBatchError::Input(format!(
                "line {number} of {source} is not a task: {error}; each line is one JSON object like {{\"artifact\": \"DIGEST\"}}"
            ))
        })?;
        tasks.push((number, task));
    }
    if tasks.is_empty() {
        return Err(SubmitBatchError::Input(format!(
            "{source} holds no tasks; give one JSON object a line"
        )));
    }
    if tasks.len() > MAX_BATCH_TASKS {
        return Err(SubmitBatchError::Input(format!(
            "{source} holds {} tasks; a batch takes at most {MAX_BATCH_TASKS}: split it (split -l {MAX_BATCH_TASKS} {source})",
            tasks.len()
        )));
    }
    Ok(tasks)
}

/// Submits the tasks of `file` (`-`: stdin) as one batch.
pub(crate) async fn submit_file(
    client: &Client,
    file: &Path,
) -> Result<BatchSubmitted, SubmitBatchError> {
    let source = file.display().to_string();
    let mut text = String::new();
    let read = if source == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|read| text = read)
    };
    read.map_err(|error| SubmitBatchError::Input(format!("cannot read {source}: {error}")))?;
    let numbered = parse_lines(&text, &source)?;
    let (lines, tasks): (Vec<usize>, Vec<SubmitTask>) = numbered.into_iter().unzip();
    client
        .submit_batch(&tasks)
        .await
        .map_err(|error| name_the_line(error, &lines, &source).into())
}

/// A refusal that names a batch item, told as the line of the file it came from.
fn name_the_line(error: ClientError, lines: &[usize], source: &str) -> ClientError {
    match error {
        ClientError::Api {
            status,
            code,
            label,
            message,
        } => {
            let line = batch_item_index(&message).and_then(|index| lines.get(index));
            let message = match line {
                Some(line) => format!("line {line} of {source}: {message}; nothing was created"),
                None => message,
            };
            ClientError::Api {
                status,
                code,
                label,
                message,
            }
        }
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use starling_api::ErrorCode;

    #[test]
    fn lines_are_tasks_and_blank_lines_are_skipped() {
        let tasks = parse_lines(
            "{\"artifact\": \"aa\"}\n\n  \n{\"artifact\": \"bb\", \"priority\": 3}\n",
            "t.jsonl",
        )
        .unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!((tasks[0].0, tasks[0].1.artifact.as_str()), (1, "aa"));
        assert_eq!((tasks[1].0, tasks[1].1.priority), (4, 3));
    }

    #[test]
    fn a_bad_line_is_named_and_sends_nothing() {
        let error = parse_lines("{\"artifact\": \"aa\"}\n{\"artifact\": 5}\n", "t.jsonl")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("line 2 of t.jsonl is not a task"),
            "{error}"
        );
        let error = parse_lines("\n\n", "t.jsonl").unwrap_err().to_string();
        assert!(error.contains("holds no tasks"), "{error}");
        let many = "{\"artifact\": \"aa\"}\n".repeat(MAX_BATCH_TASKS + 1);
        let error = parse_lines(&many, "t.jsonl").unwrap_err();
        assert!(
            matches!(&error, SubmitBatchError::Input(m) if m.contains("at most 1000")),
            "{error}"
        );
    }

    #[test]
    fn a_refused_item_is_told_as_its_line() {
        let refusal = ClientError::Api {
            status: 404,
            code: ErrorCode::ArtifactNotFound,
            label: "artifact_not_found".into(),
            message: starling_api::batch_item_message(1, "no artifact bb"),
        };
        let error = name_the_line(refusal, &[1, 4], "t.jsonl");
        assert_eq!(error.code(), Some(ErrorCode::ArtifactNotFound));
        let text = error.to_string();
        assert!(
            text.starts_with("line 4 of t.jsonl: tasks[1]: no artifact bb; nothing was created"),
            "{text}"
        );
    }
}

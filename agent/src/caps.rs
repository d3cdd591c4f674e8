//! This node's caps on what one task may ask for: memory, wall time and
//! output. The coordinator bounds every submission
//! (`starling_proto::limits::MAX_TASK_*`), but those maxima are sized for the
//! largest node; a small device sets its own, lower caps here. An assignment
//! whose limits exceed them is refused with `failed/agent_busy` and a message
//! naming the cap (so the coordinator places the task elsewhere, and the
//! operator reads why), never clamped: a task that declared 4 GiB and got
//! 1 GiB would fail later, further from the reason.
//!
//! Settings come in through [`crate::config`] (`--max-task-memory`,
//! `--max-task-wall`, `--max-task-output`, or the file's `[task-caps]`);
//! [`CapSettings::resolve`] fills what is unset with defaults sized to the
//! device.

use std::time::Duration;

use starling_proto::limits::MAX_TASK_OUTPUT_BYTES;
use starling_proto::ExecLimits;

/// The share of the device's memory one task may ask for by default: half,
/// so a task at its limit still leaves the OS, the agent and its journal room.
pub const DEFAULT_MEMORY_SHARE: (u64, u64) = (1, 2);

/// The memory cap when the device's memory cannot be read: 1 GiB, what the
/// smallest devices Starling targets (a Raspberry Pi class board) can spare.
pub const FALLBACK_MEMORY_CAP_BYTES: u64 = 1024 * 1024 * 1024;

/// The default wall-time cap: one hour. Edge tasks run for seconds to
/// minutes; a slot held for longer is the operator's choice to allow.
pub const DEFAULT_WALL_CAP: Duration = Duration::from_secs(60 * 60);

/// The default output cap: the coordinator's own maximum. Output travels
/// inline in the final event, so the runner cuts it to
/// `MAX_INLINE_OUTPUT_BYTES` whatever the limit says; this cap matters only
/// when an operator lowers it.
pub const DEFAULT_OUTPUT_CAP_BYTES: u64 = MAX_TASK_OUTPUT_BYTES;

/// The caps as configured; each one left unset takes its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapSettings {
    /// Largest memory limit a task may have here, in bytes.
    pub memory_bytes: Option<u64>,
    /// Longest wall-time limit a task may have here.
    pub wall: Option<Duration>,
    /// Largest output limit a task may have here, in bytes.
    pub output_bytes: Option<u64>,
}

/// Why cap settings are refused.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// A size does not parse.
    #[error(
        "invalid size {text:?} for {setting}: write a number with a unit, like 512MiB or 2GiB"
    )]
    Size {
        /// The setting.
        setting: &'static str,
        /// The text given.
        text: String,
    },
    /// A duration does not parse.
    #[error("invalid duration {text:?} for {setting}: write a number with a unit, like 30s or 2h")]
    Duration {
        /// The setting.
        setting: &'static str,
        /// The text given.
        text: String,
    },
    /// A cap of zero would refuse every task.
    #[error("{setting} must be positive: a zero cap refuses every task")]
    Zero {
        /// The setting.
        setting: &'static str,
    },
}

/// The config file's `[task-caps]` table, for example
/// `[task-caps]` / `memory = "2GiB"` / `wall = "2h"` / `output = "256KiB"`.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapsFile {
    memory: Option<String>,
    wall: Option<String>,
    output: Option<String>,
}

impl CapsFile {
    /// The settings the table gives.
    pub fn settings(&self) -> Result<CapSettings, CapsError> {
        Ok(CapSettings {
            memory_bytes: self
                .memory
                .as_deref()
                .map(|text| parse_cap_size("task-caps.memory", text))
                .transpose()?,
            wall: self
                .wall
                .as_deref()
                .map(|text| parse_cap_duration("task-caps.wall", text))
                .transpose()?,
            output_bytes: self
                .output
                .as_deref()
                .map(|text| parse_cap_size("task-caps.output", text))
                .transpose()?,
        })
    }
}

/// Parses a size cap (`512MiB`) for `setting`.
pub fn parse_cap_size(setting: &'static str, text: &str) -> Result<u64, CapsError> {
    starling_net::parse_size(text).map_err(|_| CapsError::Size {
        setting,
        text: text.to_owned(),
    })
}

/// Parses a duration cap (`2h`) for `setting`.
pub fn parse_cap_duration(setting: &'static str, text: &str) -> Result<Duration, CapsError> {
    starling_net::parse_duration(text).map_err(|_| CapsError::Duration {
        setting,
        text: text.to_owned(),
    })
}

impl CapSettings {
    /// Field by field, the first layer that sets it (layers in precedence order).
    pub fn merge<'a>(layers: impl IntoIterator<Item = &'a CapSettings>) -> Self {
        layers
            .into_iter()
            .fold(CapSettings::default(), |merged, layer| CapSettings {
                memory_bytes: merged.memory_bytes.or(layer.memory_bytes),
                wall: merged.wall.or(layer.wall),
                output_bytes: merged.output_bytes.or(layer.output_bytes),
            })
    }

    /// Refuses caps of zero.
    pub fn validate(&self) -> Result<(), CapsError> {
        let zero = [
            ("max-task-memory", self.memory_bytes == Some(0)),
            ("max-task-wall", self.wall == Some(Duration::ZERO)),
            ("max-task-output", self.output_bytes == Some(0)),
        ];
        match zero.into_iter().find(|(_, is_zero)| *is_zero) {
            Some((setting, _)) => Err(CapsError::Zero { setting }),
            None => Ok(()),
        }
    }

    /// The caps for this device: the settings given, and for the rest the
    /// defaults, the memory cap from the device's total memory.
    pub fn resolve(&self) -> TaskCaps {
        self.resolve_for(device_memory_bytes())
    }

    /// [`CapSettings::resolve`] for a device with `total_memory_bytes`
    /// (`None` when it could not be read).
    pub fn resolve_for(&self, total_memory_bytes: Option<u64>) -> TaskCaps {
        let (numerator, denominator) = DEFAULT_MEMORY_SHARE;
        let device_share = total_memory_bytes
            .filter(|total| *total > 0)
            .map(|total| total / denominator * numerator)
            .unwrap_or(FALLBACK_MEMORY_CAP_BYTES);
        TaskCaps {
            memory_bytes: self.memory_bytes.unwrap_or(device_share),
            wall_ms: u64::try_from(self.wall.unwrap_or(DEFAULT_WALL_CAP).as_millis())
                .unwrap_or(u64::MAX),
            output_bytes: self.output_bytes.unwrap_or(DEFAULT_OUTPUT_CAP_BYTES),
        }
    }
}

/// The device's total memory, if sysinfo can read it.
fn device_memory_bytes() -> Option<u64> {
    let mut system = sysinfo::System::new().ok()?;
    system.refresh_memory();
    Some(system.total_memory())
}

/// The caps in force: the most a task's limits may say on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskCaps {
    /// Largest memory limit, in bytes.
    pub memory_bytes: u64,
    /// Longest wall-time limit, in milliseconds.
    pub wall_ms: u64,
    /// Largest output limit, in bytes.
    pub output_bytes: u64,
}

/// An assignment's limit over this node's cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the task's {limit} limit of {asked} {unit} is over this node's cap of {cap} {unit} ({setting}); the coordinator places it elsewhere")]
pub struct OverCap {
    /// Which limit: `memory`, `wall-time` or `output`.
    pub limit: &'static str,
    /// What the assignment asked for.
    pub asked: u64,
    /// This node's cap.
    pub cap: u64,
    /// `bytes` or `ms`.
    pub unit: &'static str,
    /// The agent setting that sets the cap.
    pub setting: &'static str,
}

impl TaskCaps {
    /// Caps that admit anything: for tests and embedders that bound tasks
    /// some other way.
    pub const UNBOUNDED: TaskCaps = TaskCaps {
        memory_bytes: u64::MAX,
        wall_ms: u64::MAX,
        output_bytes: u64::MAX,
    };

    /// Whether `limits` fit these caps; the first limit over its cap otherwise.
    pub fn admit(&self, limits: &ExecLimits) -> Result<(), OverCap> {
        let checks = [
            (
                "memory",
                limits.memory_bytes,
                self.memory_bytes,
                "bytes",
                "--max-task-memory",
            ),
            (
                "wall-time",
                limits.wall_ms,
                self.wall_ms,
                "ms",
                "--max-task-wall",
            ),
            (
                "output",
                limits.output_bytes,
                self.output_bytes,
                "bytes",
                "--max-task-output",
            ),
        ];
        match checks.into_iter().find(|(_, asked, cap, _, _)| asked > cap) {
            Some((limit, asked, cap, unit, setting)) => Err(OverCap {
                limit,
                asked,
                cap,
                unit,
                setting,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    #[test]
    fn defaults_are_sized_to_the_device() {
        let caps = CapSettings::default().resolve_for(Some(8 * GIB));
        assert_eq!(caps.memory_bytes, 4 * GIB);
        assert_eq!(caps.wall_ms, 3_600_000);
        assert_eq!(caps.output_bytes, MAX_TASK_OUTPUT_BYTES);
        let unknown = CapSettings::default().resolve_for(None);
        assert_eq!(unknown.memory_bytes, FALLBACK_MEMORY_CAP_BYTES);
        // The real device: some memory, never the whole of it.
        let here = CapSettings::default().resolve();
        assert!(here.memory_bytes > 0);
    }

    #[test]
    fn settings_win_over_defaults_and_the_first_layer_wins() {
        let flags = CapSettings {
            memory_bytes: Some(GIB),
            ..CapSettings::default()
        };
        let file = CapsFile {
            memory: Some("2GiB".into()),
            wall: Some("2h".into()),
            output: None,
        }
        .settings()
        .unwrap();
        let merged = CapSettings::merge([&flags, &file]);
        assert_eq!(merged.memory_bytes, Some(GIB));
        assert_eq!(merged.wall, Some(Duration::from_secs(7200)));
        assert_eq!(merged.output_bytes, None);
        let caps = merged.resolve_for(Some(64 * GIB));
        assert_eq!((caps.memory_bytes, caps.wall_ms), (GIB, 7_200_000));
    }

    #[test]
    fn bad_and_zero_settings_are_refused_by_name() {
        let bad = CapsFile {
            memory: Some("lots".into()),
            ..CapsFile::default()
        };
        assert!(bad
            .settings()
            .unwrap_err()
            .to_string()
            .contains("task-caps.memory"));
        let zero = CapSettings {
            wall: Some(Duration::ZERO),
            ..CapSettings::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max-task-wall"));
        assert!(CapSettings::default().validate().is_ok());
    }

    #[test]
    fn limits_over_a_cap_are_refused_naming_it() {
        let caps = TaskCaps {
            memory_bytes: 64 << 20,
            wall_ms: 60_000,
            output_bytes: 1 << 20,
        };
        assert_eq!(caps.admit(&ExecLimits::default()), Ok(()));
        let at_caps = ExecLimits {
            memory_bytes: 64 << 20,
            wall_ms: 60_000,
            output_bytes: 1 << 20,
        };
        assert_eq!(caps.admit(&at_caps), Ok(()));
        // The finding of issue 15: a tiny task with an unbounded limit.
        let unbounded = ExecLimits {
            memory_bytes: u64::MAX,
            ..ExecLimits::default()
        };
        let refusal = caps.admit(&unbounded).unwrap_err();
        assert_eq!((refusal.limit, refusal.cap), ("memory", 64 << 20));
        assert!(
            refusal.to_string().contains("--max-task-memory"),
            "{refusal}"
        );
        let long = ExecLimits {
            wall_ms: 60_001,
            ..ExecLimits::default()
        };
        assert_eq!(caps.admit(&long).unwrap_err().setting, "--max-task-wall");
        let chatty = ExecLimits {
            output_bytes: (1 << 20) + 1,
            ..ExecLimits::default()
        };
        assert_eq!(caps.admit(&chatty).unwrap_err().limit, "output");
        assert_eq!(TaskCaps::UNBOUNDED.admit(&unbounded), Ok(()));
    }
}

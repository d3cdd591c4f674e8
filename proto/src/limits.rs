//! Bounds on what a peer may send. Decoders enforce them before and after
//! parsing, so a hostile or broken peer costs a typed error, never a panic or an
//! unbounded allocation.

/// Largest encoded message accepted, in bytes. The MQTT client and broker are
/// configured with the same bound so oversize packets never reach the decoder.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Deepest nesting of CBOR arrays, maps and tags accepted. Starling's messages
/// nest at most four levels; the margin tolerates future optional fields.
pub const MAX_NESTING_DEPTH: usize = 16;

/// Largest task input carried inline in an assignment, in bytes.
pub const MAX_INLINE_INPUT_BYTES: usize = 512 * 1024;

/// Largest task output carried inline in an event, in bytes.
pub const MAX_INLINE_OUTPUT_BYTES: usize = 512 * 1024;

/// Longest node id, in bytes.
pub const NODE_ID_LEN: usize = 64;
/// Longest task id, in bytes.
pub const TASK_ID_LEN: usize = 64;
/// Longest label key, in bytes.
pub const LABEL_KEY_LEN: usize = 32;
/// Longest label value, in bytes.
pub const LABEL_VALUE_LEN: usize = 64;
/// Most labels on one node.
pub const MAX_LABELS: usize = 32;
/// Longest short name (OS, arch, interface, vendor), in bytes.
pub const NAME_LEN: usize = 64;
/// Longest descriptive text (CPU model, GPU name, mount point), in bytes.
pub const TEXT_LEN: usize = 128;
/// Longest human-readable message (failure reasons), in bytes.
pub const MESSAGE_LEN: usize = 2048;
/// Most GPU or accelerator devices reported by one node.
pub const MAX_GPUS: usize = 8;
/// Most unfinished attempts one telemetry report lists; a node holding more
/// lists these and says the list is incomplete.
pub const MAX_LISTED_ATTEMPTS: usize = 32;
/// Most disks reported by one node.
pub const MAX_DISKS: usize = 16;
/// Most network interfaces reported by one node.
pub const MAX_INTERFACES: usize = 16;
/// Most power levels one node offers.
pub const MAX_POWER_LEVELS: usize = 8;
/// Most runtimes one node supports.
pub const MAX_RUNTIMES: usize = 4;
/// Most arguments passed to a task.
pub const MAX_ARGS: usize = 16;
/// Longest single task argument, in bytes.
pub const ARG_LEN: usize = 256;
/// Longest URL carried in a message, in bytes.
pub const URL_LEN: usize = 256;

/// Largest wall-clock limit a task may declare, in milliseconds: 24 hours.
/// Edge tasks run for seconds to minutes; a day covers any batch job we have
/// seen, and a slot held longer is better split into tasks. The coordinator
/// refuses more at submission (`invalid_limits`), so a limit like `u64::MAX`
/// never reaches a node or the arithmetic that adds grace periods to it.
pub const MAX_TASK_WALL_MS: u64 = 24 * 60 * 60 * 1000;

/// Largest memory limit a task may declare, in bytes: 256 GiB. Above the
/// memory of any single host or accelerator a task is placed on (wasm32
/// modules address at most 4 GiB; the largest GPUs hold under 200 GB), so no
/// real task is refused, while unbounded values are. Each node refuses
/// limits over its own, smaller cap (the agent's `--max-task-memory`).
pub const MAX_TASK_MEMORY_BYTES: u64 = 256 * 1024 * 1024 * 1024;

/// Largest output limit a task may declare, in bytes: 64 MiB. Output travels
/// inline in the final event, so every consumer clamps it to
/// [`MAX_INLINE_OUTPUT_BYTES`] anyway; the headroom keeps manifests that ask
/// for a few MiB (as the OpenCL benchmarks do) valid, and refuses the
/// unbounded values that meant nothing.
pub const MAX_TASK_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;

//! Work sent to a node and what the node says about it.

use alloc::vec::Vec;

use heapless::String;
use serde::{Deserialize, Serialize};

use crate::capability::Runtime;
use crate::ids::{Digest, NodeId, TaskId};
use crate::limits::{ARG_LEN, MAX_ARGS, MESSAGE_LEN, URL_LEN};

/// Limits the agent enforces while a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecLimits {
    /// Wall-clock limit in milliseconds.
    pub wall_ms: u64,
    /// Memory limit in bytes: linear memory for wasm, device buffers for OpenCL.
    pub memory_bytes: u64,
    /// Output (stdout) limit in bytes.
    pub output_bytes: u64,
}

impl Default for ExecLimits {
    fn default() -> Self {
        Self {
            wall_ms: 10_000,
            memory_bytes: 64 * 1024 * 1024,
            output_bytes: 256 * 1024,
        }
    }
}

/// What a wasm task may use beyond stdin, stdout, args and its memory.
/// Everything is off unless the manifest asks for it and the node's policy
/// allows it; a module that is not granted a capability sees a fixed value
/// (the clock reads the Unix epoch, random bytes are zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Grants {
    /// The real wall and monotonic clocks.
    #[serde(default)]
    pub clock: bool,
    /// Real random bytes.
    #[serde(default)]
    pub random: bool,
}

/// A publisher's signature over an artifact's digest, which a node's policy
/// may require (and restrict to keys it trusts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublisherSignature {
    /// The publisher's ed25519 public key (32 bytes).
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The ed25519 signature of the artifact's 32-byte digest (64 bytes).
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

/// Why a publisher signature does not verify.
#[cfg(feature = "ed25519")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublisherSignatureError {
    /// The key is not 32 bytes long.
    #[error("the key is {0} bytes where an ed25519 key has 32")]
    KeyLength(usize),
    /// 32 bytes that are not a point of the curve.
    #[error("the key is not an ed25519 public key")]
    NotAKey,
    /// The signature is not 64 bytes long.
    #[error("{0} bytes where an ed25519 signature has 64")]
    SignatureLength(usize),
    /// A well-formed signature by another key or over other bytes.
    #[error("it does not verify over {digest} with key {key}")]
    Mismatch {
        /// The digest it was checked over, hex.
        digest: Digest,
        /// The key it was checked with, hex.
        key: KeyHex,
    },
}

/// An ed25519 public key written as 64 hex digits.
#[cfg(feature = "ed25519")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHex(pub [u8; 32]);

#[cfg(feature = "ed25519")]
impl core::fmt::Display for KeyHex {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

#[cfg(feature = "ed25519")]
impl PublisherSignature {
    /// Checks the signature over `digest` (ed25519 `verify_strict`) and
    /// returns the publisher's key. The coordinator checks a signature with
    /// this before it stores it, the agent before it runs the artifact.
    pub fn verify(&self, digest: &Digest) -> Result<[u8; 32], PublisherSignatureError> {
        use ed25519_dalek::{Signature, VerifyingKey};
        let key: [u8; 32] = self
            .key
            .as_slice()
            .try_into()
            .map_err(|_| PublisherSignatureError::KeyLength(self.key.len()))?;
        let verifying =
            VerifyingKey::from_bytes(&key).map_err(|_| PublisherSignatureError::NotAKey)?;
        let signature = Signature::from_slice(&self.signature)
            .map_err(|_| PublisherSignatureError::SignatureLength(self.signature.len()))?;
        verifying
            .verify_strict(&digest.0, &signature)
            .map_err(|_| PublisherSignatureError::Mismatch {
                digest: *digest,
                key: KeyHex(key),
            })?;
        Ok(key)
    }
}

/// Machine code the coordinator compiled from an assignment's module for the
/// node's engine and target (`Capability::wasm`). The assignment's signature
/// covers this digest, so the agent loads only the bytes the coordinator made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecompiledModule {
    /// sha256 of the compiled bytes; the agent refuses bytes that hash otherwise.
    pub digest: Digest,
    /// Where to fetch them (HTTP GET).
    pub url: String<URL_LEN>,
}

/// An instruction to run one attempt of a task, signed by the coordinator.
///
/// The signature covers every other field (see [`Assignment::signed_bytes`]),
/// so an assignment binds a task, an attempt, a node and a validity window:
/// an agent refuses one for another node, one outside its window, and one
/// whose signature does not verify against the coordinator key it pinned at
/// enrollment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// Protocol version.
    pub v: u16,
    /// The node this assignment is for.
    pub node_id: NodeId,
    /// The task.
    pub task_id: TaskId,
    /// Attempt number, from 1; a retry on another node gets a new attempt.
    pub attempt: u32,
    /// The runtime to use.
    pub runtime: Runtime,
    /// sha256 of the module; the agent refuses bytes that hash otherwise.
    pub artifact: Digest,
    /// Where to fetch the module if it is not cached (HTTP GET).
    pub artifact_url: String<URL_LEN>,
    /// Arguments (argv after the program name).
    pub args: heapless::Vec<String<ARG_LEN>, MAX_ARGS>,
    /// Input, given to the task on stdin.
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// Limits to enforce.
    pub limits: ExecLimits,
    /// The power level the coordinator chose for this task.
    pub power_level: u8,
    /// Deadline as Unix time in milliseconds, if the task has one.
    pub deadline_unix_ms: Option<u64>,
    /// What the task may use (wasm); the node's policy may narrow it further.
    #[serde(default)]
    pub grants: Grants,
    /// The artifact publisher's signature, if the artifact was signed.
    #[serde(default)]
    pub publisher: Option<PublisherSignature>,
    /// The module compiled ahead of time for this node, when it has no
    /// compiler. Left out of the encoding when absent, so that an agent from
    /// before this field verifies the signature of every assignment it can run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precompiled: Option<PrecompiledModule>,
    /// The term of the coordinator replica that sent it, when the site runs
    /// replicas that elect a leader: every new leader's term is higher, and
    /// an agent refuses an assignment from a lower term than the highest it
    /// has seen (one sent by a deposed leader). Left out of the encoding
    /// when absent, as `precompiled` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<u64>,
    /// When the coordinator signed it (Unix ms). Every re-send is signed anew.
    pub issued_unix_ms: u64,
    /// After this (Unix ms) the agent refuses it as expired or replayed.
    pub expires_unix_ms: u64,
    /// The coordinator's ed25519 signature of [`Assignment::signed_bytes`]
    /// (64 bytes); empty when the coordinator does not sign.
    #[serde(with = "serde_bytes", default)]
    pub signature: Vec<u8>,
}

impl Assignment {
    /// The bytes the coordinator signs and the agent verifies: the CBOR
    /// encoding of this assignment with an empty signature. The encoding is
    /// canonical for a given value (fields in declaration order, no floats),
    /// so both sides compute the same bytes.
    pub fn signed_bytes(&self) -> Result<Vec<u8>, crate::EncodeError> {
        let mut unsigned = self.clone();
        unsigned.signature = Vec::new();
        crate::encode(&unsigned)
    }
}

/// An instruction to stop an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    /// Protocol version.
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt to stop.
    pub attempt: u32,
}

/// Where an attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// The agent took the assignment.
    Accepted,
    /// The task is executing.
    Running,
    /// It finished; `output` holds its stdout.
    Succeeded,
    /// It failed; `reason` and `message` say why.
    Failed,
    /// It was cancelled before finishing.
    Cancelled,
    /// The agent refused the assignment without running anything: its
    /// signature did not verify, it was for another node, it was expired or
    /// replayed, or the node's policy forbids it. `message` says which. The
    /// coordinator records it as history and does not change the task on it
    /// (a forged assignment must not be able to fail a real task).
    Rejected,
}

impl TaskState {
    /// Whether no further event follows this one for the same attempt.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Rejected
        )
    }
}

/// Why an attempt failed, as a code a program can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The module could not be fetched.
    FetchFailed,
    /// The fetched bytes did not match the digest.
    DigestMismatch,
    /// The bytes are not a valid module.
    InvalidModule,
    /// The agent cannot run this runtime.
    UnsupportedRuntime,
    /// The kernel did not compile for the device; the message holds the build log.
    BuildFailed,
    /// The input or arguments do not fit the task's declared layout.
    InvalidInput,
    /// The wall-clock limit was reached.
    Timeout,
    /// The module tried to grow memory past its limit.
    MemoryLimit,
    /// The module wrote more output than allowed.
    OutputLimit,
    /// The module trapped.
    Trap,
    /// The module exited with a non-zero status.
    ExitCode,
    /// The agent is shutting down or out of capacity.
    AgentBusy,
    /// The node's policy refuses the task: a grant the node does not allow,
    /// or an artifact not signed by a publisher the node trusts.
    PolicyRefused,
    /// Anything else.
    Internal,
}

/// Measurements of a finished attempt.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ExecMetrics {
    /// Wall time of the execution, in milliseconds.
    pub wall_ms: u64,
    /// Time spent compiling or loading the module, in milliseconds.
    pub compile_ms: u64,
    /// Peak linear memory, in bytes.
    pub peak_memory_bytes: u64,
    /// Whether the module came from the agent's cache.
    pub cache_hit: bool,
}

/// The power level an attempt ran under, as the agent applied it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerApplied {
    /// The level the coordinator chose for the attempt.
    pub requested: u8,
    /// The level in force: the highest any attempt running beside it asked
    /// for (they share the CPU's frequency ceiling). In a terminal event, the
    /// highest that was in force while it ran.
    pub in_force: u8,
    /// The CPU frequency ceiling of that level, in kHz (the highest over the
    /// CPU's policies); none where the node has no power control.
    pub max_frequency_khz: Option<u32>,
}

/// A change in an attempt's state, sent by the agent (QoS 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Protocol version.
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The node sending it.
    pub node_id: NodeId,
    /// The new state.
    pub state: TaskState,
    /// Output, for `succeeded`.
    #[serde(with = "serde_bytes", default)]
    pub output: Vec<u8>,
    /// Failure code, for `failed`.
    pub reason: Option<FailureReason>,
    /// Message for people, for `failed`.
    pub message: Option<String<MESSAGE_LEN>>,
    /// Exit code of the module, when it exited.
    pub exit_code: Option<i32>,
    /// Measurements, for terminal states.
    pub metrics: Option<ExecMetrics>,
    /// The power level applied, for running and terminal states of an
    /// attempt that ran.
    #[serde(default)]
    pub power: Option<PowerApplied>,
}

impl TaskEvent {
    /// An event with only a state: accepted, running, cancelled.
    pub fn state(task_id: TaskId, attempt: u32, node_id: NodeId, state: TaskState) -> Self {
        Self {
            v: crate::PROTOCOL_VERSION,
            task_id,
            attempt,
            node_id,
            state,
            output: Vec::new(),
            reason: None,
            message: None,
            exit_code: None,
            metrics: None,
            power: None,
        }
    }

    /// A failure, with its message cut to fit the wire bound.
    pub fn failed(
        task_id: TaskId,
        attempt: u32,
        node_id: NodeId,
        reason: FailureReason,
        message: &str,
    ) -> Self {
        let mut event = Self::state(task_id, attempt, node_id, TaskState::Failed);
        event.reason = Some(reason);
        event.message = Some(truncate(message));
        event
    }
}

/// The coordinator's receipt for a [`TaskEvent`] (QoS 1, on the node's `ack`
/// channel): the event is durably recorded, so the agent may drop it from its
/// journal's outbox. Sent for duplicates too, since a duplicate means an
/// earlier receipt was lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventAck {
    /// Protocol version.
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The state of the event being acknowledged.
    pub state: TaskState,
}

/// Cuts text to the message bound on a character boundary.
pub fn truncate<const N: usize>(s: &str) -> String<N> {
    let mut out = String::new();
    for c in s.chars() {
        if out.push(c).is_err() {
            break;
        }
    }
    out
}

//! Starling's OpenCL tasks.
//!
//! An OpenCL task ships as a [`package::Package`]: the kernel's `.cl` source
//! and its [`spec::KernelSpec`] (entry point, arguments with element types and
//! length expressions, work sizes, device type), serialised as one JSON
//! document whose sha256 is the artifact digest. The coordinator validates a
//! package on upload ([`package::Package::from_bytes`]) and a submission's
//! arguments and input against it ([`spec::KernelSpec::bind`]); the agent runs
//! it.
//!
//! The agent never calls OpenCL itself: a driver that hangs or crashes, or a
//! kernel that never ends, must not take the agent down. Every OpenCL call runs
//! in the `starling-opencl-worker` child process (`worker`), which the agent
//! kills at the task's wall-time limit. Inside the worker, `exec` (the only
//! module allowed `unsafe`) builds, caches and runs kernels, and `probe` lists
//! and calibrates devices, both through `driver` (the process-wide OpenCL lock
//! and the device walk).
//!
//! Pure parts (no OpenCL, no I/O), always built: [`spec`], [`expr`],
//! [`signature`], [`package`], [`device`], [`scalar`]. The OpenCL parts
//! (`driver`, `exec`, `probe`, `worker` and the worker binary) need the
//! default feature `runtime`, the only thing that links `opencl3`; a crate that
//! only validates packages and submissions (the `starling` CLI) turns default
//! features off. Imports between modules point one way, from the runtime down
//! to the pure modules (`tests/it/layering.rs` checks it).

pub mod device;
#[cfg(feature = "runtime")]
mod driver;
#[cfg(feature = "runtime")]
pub mod exec;
pub mod expr;
pub mod package;
#[cfg(feature = "runtime")]
pub mod probe;
pub mod scalar;
pub mod signature;
pub mod spec;
#[cfg(feature = "runtime")]
pub mod worker;

pub use device::{DeviceInfo, DeviceType};
pub use package::Package;
pub use scalar::ScalarType;
pub use spec::{ArgKind, ArgSpec, BoundArg, KernelSpec, Launch, SpecError};

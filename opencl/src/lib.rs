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
//! in the `starling-opencl-worker` child process ([`worker`]), which the agent
//! kills at the task's wall-time limit. Inside the worker, [`exec`] (the only
//! module allowed `unsafe`) builds, caches and runs kernels, and [`probe`]
//! lists and calibrates devices.
//!
//! Pure parts (no OpenCL, no I/O): [`spec`], [`expr`], [`signature`],
//! [`package`].

pub mod exec;
pub mod expr;
pub mod package;
pub mod probe;
pub mod signature;
pub mod spec;
pub mod worker;

pub use package::Package;
pub use spec::{ArgKind, ArgSpec, BoundArg, DeviceType, KernelSpec, Launch, ScalarType, SpecError};

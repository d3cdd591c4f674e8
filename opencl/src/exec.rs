//! Builds and runs kernels. The only module of the workspace allowed `unsafe`.
//!
//! [`run`] binds a request to its spec, picks a device, refuses what cannot
//! fit before allocating anything, builds the program (or loads it from the
//! binary cache), checks the compiled kernel against the spec, and runs it
//! once on a profiling queue. It runs inside the worker process; the agent
//! never calls it directly.
#![allow(unsafe_code)]

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Instant;

use opencl3::command_queue::{CommandQueue, CL_QUEUE_PROFILING_ENABLE};
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::error_codes::ClError;
use opencl3::kernel::{
    Kernel, CL_KERNEL_ARG_ADDRESS_CONSTANT, CL_KERNEL_ARG_ADDRESS_GLOBAL,
    CL_KERNEL_ARG_ADDRESS_LOCAL, CL_KERNEL_ARG_ADDRESS_PRIVATE,
};
use opencl3::memory::{Buffer, ClMem, CL_MEM_READ_ONLY, CL_MEM_READ_WRITE, CL_MEM_WRITE_ONLY};
use opencl3::program::Program;
use opencl3::types::{cl_mem, CL_BLOCKING};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use starling_proto::{FailureReason, GpuKind};

use crate::device::{DeviceInfo, DeviceType};
use crate::driver::{enumerate, opencl_lock};
use crate::scalar::ScalarType;
use crate::spec::{ArgKind, BoundArg, KernelSpec, Launch, SpecError};

/// One kernel run, as the agent sends it to the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The OpenCL C source.
    pub source: String,
    /// How to launch it.
    pub spec: KernelSpec,
    /// The submission's `name=value` arguments.
    pub args: Vec<String>,
    /// The task's input bytes.
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// The most device memory all buffers may take together.
    pub memory_limit_bytes: u64,
    /// The most output bytes.
    pub output_limit_bytes: u64,
}

/// What a successful run gives back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The `out` and `inout` buffers, concatenated in argument order.
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    /// The device that ran it.
    pub device: String,
    /// Time spent building (or loading the cached binary), ms.
    pub build_ms: u64,
    /// Whether the program came from the binary cache.
    pub binary_cache_hit: bool,
    /// The kernel's own run time from OpenCL profiling, ns.
    pub kernel_ns: u64,
    /// Time from request to outcome inside the worker, ms.
    pub total_ms: u64,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RunError {
    /// The arguments or input do not fit the spec.
    #[error("{0}")]
    Spec(
        #[from]
        #[serde(with = "SpecErrorDef")]
        SpecError,
    ),
    /// No device of the wanted type.
    #[error("no OpenCL device of type {wanted:?} on this node (it has: {available})")]
    NoDevice {
        /// The type wanted.
        wanted: DeviceType,
        /// What the node has, for people.
        available: String,
    },
    /// The kernel did not compile.
    #[error("the kernel did not build on {device}:\n{log}")]
    Build {
        /// The device.
        device: String,
        /// The compiler's build log.
        log: String,
    },
    /// The compiled kernel's arguments differ from the spec.
    #[error("the compiled kernel does not match the spec: {0}")]
    Mismatch(String),
    /// Buffers exceed the device or the task's memory limit.
    #[error("{0}")]
    TooLarge(String),
    /// The output would exceed the limit.
    #[error("the kernel's output buffers take {bytes} bytes; the limit is {limit}")]
    OutputLimit {
        /// Bytes the output would take.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The wall-time limit was reached and the worker was killed.
    #[error("the kernel ran past its {wall_ms} ms limit and was stopped")]
    Timeout {
        /// The limit.
        wall_ms: u64,
    },
    /// The run was cancelled and the worker killed.
    #[error("cancelled")]
    Cancelled,
    /// OpenCL reported an error while running.
    #[error("OpenCL error: {0}")]
    Runtime(String),
    /// The worker process failed (could not start, crashed, spoke garbage).
    #[error("the OpenCL worker failed: {0}")]
    Worker(String),
}

/// `SpecError` crosses the worker's pipe inside [`RunError`]; this mirror lets
/// serde encode it without the pure `spec` module depending on the wire.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SpecError")]
enum SpecErrorDef {
    Spec(String),
    Signature(String),
    Package(String),
    Args(String),
    Eval {
        what: String,
        expr: String,
        detail: String,
    },
    InputSize {
        expected: u64,
        got: u64,
        layout: String,
    },
}

impl RunError {
    /// The failure reason a task event reports for this error. `Cancelled` is
    /// reported by the caller as a cancelled state, not a failure; it maps to
    /// `Internal` here only so the function is total.
    pub fn failure_reason(&self) -> FailureReason {
        match self {
            RunError::Spec(_) => FailureReason::InvalidInput,
            RunError::NoDevice { .. } => FailureReason::UnsupportedRuntime,
            RunError::Build { .. } => FailureReason::BuildFailed,
            RunError::Mismatch(_) => FailureReason::InvalidModule,
            RunError::TooLarge(_) => FailureReason::MemoryLimit,
            RunError::OutputLimit { .. } => FailureReason::OutputLimit,
            RunError::Timeout { .. } => FailureReason::Timeout,
            RunError::Cancelled | RunError::Runtime(_) | RunError::Worker(_) => {
                FailureReason::Internal
            }
        }
    }
}

/// The longest build log kept, in bytes; compilers can be verbose and the
/// first errors are the ones that matter.
pub const MAX_BUILD_LOG_BYTES: usize = 64 * 1024;

/// Runs one kernel: binds the request, picks a device, builds (or loads the
/// cached binary from `cache_dir/binaries/`), runs it once and reads back the
/// output. Everything that can be refused (sizes, limits, device type) is
/// refused before any device memory is allocated. Blocks until the kernel
/// ends; the worker process is what makes a kernel that never ends stoppable.
pub fn run(request: &RunRequest, cache_dir: Option<&Path>) -> Result<RunOutcome, RunError> {
    let _guard = opencl_lock();
    match std::panic::catch_unwind(AssertUnwindSafe(|| run_locked(request, cache_dir))) {
        Ok(result) => result,
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(RunError::Runtime(format!(
                "the OpenCL bindings panicked: {detail}"
            )))
        }
    }
}

fn run_locked(request: &RunRequest, cache_dir: Option<&Path>) -> Result<RunOutcome, RunError> {
    let started = Instant::now();
    let launch = request
        .spec
        .bind(&request.args, request.input.len() as u64)?;
    let (device, info) = choose_device(enumerate(), &request.spec)?;
    check_limits(&launch, request, &info)?;

    let context = Context::from_device(&device)
        .map_err(|error| runtime(format!("cannot create a context on {}", info.name), error))?;
    let queue = profiling_queue(&context, &info)?;
    let options = build_options(&request.spec)?;
    let built = build_program(
        &context,
        &device,
        &info,
        &request.source,
        &options,
        cache_dir,
    )?;
    let kernel = Kernel::create(&built.program, &request.spec.kernel).map_err(|error| {
        RunError::Mismatch(format!(
            "the program has no kernel `{}` ({error}); it defines: {}",
            request.spec.kernel,
            built.program.kernel_names()
        ))
    })?;
    check_kernel(&kernel, &request.spec, &launch, &device, &info)?;

    let buffers = bind_args(&context, &queue, &kernel, &launch, &request.input)?;
    let kernel_ns = enqueue(&queue, &kernel, &launch, &info)?;
    let output = read_output(&queue, &buffers, launch.output_bytes)?;
    Ok(RunOutcome {
        output,
        device: info.name.clone(),
        build_ms: built.build_ms,
        binary_cache_hit: built.cache_hit,
        kernel_ns,
        total_ms: started.elapsed().as_millis() as u64,
    })
}

fn runtime(what: impl std::fmt::Display, error: ClError) -> RunError {
    RunError::Runtime(format!("{what}: {error}"))
}

/// The device a spec runs on: of the wanted type, with fp64 when the kernel
/// takes doubles; GPUs first, then the most compute units.
fn choose_device(
    devices: Vec<(Device, DeviceInfo)>,
    spec: &KernelSpec,
) -> Result<(Device, DeviceInfo), RunError> {
    let needs_fp64 = spec.args.iter().any(|arg| arg.ty == ScalarType::Double);
    let available = if devices.is_empty() {
        "no OpenCL devices".to_owned()
    } else {
        devices
            .iter()
            .map(|(_, info)| info.describe())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let of_type: Vec<(Device, DeviceInfo)> = devices
        .into_iter()
        .filter(|(_, info)| spec.device.accepts(info.kind))
        .collect();
    let any_of_type = !of_type.is_empty();
    let best = of_type
        .into_iter()
        .filter(|(_, info)| info.fp64 || !needs_fp64)
        .max_by_key(|(_, info)| (info.kind == GpuKind::Gpu, info.compute_units));
    match best {
        Some(found) => Ok(found),
        None if any_of_type => Err(RunError::NoDevice {
            wanted: spec.device,
            available: format!(
                "{available}; the kernel takes `double` arguments, which need a device with fp64"
            ),
        }),
        None => Err(RunError::NoDevice {
            wanted: spec.device,
            available,
        }),
    }
}

/// Refuses, before allocating anything, buffers and work-groups the device
/// or the task's limits cannot take.
fn check_limits(
    launch: &Launch,
    request: &RunRequest,
    device: &DeviceInfo,
) -> Result<(), RunError> {
    if launch.output_bytes > request.output_limit_bytes {
        return Err(RunError::OutputLimit {
            bytes: launch.output_bytes,
            limit: request.output_limit_bytes,
        });
    }
    let mut global_total: u64 = 0;
    let mut largest: Option<(&str, u64)> = None;
    let mut local_total: u64 = 0;
    for arg in &launch.args {
        match arg {
            BoundArg::Buffer {
                name,
                len,
                elem,
                bytes,
                ..
            } => {
                if *bytes > device.max_alloc_bytes {
                    return Err(RunError::TooLarge(format!(
                        "buffer `{name}` takes {bytes} bytes ({len} × {}), more than the largest \
                         single allocation {} allows ({} bytes, its max alloc size); make it smaller \
                         or split it",
                        elem.as_str(),
                        device.name,
                        device.max_alloc_bytes
                    )));
                }
                global_total = global_total.saturating_add(*bytes);
                if largest.is_none_or(|(_, size)| *bytes > size) {
                    largest = Some((name, *bytes));
                }
            }
            BoundArg::Local { bytes, .. } => local_total = local_total.saturating_add(*bytes),
            BoundArg::Scalar { .. } => {}
        }
    }
    let largest_text = largest
        .map(|(name, bytes)| format!(" (the largest, `{name}`, takes {bytes} bytes)"))
        .unwrap_or_default();
    if global_total > device.global_mem_bytes {
        return Err(RunError::TooLarge(format!(
            "the buffers take {global_total} bytes together{largest_text}, more than the global \
             memory of {} ({} bytes); make them smaller",
            device.name, device.global_mem_bytes
        )));
    }
    if global_total > request.memory_limit_bytes {
        return Err(RunError::TooLarge(format!(
            "the buffers take {global_total} bytes together{largest_text}, more than the task's \
             memory limit ({} bytes); raise the task's memory limit or make them smaller",
            request.memory_limit_bytes
        )));
    }
    if local_total > device.local_mem_bytes {
        return Err(RunError::TooLarge(format!(
            "the `local` arguments take {local_total} bytes together, more than the local memory \
             of {} ({} bytes per work-group); use smaller tiles",
            device.name, device.local_mem_bytes
        )));
    }
    if let Some(local) = &launch.local {
        let items = local
            .iter()
            .try_fold(1u64, |product, size| product.checked_mul(*size))
            .unwrap_or(u64::MAX);
        if items > device.max_work_group_size {
            return Err(RunError::TooLarge(format!(
                "the work-group of {} = {items} work-items is larger than {} allows ({} \
                 work-items); use a smaller local size",
                dims_text(local),
                device.name,
                device.max_work_group_size
            )));
        }
    }
    Ok(())
}

fn dims_text(sizes: &[u64]) -> String {
    sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("×")
}

fn profiling_queue(context: &Context, info: &DeviceInfo) -> Result<CommandQueue, RunError> {
    match CommandQueue::create_default_with_properties(context, CL_QUEUE_PROFILING_ENABLE, 0) {
        Ok(queue) => Ok(queue),
        // OpenCL 1.x drivers lack clCreateCommandQueueWithProperties.
        #[allow(deprecated)]
        Err(_) => {
            CommandQueue::create_default(context, CL_QUEUE_PROFILING_ENABLE).map_err(|error| {
                runtime(
                    format!("cannot create a command queue on {}", info.name),
                    error,
                )
            })
        }
    }
}

fn build_options(spec: &KernelSpec) -> Result<String, RunError> {
    // opencl3 panics on an interior NUL in the options; refuse it here.
    if spec.build_options.contains('\0') {
        return Err(RunError::Spec(SpecError::Spec(
            "build_options contain a NUL character; remove it".to_owned(),
        )));
    }
    Ok(format!("-cl-kernel-arg-info {}", spec.build_options)
        .trim()
        .to_owned())
}

struct Built {
    program: Program,
    build_ms: u64,
    cache_hit: bool,
}

/// Where the binary for this source, options and device is cached: a digest
/// of everything that changes the compiled code.
fn binary_path(dir: &Path, source: &str, options: &str, info: &DeviceInfo) -> PathBuf {
    let mut hasher = Sha256::new();
    for part in [
        "starling-opencl-binary/1",
        source,
        options,
        &info.name,
        &info.driver_version,
        &info.platform,
        &info.version,
    ] {
        // Length-prefixed so that moving bytes between parts changes the key.
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    dir.join("binaries")
        .join(format!("{}.bin", hex::encode(hasher.finalize())))
}

fn build_program(
    context: &Context,
    device: &Device,
    info: &DeviceInfo,
    source: &str,
    options: &str,
    cache_dir: Option<&Path>,
) -> Result<Built, RunError> {
    let started = Instant::now();
    let cached = cache_dir.map(|dir| binary_path(dir, source, options, info));
    if let Some(path) = &cached {
        if let Ok(binary) = std::fs::read(path) {
            match Program::create_and_build_from_binary(context, &[&binary], options) {
                Ok(program) => {
                    return Ok(Built {
                        program,
                        build_ms: started.elapsed().as_millis() as u64,
                        cache_hit: true,
                    })
                }
                Err(error) => {
                    // A driver update can make an old binary unloadable even
                    // with the same version string; rebuild from source.
                    tracing::warn!(path = %path.display(), "cached binary refused ({error}); building from source");
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }

    let mut program = Program::create_from_source(context, source)
        .map_err(|error| runtime("cannot create the program from source", error))?;
    if let Err(error) = program.build(&[device.id()], options) {
        let log = hide_source_paths(&program.get_build_log(device.id()).unwrap_or_default());
        let mut log = format!("{error} (options: {options})\n{}", log.trim_end());
        if log.len() > MAX_BUILD_LOG_BYTES {
            let mut cut = MAX_BUILD_LOG_BYTES;
            while !log.is_char_boundary(cut) {
                cut -= 1;
            }
            log.truncate(cut);
            log.push_str("\n[build log truncated]");
        }
        return Err(RunError::Build {
            device: info.name.clone(),
            log,
        });
    }
    let build_ms = started.elapsed().as_millis() as u64;
    if let Some(path) = &cached {
        match program.get_binaries() {
            Ok(binaries) => match binaries.into_iter().find(|binary| !binary.is_empty()) {
                Some(binary) => {
                    if let Err(error) = store_binary(path, &binary) {
                        tracing::warn!(path = %path.display(), "cannot cache the program binary: {error}");
                    }
                }
                None => tracing::debug!("the driver gives no program binary to cache"),
            },
            Err(error) => tracing::debug!("the driver gives no program binary: {error}"),
        }
    }
    Ok(Built {
        program,
        build_ms,
        cache_hit: false,
    })
}

/// Compilers name the source by the temporary file the driver wrote it to
/// (`/root/.cache/pocl/kcache/tempfile_X.cl:2:30: error ...`); the task's author
/// knows it as `kernel.cl`, and the node's paths are none of their business.
fn hide_source_paths(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut rest = log;
    while let Some(at) = rest.find(".cl:") {
        let token_start = rest[..at]
            .rfind(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .map_or(0, |space| space + 1);
        out.push_str(&rest[..token_start]);
        let token = &rest[token_start..at];
        if token.contains('/') || token.contains('\\') {
            out.push_str("kernel");
        } else {
            out.push_str(token);
        }
        out.push_str(".cl:");
        rest = &rest[at + 4..];
    }
    out.push_str(rest);
    out
}

fn store_binary(path: &Path, binary: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written aside and renamed: a half-written binary must never be loaded.
    let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&temporary, binary)?;
    std::fs::rename(&temporary, path)
}

fn address_space_name(qualifier: u32) -> &'static str {
    match qualifier {
        CL_KERNEL_ARG_ADDRESS_GLOBAL => "__global",
        CL_KERNEL_ARG_ADDRESS_LOCAL => "__local",
        CL_KERNEL_ARG_ADDRESS_CONSTANT => "__constant",
        CL_KERNEL_ARG_ADDRESS_PRIVATE => "private (by value)",
        _ => "of an unknown address space",
    }
}

/// Checks the compiled kernel against the spec: argument count, and where
/// the driver keeps argument info, each argument's address space and scalar
/// type; then the kernel's own work-group limit.
fn check_kernel(
    kernel: &Kernel,
    spec: &KernelSpec,
    launch: &Launch,
    device: &Device,
    info: &DeviceInfo,
) -> Result<(), RunError> {
    let count = kernel
        .num_args()
        .map_err(|error| runtime("cannot read the kernel's argument count", error))?;
    if count as usize != spec.args.len() {
        return Err(RunError::Mismatch(format!(
            "kernel `{}` takes {count} arguments but the spec declares {}; declare every kernel \
             parameter in the spec, in order",
            spec.kernel,
            spec.args.len()
        )));
    }
    for (index, arg) in spec.args.iter().enumerate() {
        let index_u32 = index as u32;
        // Programs loaded from some binaries carry no argument info; the
        // count check above and the source check at upload still hold.
        let Ok(qualifier) = kernel.get_arg_address_qualifier(index_u32) else {
            continue;
        };
        let fits = match arg.kind {
            ArgKind::Scalar => qualifier == CL_KERNEL_ARG_ADDRESS_PRIVATE,
            ArgKind::In => {
                qualifier == CL_KERNEL_ARG_ADDRESS_GLOBAL
                    || qualifier == CL_KERNEL_ARG_ADDRESS_CONSTANT
            }
            ArgKind::Out | ArgKind::Inout | ArgKind::Scratch => {
                qualifier == CL_KERNEL_ARG_ADDRESS_GLOBAL
            }
            ArgKind::Local => qualifier == CL_KERNEL_ARG_ADDRESS_LOCAL,
        };
        if !fits {
            let wanted = match arg.kind {
                ArgKind::Scalar => "a by-value parameter",
                ArgKind::In => "a `__global` or `__constant` pointer",
                ArgKind::Local => "a `__local` pointer",
                _ => "a `__global` pointer",
            };
            return Err(RunError::Mismatch(format!(
                "parameter {index} (`{}`) is {} in the kernel, but the spec declares it `{}`, \
                 which needs {wanted}",
                arg.name,
                address_space_name(qualifier),
                arg.kind.as_str()
            )));
        }
        if let Ok(type_name) = kernel.get_arg_type_name(index_u32) {
            let base = type_name
                .trim_end_matches('\0')
                .trim()
                .trim_end_matches('*')
                .trim();
            let known = [
                ScalarType::Char,
                ScalarType::Uchar,
                ScalarType::Short,
                ScalarType::Ushort,
                ScalarType::Int,
                ScalarType::Uint,
                ScalarType::Long,
                ScalarType::Ulong,
                ScalarType::Float,
                ScalarType::Double,
            ]
            .iter()
            .any(|ty| ty.as_str() == base);
            // Only plain scalar names are compared; typedefs and vector
            // types are left to the source check.
            if known && base != arg.ty.as_str() {
                return Err(RunError::Mismatch(format!(
                    "parameter {index} (`{}`) has type `{}` in the kernel, but the spec declares \
                     `{}`",
                    arg.name,
                    type_name.trim_end_matches('\0').trim(),
                    arg.ty.as_str()
                )));
            }
        }
    }
    if let Some(local) = &launch.local {
        let items = local
            .iter()
            .try_fold(1u64, |product, size| product.checked_mul(*size))
            .unwrap_or(u64::MAX);
        if let Ok(kernel_max) = kernel.get_work_group_size(device.id()) {
            let kernel_max = kernel_max as u64;
            if items > kernel_max {
                return Err(RunError::TooLarge(format!(
                    "the work-group of {} = {items} work-items is larger than this kernel can run \
                     on {} ({kernel_max} work-items; its register and local memory use lower the \
                     device's maximum of {}); use a smaller local size",
                    dims_text(local),
                    info.name,
                    info.max_work_group_size
                )));
            }
        }
    }
    Ok(())
}

/// A global buffer and where its bytes go.
struct DeviceBuffer {
    kind: ArgKind,
    bytes: u64,
    buffer: Buffer<u8>,
}

fn to_usize(value: u64, what: &str) -> Result<usize, RunError> {
    usize::try_from(value).map_err(|_| {
        RunError::TooLarge(format!(
            "{what} is {value}, more than this machine can address"
        ))
    })
}

/// Creates the buffers, copies the input in, and sets every argument.
fn bind_args(
    context: &Context,
    queue: &CommandQueue,
    kernel: &Kernel,
    launch: &Launch,
    input: &[u8],
) -> Result<Vec<DeviceBuffer>, RunError> {
    let mut buffers = Vec::new();
    let mut input_offset: usize = 0;
    for (index, arg) in launch.args.iter().enumerate() {
        let index_u32 = index as u32;
        match arg {
            BoundArg::Scalar { name, ty, bytes } => {
                set_scalar(kernel, index_u32, name, *ty, bytes)?
            }
            BoundArg::Buffer {
                name, kind, bytes, ..
            } => {
                let size = to_usize(*bytes, &format!("the size of buffer `{name}`"))?;
                // OpenCL refuses empty buffers; an empty one still needs a
                // valid handle for the kernel's parameter.
                let allocated = size.max(1);
                let flags = match kind {
                    ArgKind::In => CL_MEM_READ_ONLY,
                    ArgKind::Out => CL_MEM_WRITE_ONLY,
                    _ => CL_MEM_READ_WRITE,
                };
                // SAFETY: no host pointer is passed (null, no USE/COPY_HOST_PTR
                // flag), so the driver allocates `allocated` bytes of its own.
                let mut buffer =
                    unsafe { Buffer::<u8>::create(context, flags, allocated, ptr::null_mut()) }
                        .map_err(|error| {
                            RunError::TooLarge(format!(
                        "cannot allocate buffer `{name}` of {size} bytes on the device: {error}"
                    ))
                        })?;
                if matches!(kind, ArgKind::In | ArgKind::Inout) {
                    let end = input_offset
                        .checked_add(size)
                        .filter(|end| *end <= input.len());
                    let Some(end) = end else {
                        return Err(RunError::Spec(SpecError::InputSize {
                            expected: launch.input_bytes,
                            got: input.len() as u64,
                            layout: format!("buffer `{name}` runs past the input"),
                        }));
                    };
                    let slice = &input[input_offset..end];
                    input_offset = end;
                    if !slice.is_empty() {
                        // SAFETY: the buffer holds `allocated` >= `slice.len()`
                        // bytes, and the write is blocking, so `slice` (borrowed
                        // from the request) outlives the copy.
                        unsafe {
                            queue.enqueue_write_buffer(&mut buffer, CL_BLOCKING, 0, slice, &[])
                        }
                        .map_err(|error| {
                            runtime(format!("cannot copy the input into `{name}`"), error)
                        })?;
                    }
                } else {
                    // Out and scratch buffers start zeroed, so a kernel that
                    // leaves part of its output unwritten returns zeros rather
                    // than whatever the device memory held (another task's data).
                    let zero = [0u8];
                    // SAFETY: the fill covers [0, allocated), inside the buffer;
                    // the one-byte pattern is copied by the driver when the
                    // command is enqueued (OpenCL 1.2, clEnqueueFillBuffer).
                    unsafe { queue.enqueue_fill_buffer(&mut buffer, &zero, 0, allocated, &[]) }
                        .map_err(|error| runtime(format!("cannot clear `{name}`"), error))?;
                }
                let handle: cl_mem = buffer.get();
                // SAFETY: the parameter at `index` is a pointer (checked
                // against the kernel's argument info, and the count matches the
                // spec), and a `cl_mem` handle is what a buffer argument takes;
                // `buffer` is kept alive in `buffers` until the output is read.
                unsafe { kernel.set_arg(index_u32, &handle) }
                    .map_err(|error| runtime(format!("cannot pass buffer `{name}`"), error))?;
                buffers.push(DeviceBuffer {
                    kind: *kind,
                    bytes: *bytes,
                    buffer,
                });
            }
            BoundArg::Local { name, bytes } => {
                let size = to_usize(*bytes, &format!("the size of local buffer `{name}`"))?.max(1);
                // SAFETY: a `__local` parameter (checked against the argument
                // info) takes a size and a null value; `size` is at most the
                // device's local memory (checked before allocating).
                unsafe { kernel.set_arg_local_buffer(index_u32, size) }.map_err(|error| {
                    runtime(format!("cannot size local buffer `{name}`"), error)
                })?;
            }
        }
    }
    Ok(buffers)
}

fn set_scalar(
    kernel: &Kernel,
    index: u32,
    name: &str,
    ty: ScalarType,
    bytes: &[u8],
) -> Result<(), RunError> {
    let wrong_size = || {
        RunError::Mismatch(format!(
            "scalar `{name}` has {} bytes but a `{}` takes {}",
            bytes.len(),
            ty.as_str(),
            ty.size()
        ))
    };
    macro_rules! set_typed {
        ($t:ty) => {{
            let value = <$t>::from_le_bytes(bytes.try_into().map_err(|_| wrong_size())?);
            // SAFETY: `value` has exactly the size of the OpenCL C type the
            // spec declares for this by-value parameter (the type name was
            // checked against the kernel's argument info where available),
            // and the driver copies it before `set_arg` returns.
            unsafe { kernel.set_arg(index, &value) }
        }};
    }
    let result = match ty {
        ScalarType::Char => set_typed!(i8),
        ScalarType::Uchar => set_typed!(u8),
        ScalarType::Short => set_typed!(i16),
        ScalarType::Ushort => set_typed!(u16),
        ScalarType::Int => set_typed!(i32),
        ScalarType::Uint => set_typed!(u32),
        ScalarType::Long => set_typed!(i64),
        ScalarType::Ulong => set_typed!(u64),
        ScalarType::Float => set_typed!(f32),
        ScalarType::Double => set_typed!(f64),
    };
    result.map_err(|error| {
        RunError::Mismatch(format!(
            "the kernel refused scalar `{name}` as a `{}` ({error}); check the parameter's type",
            ty.as_str()
        ))
    })
}

/// Enqueues the NDRange, waits for it, and returns its profiled run time.
fn enqueue(
    queue: &CommandQueue,
    kernel: &Kernel,
    launch: &Launch,
    info: &DeviceInfo,
) -> Result<u64, RunError> {
    let global = launch
        .global
        .iter()
        .map(|size| to_usize(*size, "the global work size"))
        .collect::<Result<Vec<usize>, RunError>>()?;
    let local = match &launch.local {
        Some(local) => Some(
            local
                .iter()
                .map(|size| to_usize(*size, "the local work size"))
                .collect::<Result<Vec<usize>, RunError>>()?,
        ),
        None => None,
    };
    if let Some(local) = &local {
        if local.len() != global.len() {
            return Err(RunError::Mismatch(format!(
                "the spec gives {} local sizes for {} global dimensions",
                local.len(),
                global.len()
            )));
        }
    }
    let local_ptr = local.as_ref().map_or(ptr::null(), |local| local.as_ptr());
    // SAFETY: `global` (and `local`, when given) hold `global.len()` (1 to 3)
    // sizes and outlive the call; every argument has been set above with the
    // size and kind the kernel's argument info declares; the buffers the
    // kernel touches are alive in the caller until after the blocking reads.
    let event = unsafe {
        queue.enqueue_nd_range_kernel(
            kernel.get(),
            global.len() as u32,
            ptr::null(),
            global.as_ptr(),
            local_ptr,
            &[],
        )
    }
    .map_err(|error| enqueue_error(error, launch, info))?;
    event
        .wait()
        .map_err(|error| runtime("the kernel failed while running", error))?;
    let start = event
        .profiling_command_start()
        .map_err(|error| runtime("cannot read the kernel's start time", error))?;
    let end = event
        .profiling_command_end()
        .map_err(|error| runtime("cannot read the kernel's end time", error))?;
    Ok(end.saturating_sub(start))
}

fn enqueue_error(error: ClError, launch: &Launch, info: &DeviceInfo) -> RunError {
    use opencl3::error_codes::{
        CL_INVALID_GLOBAL_WORK_SIZE, CL_INVALID_WORK_GROUP_SIZE, CL_INVALID_WORK_ITEM_SIZE,
        CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES,
    };
    let global = dims_text(&launch.global);
    let local = launch
        .local
        .as_deref()
        .map_or_else(|| "chosen by the driver".to_owned(), dims_text);
    match error.0 {
        CL_INVALID_WORK_GROUP_SIZE => RunError::Mismatch(format!(
            "{} refused local size {local} for global size {global} ({error}); make every global \
             size a multiple of the local size, or check the kernel's reqd_work_group_size",
            info.name
        )),
        CL_INVALID_WORK_ITEM_SIZE => RunError::TooLarge(format!(
            "local size {local} exceeds what {} allows in some dimension ({error}); use a \
             smaller local size",
            info.name
        )),
        CL_INVALID_GLOBAL_WORK_SIZE => RunError::TooLarge(format!(
            "global size {global} is more than {} can launch ({error})",
            info.name
        )),
        CL_OUT_OF_RESOURCES | CL_MEM_OBJECT_ALLOCATION_FAILURE => RunError::TooLarge(format!(
            "{} ran out of resources launching the kernel ({error}); use less memory or a \
             smaller work-group",
            info.name
        )),
        _ => runtime("cannot launch the kernel", error),
    }
}

fn read_output(
    queue: &CommandQueue,
    buffers: &[DeviceBuffer],
    output_bytes: u64,
) -> Result<Vec<u8>, RunError> {
    let mut output = Vec::with_capacity(to_usize(output_bytes, "the output size")?);
    for buffer in buffers {
        if !matches!(buffer.kind, ArgKind::Out | ArgKind::Inout) || buffer.bytes == 0 {
            continue;
        }
        let start = output.len();
        let size = to_usize(buffer.bytes, "the output size")?;
        output.resize(start + size, 0);
        // SAFETY: the destination slice is exactly `bytes` long, no more than
        // the buffer's size, and the read is blocking, so the slice outlives
        // the copy.
        unsafe {
            queue.enqueue_read_buffer(&buffer.buffer, CL_BLOCKING, 0, &mut output[start..], &[])
        }
        .map_err(|error| runtime("cannot read the output back", error))?;
    }
    Ok(output)
}

/// Independent multiply-add chains per work-item in the reference kernel
/// (the calibration is described in [`crate::probe`]).
pub const CALIBRATION_CHAINS: u32 = 8;

/// The calibration kernel (see [`crate::probe`]): [`CALIBRATION_CHAINS`]
/// independent chains of dependent `float4` multiply-adds per work-item.
const CALIBRATION_SOURCE: &str = r#"
__kernel void starling_calibrate(__global float *out, const uint iterations,
                                 const float b, const float c) {
    uint gid = get_global_id(0);
    float4 x0 = (float4)((float)gid, (float)gid + 1.0f, (float)gid + 2.0f, (float)gid + 3.0f) * 1e-6f;
    float4 x1 = x0 + 0.1f, x2 = x0 + 0.2f, x3 = x0 + 0.3f;
    float4 x4 = x0 + 0.4f, x5 = x0 + 0.5f, x6 = x0 + 0.6f, x7 = x0 + 0.7f;
    for (uint i = 0; i < iterations; i++) {
        x0 = mad(x0, b, c); x1 = mad(x1, b, c); x2 = mad(x2, b, c); x3 = mad(x3, b, c);
        x4 = mad(x4, b, c); x5 = mad(x5, b, c); x6 = mad(x6, b, c); x7 = mad(x7, b, c);
    }
    float4 sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    out[gid] = sum.x + sum.y + sum.z + sum.w;
}
"#;

/// Kernel time the calibration aims for: long enough to swamp launch
/// overhead and timer resolution, short enough to keep a probe under a second.
const CALIBRATION_TARGET_NS: u64 = 50_000_000;

/// Times the calibration kernel on `device` and returns its single-precision
/// GFLOP/s. The caller holds [`opencl_lock`].
pub(crate) fn measure_gflops(
    device: &Device,
    info: &DeviceInfo,
    cache_dir: Option<&Path>,
) -> Result<f64, RunError> {
    let context = Context::from_device(device)
        .map_err(|error| runtime(format!("cannot create a context on {}", info.name), error))?;
    let queue = profiling_queue(&context, info)?;
    let built = build_program(&context, device, info, CALIBRATION_SOURCE, "", cache_dir)?;
    let kernel = Kernel::create(&built.program, "starling_calibrate")
        .map_err(|error| runtime("cannot create the calibration kernel", error))?;
    let work_items: usize = (info.compute_units.max(1) as usize) * 1024;
    // SAFETY: no host pointer; the driver allocates `work_items` floats.
    let buffer =
        unsafe { Buffer::<f32>::create(&context, CL_MEM_WRITE_ONLY, work_items, ptr::null_mut()) }
            .map_err(|error| runtime("cannot allocate the calibration buffer", error))?;
    let handle: cl_mem = buffer.get();
    let (b, c) = (0.999f32, 0.001f32);
    // SAFETY: the argument types match CALIBRATION_SOURCE's parameters
    // (`__global float *`, `uint`, `float`, `float`), and `buffer` outlives
    // every launch below (each is waited for before returning).
    unsafe {
        kernel
            .set_arg(0, &handle)
            .and_then(|()| kernel.set_arg(2, &b))
            .and_then(|()| kernel.set_arg(3, &c))
    }
    .map_err(|error| runtime("cannot set the calibration arguments", error))?;

    let time = |iterations: u32| -> Result<u64, RunError> {
        let global = [work_items];
        // SAFETY: argument 1 is the kernel's `uint iterations`; `global` holds
        // one size for the one dimension and outlives the call; the other
        // arguments were set above.
        let event = unsafe {
            kernel.set_arg(1, &iterations).and_then(|()| {
                queue.enqueue_nd_range_kernel(
                    kernel.get(),
                    1,
                    ptr::null(),
                    global.as_ptr(),
                    ptr::null(),
                    &[],
                )
            })
        }
        .map_err(|error| runtime("cannot launch the calibration kernel", error))?;
        event
            .wait()
            .map_err(|error| runtime("the calibration kernel failed", error))?;
        let start = event
            .profiling_command_start()
            .map_err(|error| runtime("no profiling start time", error))?;
        let end = event
            .profiling_command_end()
            .map_err(|error| runtime("no profiling end time", error))?;
        Ok(end.saturating_sub(start).max(1))
    };
    // The first launch pays for the driver's lazy work (PoCL compiles the
    // work-group function on first use) and sizes the timed launch; it is
    // long enough (a few ms on one CPU core) for its own time to be a fair
    // guide, and when it already reaches half the target it is the
    // measurement.
    let probe_iterations = 1024u32;
    let probe_ns = time(probe_iterations)?;
    let (iterations, ns) = if probe_ns >= CALIBRATION_TARGET_NS / 2 {
        (probe_iterations, probe_ns)
    } else {
        let scaled = u64::from(probe_iterations).saturating_mul(CALIBRATION_TARGET_NS) / probe_ns;
        let iterations =
            u32::try_from(scaled.clamp(u64::from(probe_iterations), 1 << 24)).unwrap_or(1 << 24);
        (iterations, time(iterations)?)
    };
    tracing::debug!(
        build_ms = built.build_ms,
        cache_hit = built.cache_hit,
        probe_ns,
        iterations,
        ns,
        "calibration timings"
    );
    let flops = work_items as f64 * iterations as f64 * (CALIBRATION_FLOPS_PER_ITERATION as f64);
    Ok(flops / ns as f64)
}

/// Floating-point operations per loop iteration per work-item of the
/// calibration kernel: chains × 4 lanes × 2 (a multiply-add counts as two).
const CALIBRATION_FLOPS_PER_ITERATION: u32 = CALIBRATION_CHAINS * 4 * 2;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_map_every_error() {
        let cases = [
            (
                RunError::Spec(SpecError::Args("x".into())),
                FailureReason::InvalidInput,
            ),
            (
                RunError::NoDevice {
                    wanted: DeviceType::Gpu,
                    available: String::new(),
                },
                FailureReason::UnsupportedRuntime,
            ),
            (
                RunError::Build {
                    device: "d".into(),
                    log: "l".into(),
                },
                FailureReason::BuildFailed,
            ),
            (RunError::Mismatch("m".into()), FailureReason::InvalidModule),
            (RunError::TooLarge("t".into()), FailureReason::MemoryLimit),
            (
                RunError::OutputLimit { bytes: 2, limit: 1 },
                FailureReason::OutputLimit,
            ),
            (RunError::Timeout { wall_ms: 5 }, FailureReason::Timeout),
            (RunError::Cancelled, FailureReason::Internal),
            (RunError::Runtime("r".into()), FailureReason::Internal),
            (RunError::Worker("w".into()), FailureReason::Internal),
        ];
        for (error, reason) in cases {
            assert_eq!(error.failure_reason(), reason, "{error:?}");
        }
    }

    #[test]
    fn run_errors_cross_the_pipe_intact() {
        let errors = vec![
            RunError::Spec(SpecError::Eval {
                what: "len of x".into(),
                expr: "n / 0".into(),
                detail: "division by zero".into(),
            }),
            RunError::Spec(SpecError::InputSize {
                expected: 8,
                got: 4,
                layout: "x: 2 × float".into(),
            }),
            RunError::Build {
                device: "cpu".into(),
                log: "error: expected ';'".into(),
            },
            RunError::Timeout { wall_ms: 1000 },
        ];
        for error in errors {
            let result: Result<RunOutcome, RunError> = Err(error.clone());
            let bytes = serde_cbor::to_vec(&result).unwrap();
            let back: Result<RunOutcome, RunError> = serde_cbor::from_slice(&bytes).unwrap();
            assert_eq!(back, Err(error));
        }
    }

    #[test]
    fn build_logs_name_the_source_kernel_cl() {
        assert_eq!(
            hide_source_paths(
                "error: /root/.cache/pocl/kcache/tempfile_V7.cl:2:30: expected ';'\n\
                 /tmp/x.cl:3:1: note: here\nplain.cl:4:1: kept\nno file here"
            ),
            "error: kernel.cl:2:30: expected ';'\nkernel.cl:3:1: note: here\nplain.cl:4:1: kept\nno file here"
        );
    }

    #[test]
    fn binary_key_depends_on_every_part() {
        let dir = Path::new("/cache");
        let info = DeviceInfo {
            platform: "p".into(),
            vendor: "v".into(),
            name: "n".into(),
            kind: GpuKind::Cpu,
            version: "OpenCL 3.0".into(),
            driver_version: "1".into(),
            compute_units: 1,
            max_clock_mhz: 1,
            global_mem_bytes: 1,
            local_mem_bytes: 1,
            max_alloc_bytes: 1,
            max_work_group_size: 1,
            fp64: false,
            gflops: None,
        };
        let base = binary_path(dir, "src", "-O", &info);
        assert!(base.starts_with("/cache/binaries"));
        assert_eq!(base, binary_path(dir, "src", "-O", &info));
        assert_ne!(base, binary_path(dir, "src2", "-O", &info));
        assert_ne!(base, binary_path(dir, "src", "-O2", &info));
        assert_ne!(base, binary_path(dir, "sr", "c-O", &info));
        let mut other = info.clone();
        other.driver_version = "2".into();
        assert_ne!(base, binary_path(dir, "src", "-O", &other));
    }
}

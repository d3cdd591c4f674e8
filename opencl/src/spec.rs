//! The kernel spec: what a task author declares about an OpenCL kernel in the
//! `[opencl]` section of `task.toml`, and its binding to one submission's
//! arguments and input ([`KernelSpec::bind`]).
//!
//! Data layout, the contract between a submitter and the kernel: the task's
//! input bytes are the `in` and `inout` buffers concatenated in argument order,
//! each as its elements in little-endian; the task's output is the `out` and
//! `inout` buffers concatenated in argument order, the same way. `scratch`
//! buffers live on the device only; `local` arguments are work-group memory.
//! Scalars come from the submission's arguments, written `name=value`, or from
//! their `default`.

use serde::{Deserialize, Serialize};

/// The most work dimensions OpenCL allows.
pub const MAX_DIMS: usize = 3;

/// The kind of OpenCL device a kernel wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// Any OpenCL device (the default).
    #[default]
    Any,
    /// A graphics processor.
    Gpu,
    /// A CPU exposed through OpenCL (PoCL, for instance).
    Cpu,
    /// A dedicated accelerator.
    Accelerator,
}

impl DeviceType {
    /// The proto's device kind this type requires, `None` for any.
    pub fn required_kind(self) -> Option<starling_proto::GpuKind> {
        match self {
            DeviceType::Any => None,
            DeviceType::Gpu => Some(starling_proto::GpuKind::Gpu),
            DeviceType::Cpu => Some(starling_proto::GpuKind::Cpu),
            DeviceType::Accelerator => Some(starling_proto::GpuKind::Accelerator),
        }
    }

    /// Whether a device of `kind` satisfies this type.
    pub fn accepts(self, kind: starling_proto::GpuKind) -> bool {
        self.required_kind().is_none_or(|wanted| wanted == kind)
    }
}

/// An OpenCL C scalar type: a scalar argument's type or a buffer's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalarType {
    /// `char`, 8-bit signed.
    Char,
    /// `uchar`, 8-bit unsigned.
    Uchar,
    /// `short`, 16-bit signed.
    Short,
    /// `ushort`, 16-bit unsigned.
    Ushort,
    /// `int`, 32-bit signed.
    Int,
    /// `uint`, 32-bit unsigned.
    Uint,
    /// `long`, 64-bit signed.
    Long,
    /// `ulong`, 64-bit unsigned.
    Ulong,
    /// `float`, 32-bit IEEE 754.
    Float,
    /// `double`, 64-bit IEEE 754 (needs an fp64 device).
    Double,
}

/// How a kernel argument is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgKind {
    /// A value passed by value, from the submission's `name=value` argument.
    Scalar,
    /// A `__global` buffer filled from the task's input.
    In,
    /// A `__global` buffer read back into the task's output.
    Out,
    /// A `__global` buffer filled from the input and read back into the output.
    Inout,
    /// A `__global` buffer on the device only (intermediate results).
    Scratch,
    /// A `__local` buffer (work-group memory) of `len` elements.
    Local,
}

/// One kernel argument, in the kernel's parameter order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgSpec {
    /// Its name: an identifier, unique among the arguments. Integer scalars can
    /// be used by name in length and work-size expressions.
    pub name: String,
    /// How it is passed.
    pub kind: ArgKind,
    /// Its type (scalars) or element type (buffers).
    #[serde(rename = "type")]
    pub ty: ScalarType,
    /// Length in elements, an expression over integer scalars (buffers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<String>,
    /// Value used when the submission does not give one (scalars only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// Everything the agent needs to launch a kernel, besides its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// The `__kernel` function to run.
    pub kernel: String,
    /// The kind of device wanted.
    #[serde(default)]
    pub device: DeviceType,
    /// Global work size per dimension (1 to 3 expressions).
    pub global: Vec<String>,
    /// Local work size per dimension; empty lets the runtime choose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local: Vec<String>,
    /// Options passed to the OpenCL compiler (`-cl-fast-relaxed-math`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub build_options: String,
    /// The kernel's arguments, in parameter order.
    pub args: Vec<ArgSpec>,
}

/// Why a kernel spec, a package or a submission does not hold together. Every
/// message names the argument or expression at fault and says what would fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The spec itself is inconsistent (names, kinds, lengths, work sizes).
    #[error("invalid kernel spec: {0}")]
    Spec(String),
    /// The source does not declare the kernel, or declares it differently.
    #[error("the kernel source does not match the spec: {0}")]
    Signature(String),
    /// The package bytes are not a package.
    #[error("invalid OpenCL package: {0}")]
    Package(String),
    /// A submission's `name=value` arguments do not fit the spec.
    #[error("invalid kernel arguments: {0}")]
    Args(String),
    /// A length or work-size expression failed for these arguments.
    #[error("cannot evaluate {what} = {expr:?}: {detail}")]
    Eval {
        /// Which expression (`len of x`, `global[0]`).
        what: String,
        /// The expression text.
        expr: String,
        /// What went wrong (unknown name, overflow, division by zero).
        detail: String,
    },
    /// The input is not the size the `in` and `inout` buffers need.
    #[error("the input is {got} bytes but the kernel's input buffers take {expected} bytes ({layout}); send exactly that")]
    InputSize {
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes given.
        got: u64,
        /// The layout, for people: `x: 1024 × float, y: 1024 × float`.
        layout: String,
    },
}

/// One argument bound to a submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BoundArg {
    /// A scalar's bytes, little-endian, exactly `ty`'s size.
    Scalar {
        /// Its name.
        name: String,
        /// Its type.
        ty: ScalarType,
        /// Its value's bytes.
        bytes: Vec<u8>,
    },
    /// A global buffer.
    Buffer {
        /// Its name.
        name: String,
        /// In, out, inout or scratch.
        kind: ArgKind,
        /// Element type.
        elem: ScalarType,
        /// Length in elements.
        len: u64,
        /// Size in bytes (`len` × element size).
        bytes: u64,
    },
    /// A local buffer of this many bytes.
    Local {
        /// Its name.
        name: String,
        /// Size in bytes.
        bytes: u64,
    },
}

/// A kernel launch resolved for one submission: every scalar's value, every
/// buffer's size, the work sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// The arguments in parameter order.
    pub args: Vec<BoundArg>,
    /// Global work size per dimension.
    pub global: Vec<u64>,
    /// Local work size per dimension, when the spec gives one.
    pub local: Option<Vec<u64>>,
    /// Bytes of input the `in` and `inout` buffers take.
    pub input_bytes: u64,
    /// Bytes of output the `out` and `inout` buffers give.
    pub output_bytes: u64,
    /// Bytes of global device memory all buffers take together.
    pub device_bytes: u64,
}

impl ScalarType {
    /// Size in bytes.
    pub fn size(self) -> u64 {
        match self {
            ScalarType::Char | ScalarType::Uchar => 1,
            ScalarType::Short | ScalarType::Ushort => 2,
            ScalarType::Int | ScalarType::Uint | ScalarType::Float => 4,
            ScalarType::Long | ScalarType::Ulong | ScalarType::Double => 8,
        }
    }

    /// Whether it is an integer type (usable in expressions).
    pub fn is_integer(self) -> bool {
        !matches!(self, ScalarType::Float | ScalarType::Double)
    }

    /// The OpenCL C name (`float`, `uint`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ScalarType::Char => "char",
            ScalarType::Uchar => "uchar",
            ScalarType::Short => "short",
            ScalarType::Ushort => "ushort",
            ScalarType::Int => "int",
            ScalarType::Uint => "uint",
            ScalarType::Long => "long",
            ScalarType::Ulong => "ulong",
            ScalarType::Float => "float",
            ScalarType::Double => "double",
        }
    }
}

impl KernelSpec {
    /// Checks the spec on its own: identifiers, unique names, a `len` on every
    /// buffer and `local` argument and none on scalars, a `default` only on
    /// scalars and of the right type, 1 to 3 global dimensions, local sizes
    /// absent or one per global dimension, and every expression parsing and
    /// naming only integer scalars.
    pub fn validate(&self) -> Result<(), SpecError> {
        todo!("spec helper")
    }

    /// Checks the spec against the kernel's source: the kernel exists, and its
    /// parameters match the arguments in number, order, address space and type.
    pub fn check_source(&self, source: &str) -> Result<(), SpecError> {
        let _ = source;
        todo!("spec helper")
    }

    /// Binds the spec to a submission's `name=value` arguments and its input
    /// length: parses every scalar (or takes its default), evaluates lengths
    /// and work sizes, and checks that the input is exactly the input buffers'
    /// size. Everything that can be refused before the kernel runs is refused
    /// here, so the coordinator can refuse it at submission.
    pub fn bind(&self, args: &[String], input_len: u64) -> Result<Launch, SpecError> {
        let _ = (args, input_len);
        todo!("spec helper")
    }
}

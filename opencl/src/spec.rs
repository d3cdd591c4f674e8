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

// Re-exported so `spec::DeviceType` and `spec::ScalarType` keep working. The
// types live lower down so that `signature` (scalar types) and the runtime
// (device types) can use them without importing the spec.
pub use crate::device::DeviceType;
use crate::expr::Expr;
pub use crate::scalar::ScalarType;
use crate::signature::{self, AddressSpace, ParamType};

/// The most work dimensions OpenCL allows.
pub const MAX_DIMS: usize = 3;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
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

/// The most global work items one launch may ask for (2^40): more is a
/// mistake in the arguments, not a job any device finishes.
pub const MAX_GLOBAL_ITEMS: u64 = 1 << 40;

/// The longest kernel or argument name accepted.
const MAX_NAME_LEN: usize = 128;

/// The longest `build_options` accepted.
const MAX_BUILD_OPTIONS_LEN: usize = 1024;

/// How much of a submitter's text an error message repeats.
const QUOTE_LEN: usize = 64;

impl ArgKind {
    /// The kind as written in a manifest (`in`, `scratch`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ArgKind::Scalar => "scalar",
            ArgKind::In => "in",
            ArgKind::Out => "out",
            ArgKind::Inout => "inout",
            ArgKind::Scratch => "scratch",
            ArgKind::Local => "local",
        }
    }
}

impl ArgSpec {
    /// `scalar uint`, `in float buffer`: how messages describe the argument.
    fn describe(&self) -> String {
        match self.kind {
            ArgKind::Scalar => format!("scalar {}", self.ty.as_str()),
            kind => format!("{} {} buffer", kind.as_str(), self.ty.as_str()),
        }
    }

    fn is_global_buffer(&self) -> bool {
        matches!(
            self.kind,
            ArgKind::In | ArgKind::Out | ArgKind::Inout | ArgKind::Scratch
        )
    }
}

impl KernelSpec {
    /// Checks the spec on its own: identifiers, unique names, a `len` on every
    /// buffer and `local` argument and none on scalars, a `default` only on
    /// scalars and of the right type, 1 to 3 global dimensions, local sizes
    /// absent or one per global dimension, and every expression parsing and
    /// naming only integer scalars.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_identifier("the kernel's name", &self.kernel)?;
        check_build_options(&self.build_options)?;
        for (index, arg) in self.args.iter().enumerate() {
            check_identifier(&format!("argument {index}'s name"), &arg.name)?;
            if self.args[..index]
                .iter()
                .any(|other| other.name == arg.name)
            {
                return Err(SpecError::Spec(format!(
                    "two arguments are named `{}`; give each argument its own name",
                    arg.name
                )));
            }
            let label = format!("argument {index} ({})", arg.name);
            if arg.kind == ArgKind::Scalar {
                if arg.len.is_some() {
                    return Err(SpecError::Spec(format!(
                        "{label} is a scalar but has a len; only buffers and local arguments have a length: remove it"
                    )));
                }
                if let Some(default) = &arg.default {
                    parse_scalar(arg.ty, default).map_err(|why| {
                        SpecError::Spec(format!("{label}: the default {} {why}", quote(default)))
                    })?;
                }
            } else {
                if arg.default.is_some() {
                    return Err(SpecError::Spec(format!(
                        "{label} is {} with a default; only scalars have defaults: remove it",
                        with_article(&arg.describe())
                    )));
                }
                let Some(len) = &arg.len else {
                    return Err(SpecError::Spec(format!(
                        "{label} is {} without a len; give its length in elements, such as len = \"n\"",
                        with_article(&arg.describe())
                    )));
                };
                self.parse_expr(&format!("len of {}", arg.name), len)?;
            }
        }
        if self.global.is_empty() || self.global.len() > MAX_DIMS {
            return Err(SpecError::Spec(format!(
                "global has {} dimensions; give 1 to {MAX_DIMS} work sizes",
                self.global.len()
            )));
        }
        if !self.local.is_empty() && self.local.len() != self.global.len() {
            return Err(SpecError::Spec(format!(
                "local has {} dimensions but global has {}; give one local size per global dimension, or none to let the runtime choose",
                self.local.len(),
                self.global.len()
            )));
        }
        for (dim, text) in self.global.iter().enumerate() {
            self.parse_expr(&format!("global[{dim}]"), text)?;
        }
        for (dim, text) in self.local.iter().enumerate() {
            self.parse_expr(&format!("local[{dim}]"), text)?;
        }
        Ok(())
    }

    /// Checks the spec against the kernel's source: the kernel exists, and its
    /// parameters match the arguments in number, order, address space and type.
    pub fn check_source(&self, source: &str) -> Result<(), SpecError> {
        if let Some(target) = signature::includes(source).first() {
            return Err(SpecError::Signature(format!(
                "the source includes {}; a package must be self-contained: paste what it needs into the source",
                quote(target)
            )));
        }
        let sig = signature::find_kernel(source, &self.kernel)
            .map_err(|err| SpecError::Signature(err.to_string()))?;
        if sig.params.len() != self.args.len() {
            let listed = if sig.params.is_empty() {
                "none".to_owned()
            } else {
                join(sig.params.iter().map(ToString::to_string))
            };
            return Err(SpecError::Signature(format!(
                "the spec has {} but kernel `{}` has {} ({listed}); declare one argument per parameter, in order",
                count(self.args.len(), "argument"),
                sig.name,
                count(sig.params.len(), "parameter"),
            )));
        }
        for (index, (arg, param)) in self.args.iter().zip(&sig.params).enumerate() {
            let ty = match &param.ty {
                ParamType::Known(ty) => *ty,
                ParamType::Unsupported { reason, .. } => {
                    return Err(SpecError::Signature(format!(
                        "argument {index} ({}): the source has `{param}`, which Starling cannot pass: {reason}",
                        arg.name
                    )));
                }
            };
            let space = param.space;
            let fits = ty == arg.ty
                && match arg.kind {
                    ArgKind::Scalar => !param.pointer && space == AddressSpace::Private,
                    ArgKind::In => {
                        param.pointer
                            && matches!(space, AddressSpace::Global | AddressSpace::Constant)
                    }
                    ArgKind::Out | ArgKind::Inout | ArgKind::Scratch => {
                        param.pointer && space == AddressSpace::Global
                    }
                    ArgKind::Local => param.pointer && space == AddressSpace::Local,
                };
            if !fits {
                let hint = if param.pointer && space == AddressSpace::Private {
                    " (a pointer parameter needs an address space: __global, __constant or __local)"
                } else if space == AddressSpace::Constant
                    && arg.is_global_buffer()
                    && arg.kind != ArgKind::In
                {
                    " (__constant memory is read-only: only an in buffer can be __constant)"
                } else {
                    ""
                };
                return Err(SpecError::Signature(format!(
                    "argument {index} ({}): the spec says {}, the source has {}{hint}",
                    arg.name,
                    arg.describe(),
                    param.type_text()
                )));
            }
        }
        if let Some(reqd) = sig.reqd_work_group_size {
            self.check_reqd_work_group_size(&sig.name, reqd)?;
        }
        Ok(())
    }

    /// A kernel with `reqd_work_group_size` fails to launch without exactly
    /// that local size, so a spec that cannot give it is refused now.
    fn check_reqd_work_group_size(&self, kernel: &str, reqd: [u64; 3]) -> Result<(), SpecError> {
        let dims = self.global.len();
        let shown = format!("{}×{}×{}", reqd[0], reqd[1], reqd[2]);
        let wanted: Vec<String> = reqd.iter().take(dims).map(u64::to_string).collect();
        if self.local.is_empty() {
            return Err(SpecError::Signature(format!(
                "kernel `{kernel}` requires work groups of {shown} (reqd_work_group_size); set local to {wanted:?}"
            )));
        }
        for (dim, want) in reqd.iter().enumerate() {
            match self.local.get(dim) {
                Some(text) => {
                    // Sizes that depend on arguments are checked by the
                    // compiler at launch; constants can be checked now.
                    let Ok(expr) = Expr::parse(text) else {
                        continue;
                    };
                    if !expr.names().is_empty() {
                        continue;
                    }
                    if let Ok(value) = expr.eval(&|_| None) {
                        if value != i128::from(*want) {
                            return Err(SpecError::Signature(format!(
                                "local[{dim}] is {value} but kernel `{kernel}` requires work groups of {shown} (reqd_work_group_size); set local to {wanted:?}"
                            )));
                        }
                    }
                }
                None if *want != 1 => {
                    return Err(SpecError::Signature(format!(
                        "kernel `{kernel}` requires work groups of {shown} (reqd_work_group_size) but the spec has {}; give global and local {} sizes",
                        count(dims, "dimension"),
                        dim + 1
                    )));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Binds the spec to a submission's `name=value` arguments and its input
    /// length: parses every scalar (or takes its default), evaluates lengths
    /// and work sizes, and checks that the input is exactly the input buffers'
    /// size. Everything that can be refused before the kernel runs is refused
    /// here, so the coordinator can refuse it at submission.
    pub fn bind(&self, args: &[String], input_len: u64) -> Result<Launch, SpecError> {
        self.validate()?;
        let given = self.given_values(args)?;

        // Scalars first: lengths and work sizes are expressions over them.
        let mut scalars: Vec<Option<Vec<u8>>> = vec![None; self.args.len()];
        let mut integers: Vec<(&str, i128)> = Vec::new();
        let mut missing = Vec::new();
        for (index, arg) in self.args.iter().enumerate() {
            if arg.kind != ArgKind::Scalar {
                continue;
            }
            let given_value = given
                .iter()
                .find(|(at, _)| *at == index)
                .map(|(_, value)| *value);
            let Some(text) = given_value.or(arg.default.as_deref()) else {
                missing.push(format!("{} ({})", arg.name, arg.ty.as_str()));
                continue;
            };
            let (bytes, integer) = parse_scalar(arg.ty, text).map_err(|why| {
                SpecError::Args(format!("`{}` = {} {why}", arg.name, quote(text)))
            })?;
            scalars[index] = Some(bytes);
            if let Some(value) = integer {
                integers.push((&arg.name, value));
            }
        }
        if !missing.is_empty() {
            return Err(SpecError::Args(format!(
                "missing {} for {}: give each as name=value",
                if missing.len() == 1 {
                    "a value"
                } else {
                    "values"
                },
                missing.join(", ")
            )));
        }
        let lookup = |name: &str| {
            integers
                .iter()
                .find(|(known, _)| *known == name)
                .map(|(_, value)| *value)
        };

        let mut bound = Vec::with_capacity(self.args.len());
        let (mut input_bytes, mut output_bytes, mut device_bytes) = (0u64, 0u64, 0u64);
        let mut layout = Vec::new();
        for (arg, scalar) in self.args.iter().zip(scalars) {
            if arg.kind == ArgKind::Scalar {
                bound.push(BoundArg::Scalar {
                    name: arg.name.clone(),
                    ty: arg.ty,
                    bytes: scalar.unwrap_or_default(),
                });
                continue;
            }
            let what = format!("len of {}", arg.name);
            let len_text = arg.len.as_deref().unwrap_or_default();
            let len = eval_size(&what, len_text, &lookup, "a length")?;
            let bytes = len
                .checked_mul(arg.ty.size())
                .ok_or_else(|| SpecError::Eval {
                    what: what.clone(),
                    expr: len_text.to_owned(),
                    detail: format!("{len} × {} takes more than 2^64 bytes", arg.ty.as_str()),
                })?;
            if arg.kind == ArgKind::Local {
                bound.push(BoundArg::Local {
                    name: arg.name.clone(),
                    bytes,
                });
                continue;
            }
            if matches!(arg.kind, ArgKind::In | ArgKind::Inout) {
                input_bytes = add_bytes(input_bytes, bytes, "the input buffers")?;
                layout.push(format!("{}: {len} × {}", arg.name, arg.ty.as_str()));
            }
            if matches!(arg.kind, ArgKind::Out | ArgKind::Inout) {
                output_bytes = add_bytes(output_bytes, bytes, "the output buffers")?;
            }
            device_bytes = add_bytes(device_bytes, bytes, "the buffers")?;
            bound.push(BoundArg::Buffer {
                name: arg.name.clone(),
                kind: arg.kind,
                elem: arg.ty,
                len,
                bytes,
            });
        }

        let mut global = Vec::with_capacity(self.global.len());
        for (dim, text) in self.global.iter().enumerate() {
            global.push(eval_size(
                &format!("global[{dim}]"),
                text,
                &lookup,
                "a work size",
            )?);
        }
        let mut items: u128 = 1;
        for size in &global {
            items = items.saturating_mul(u128::from(*size));
        }
        if items > u128::from(MAX_GLOBAL_ITEMS) {
            let sizes: Vec<String> = global.iter().map(u64::to_string).collect();
            return Err(SpecError::Args(format!(
                "the global work size {} is {items} work items, more than the limit of 2^40; use smaller arguments",
                sizes.join(" × ")
            )));
        }
        let local = if self.local.is_empty() {
            None
        } else {
            let mut local = Vec::with_capacity(self.local.len());
            for (dim, text) in self.local.iter().enumerate() {
                let size = eval_size(&format!("local[{dim}]"), text, &lookup, "a work size")?;
                let whole = global.get(dim).copied().unwrap_or(1);
                if whole % size != 0 {
                    return Err(SpecError::Args(format!(
                        "global[{dim}] = {whole} is not a multiple of local[{dim}] = {size}; OpenCL 1.2 needs each global size to be a multiple of its local size (write global[{dim}] as roundup(..., {size}))"
                    )));
                }
                local.push(size);
            }
            Some(local)
        };

        if input_len != input_bytes {
            return Err(SpecError::InputSize {
                expected: input_bytes,
                got: input_len,
                layout: if layout.is_empty() {
                    "the kernel has no in or inout buffers".to_owned()
                } else {
                    layout.join(", ")
                },
            });
        }
        Ok(Launch {
            args: bound,
            global,
            local,
            input_bytes,
            output_bytes,
            device_bytes,
        })
    }

    /// The submission's `name=value` pairs as (argument index, value).
    fn given_values<'a>(&self, args: &'a [String]) -> Result<Vec<(usize, &'a str)>, SpecError> {
        let mut given: Vec<(usize, &str)> = Vec::with_capacity(args.len());
        for raw in args {
            let Some((name, value)) = raw.split_once('=') else {
                return Err(SpecError::Args(format!(
                    "{} is not name=value; write it as, for example, n=1024",
                    quote(raw)
                )));
            };
            let name = name.trim();
            let Some(index) = self.args.iter().position(|arg| arg.name == name) else {
                return Err(SpecError::Args(format!(
                    "unknown argument {}; {}",
                    quote(name),
                    self.scalars_hint()
                )));
            };
            let arg = &self.args[index];
            if arg.kind != ArgKind::Scalar {
                return Err(SpecError::Args(format!(
                    "`{name}` is {}, which comes from the task's input, not from an argument; remove {name}=...",
                    with_article(&arg.describe())
                )));
            }
            if given.iter().any(|(at, _)| *at == index) {
                return Err(SpecError::Args(format!(
                    "`{name}` is given twice; give it once"
                )));
            }
            given.push((index, value.trim()));
        }
        Ok(given)
    }

    fn scalars_hint(&self) -> String {
        let scalars: Vec<String> = self
            .args
            .iter()
            .filter(|arg| arg.kind == ArgKind::Scalar)
            .map(|arg| format!("{} ({})", arg.name, arg.ty.as_str()))
            .collect();
        if scalars.is_empty() {
            "this kernel takes no scalar arguments".to_owned()
        } else {
            format!("this kernel's scalar arguments are {}", scalars.join(", "))
        }
    }

    /// Parses an expression of the spec and checks that it names only
    /// integer scalars.
    fn parse_expr(&self, what: &str, text: &str) -> Result<Expr, SpecError> {
        let expr = Expr::parse(text).map_err(|err| {
            SpecError::Spec(format!("{what} = {} does not parse: {err}", quote(text)))
        })?;
        for name in expr.names() {
            let problem = match self.args.iter().find(|arg| arg.name == name) {
                None => "which is not an argument".to_owned(),
                Some(arg) if arg.kind != ArgKind::Scalar => {
                    format!("which is {}", with_article(&arg.describe()))
                }
                Some(arg) if !arg.ty.is_integer() => {
                    format!("which is a {} scalar", arg.ty.as_str())
                }
                Some(_) => continue,
            };
            let usable: Vec<&str> = self
                .args
                .iter()
                .filter(|arg| arg.kind == ArgKind::Scalar && arg.ty.is_integer())
                .map(|arg| arg.name.as_str())
                .collect();
            let usable = if usable.is_empty() {
                "the spec has no integer scalars, so use numbers".to_owned()
            } else {
                format!("the integer scalars are {}", usable.join(", "))
            };
            return Err(SpecError::Spec(format!(
                "{what} = {} names `{name}`, {problem}; expressions can use only integer scalar arguments ({usable})",
                quote(text)
            )));
        }
        Ok(expr)
    }
}

/// Evaluates a length or work size, which must be at least 1 and fit u64.
fn eval_size(
    what: &str,
    text: &str,
    lookup: &dyn Fn(&str) -> Option<i128>,
    noun: &str,
) -> Result<u64, SpecError> {
    let failed = |detail: String| SpecError::Eval {
        what: what.to_owned(),
        expr: text.to_owned(),
        detail,
    };
    let value = Expr::parse(text)
        .and_then(|expr| expr.eval(lookup))
        .map_err(|err| failed(err.to_string()))?;
    if value < 1 {
        return Err(failed(format!(
            "the result is {value}; {noun} must be at least 1"
        )));
    }
    u64::try_from(value).map_err(|_| failed(format!("the result {value} is more than 2^64 - 1")))
}

fn add_bytes(total: u64, bytes: u64, what: &str) -> Result<u64, SpecError> {
    total.checked_add(bytes).ok_or_else(|| {
        SpecError::Args(format!(
            "{what} together take more than 2^64 bytes; use smaller arguments"
        ))
    })
}

/// Parses a scalar's text as `ty`: its little-endian bytes, and its value when
/// it is an integer. The error completes a sentence about the value.
fn parse_scalar(ty: ScalarType, text: &str) -> Result<(Vec<u8>, Option<i128>), String> {
    let text = text.trim();
    match ty {
        ScalarType::Float => {
            let value: f32 = text.parse().map_err(|_| not_a_float(ty))?;
            if !value.is_finite() {
                return Err(not_finite(ty));
            }
            Ok((value.to_le_bytes().to_vec(), None))
        }
        ScalarType::Double => {
            let value: f64 = text.parse().map_err(|_| not_a_float(ty))?;
            if !value.is_finite() {
                return Err(not_finite(ty));
            }
            Ok((value.to_le_bytes().to_vec(), None))
        }
        _ => {
            let (low, high) = integer_range(ty);
            let wrong = || {
                format!(
                    "is not {} (a whole number from {low} to {high})",
                    with_article(ty.as_str())
                )
            };
            let value = parse_integer(text).ok_or_else(wrong)?;
            let bytes = integer_bytes(ty, value).ok_or_else(wrong)?;
            Ok((bytes, Some(value)))
        }
    }
}

fn not_a_float(ty: ScalarType) -> String {
    format!(
        "is not {} (a number such as 1.5, -2 or 3e-4)",
        with_article(ty.as_str())
    )
}

fn not_finite(ty: ScalarType) -> String {
    format!(
        "does not fit {}: only finite values can be passed",
        ty.as_str()
    )
}

/// Decimal or `0x` hexadecimal, with an optional sign.
fn parse_integer(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            i128::from_str_radix(hex, 16).ok()?
        }
        Some(_) => return None,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse::<i128>().ok()?
        }
        None => return None,
    };
    if negative {
        magnitude.checked_neg()
    } else {
        Some(magnitude)
    }
}

fn integer_range(ty: ScalarType) -> (i128, i128) {
    match ty {
        ScalarType::Char => (i8::MIN.into(), i8::MAX.into()),
        ScalarType::Uchar => (0, u8::MAX.into()),
        ScalarType::Short => (i16::MIN.into(), i16::MAX.into()),
        ScalarType::Ushort => (0, u16::MAX.into()),
        ScalarType::Int => (i32::MIN.into(), i32::MAX.into()),
        ScalarType::Uint => (0, u32::MAX.into()),
        ScalarType::Long => (i64::MIN.into(), i64::MAX.into()),
        ScalarType::Ulong => (0, u64::MAX.into()),
        ScalarType::Float | ScalarType::Double => (0, 0),
    }
}

fn integer_bytes(ty: ScalarType, value: i128) -> Option<Vec<u8>> {
    Some(match ty {
        ScalarType::Char => i8::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Uchar => u8::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Short => i16::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Ushort => u16::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Int => i32::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Uint => u32::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Long => i64::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Ulong => u64::try_from(value).ok()?.to_le_bytes().to_vec(),
        ScalarType::Float | ScalarType::Double => return None,
    })
}

fn check_identifier(what: &str, name: &str) -> Result<(), SpecError> {
    let mut bytes = name.bytes();
    let valid = bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(SpecError::Spec(format!(
            "{what} {} is not an identifier; use letters, digits and _, not starting with a digit",
            quote(name)
        )));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(SpecError::Spec(format!(
            "{what} is {} characters long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

fn check_build_options(options: &str) -> Result<(), SpecError> {
    if options.len() > MAX_BUILD_OPTIONS_LEN {
        return Err(SpecError::Spec(format!(
            "build_options is {} bytes long; the limit is {MAX_BUILD_OPTIONS_LEN}",
            options.len()
        )));
    }
    if options.chars().any(|c| c.is_control() && c != ' ') {
        return Err(SpecError::Spec(
            "build_options contains control characters; separate options with spaces".to_owned(),
        ));
    }
    // `-I` points the compiler at the agent's own files; a package must carry
    // everything it compiles.
    if let Some(option) = options
        .split_whitespace()
        .find(|option| option.starts_with("-I"))
    {
        return Err(SpecError::Spec(format!(
            "build_options has {}; include paths are not allowed, as a package must be self-contained",
            quote(option)
        )));
    }
    Ok(())
}

/// `text` in backquotes, shortened so a hostile submission cannot flood a message.
fn quote(text: &str) -> String {
    let mut chars = text.chars();
    let short: String = chars.by_ref().take(QUOTE_LEN).collect();
    if chars.next().is_some() {
        format!("`{short}…`")
    } else {
        format!("`{short}`")
    }
}

fn with_article(noun: &str) -> String {
    let article = if noun.starts_with(['a', 'e', 'i', 'o']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {noun}")
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

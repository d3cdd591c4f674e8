//! The pure half of OpenCL tasks, as the coordinator uses it: kernel specs
//! checked on their own and against their source, bound to submissions, and
//! packages parsed and written. No OpenCL device is involved.

use crate::common::{arg, spec, tiled_matmul_args};
use proptest::prelude::*;
use starling_opencl::expr::Expr;
use starling_opencl::package::{FORMAT, MAX_PACKAGE_BYTES, MAX_SOURCE_BYTES};
use starling_opencl::{
    ArgKind, ArgSpec, BoundArg, DeviceType, KernelSpec, Package, ScalarType, SpecError,
};

const SAXPY: &str = r#"
// y = a * x + y, one work item per element.
__kernel void saxpy(const uint n, const float a, __global const float *x, __global float *y) {
    uint i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

const MATMUL: &str = r#"
#define TILE 16
/* C = A × B for square n × n matrices, in 16 × 16 tiles.
   __kernel void matmul_naive(__global float *c) { } -- an old version, commented out */
__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void matmul(const uint n,
            __global const float * restrict a,
            __global const float * restrict b,
            __global float * restrict c,
            __local float *ta,
            __local float *tb)
{
    uint col = get_global_id(0), row = get_global_id(1);
    uint lx = get_local_id(0), ly = get_local_id(1);
    float acc = 0.0f;
    for (uint t = 0; t < (n + TILE - 1) / TILE; t++) {
        uint ac = t * TILE + lx, br = t * TILE + ly;
        ta[ly * TILE + lx] = (row < n && ac < n) ? a[row * n + ac] : 0.0f;
        tb[ly * TILE + lx] = (br < n && col < n) ? b[br * n + col] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint k = 0; k < TILE; k++) acc += ta[ly * TILE + k] * tb[k * TILE + lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < n && col < n) c[row * n + col] = acc;
}

// A helper kernel in the same source.
__kernel void fill(__global float *out, const float value) { out[get_global_id(0)] = value; }
"#;

fn saxpy_spec() -> KernelSpec {
    spec(
        "saxpy",
        &["n"],
        vec![
            arg("n", ArgKind::Scalar, ScalarType::Uint, None),
            ArgSpec {
                default: Some("1.0".into()),
                ..arg("a", ArgKind::Scalar, ScalarType::Float, None)
            },
            arg("x", ArgKind::In, ScalarType::Float, Some("n")),
            arg("y", ArgKind::Inout, ScalarType::Float, Some("n")),
        ],
    )
}

fn matmul_spec() -> KernelSpec {
    KernelSpec {
        kernel: "matmul".into(),
        device: DeviceType::Gpu,
        global: vec!["roundup(n, 16)".into(), "roundup(n, 16)".into()],
        local: vec!["16".into(), "16".into()],
        build_options: "-cl-fast-relaxed-math".into(),
        args: tiled_matmul_args(),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

fn spec_error(spec: &KernelSpec) -> String {
    match spec.validate() {
        Err(SpecError::Spec(message)) => message,
        other => panic!("expected a spec error, got {other:?}"),
    }
}

fn signature_error(spec: &KernelSpec, source: &str) -> String {
    match spec.check_source(source) {
        Err(SpecError::Signature(message)) => message,
        other => panic!("expected a signature error, got {other:?}"),
    }
}

fn args_error(spec: &KernelSpec, args: &[&str], input_len: u64) -> String {
    match spec.bind(&strings(args), input_len) {
        Err(SpecError::Args(message)) => message,
        other => panic!("expected an argument error, got {other:?}"),
    }
}

fn eval_error(spec: &KernelSpec, args: &[&str], input_len: u64) -> (String, String, String) {
    match spec.bind(&strings(args), input_len) {
        Err(SpecError::Eval { what, expr, detail }) => (what, expr, detail),
        other => panic!("expected an evaluation error, got {other:?}"),
    }
}

// --- happy paths -----------------------------------------------------------

#[test]
fn saxpy_binds_scalars_buffers_and_sizes() {
    let spec = saxpy_spec();
    spec.validate().unwrap();
    spec.check_source(SAXPY).unwrap();
    let launch = spec.bind(&strings(&["n=1024"]), 8192).unwrap();
    assert_eq!(
        launch.args,
        vec![
            BoundArg::Scalar {
                name: "n".into(),
                ty: ScalarType::Uint,
                bytes: 1024u32.to_le_bytes().to_vec(),
            },
            BoundArg::Scalar {
                name: "a".into(),
                ty: ScalarType::Float,
                bytes: 1.0f32.to_le_bytes().to_vec(),
            },
            BoundArg::Buffer {
                name: "x".into(),
                kind: ArgKind::In,
                elem: ScalarType::Float,
                len: 1024,
                bytes: 4096,
            },
            BoundArg::Buffer {
                name: "y".into(),
                kind: ArgKind::Inout,
                elem: ScalarType::Float,
                len: 1024,
                bytes: 4096,
            },
        ]
    );
    assert_eq!(launch.global, vec![1024]);
    assert_eq!(launch.local, None);
    assert_eq!(launch.input_bytes, 8192);
    assert_eq!(launch.output_bytes, 4096);
    assert_eq!(launch.device_bytes, 8192);
}

#[test]
fn given_values_override_defaults_and_accept_spaces_and_hex() {
    let launch = saxpy_spec()
        .bind(&strings(&[" a = -2.5e-1 ", "n=0x10"]), 128)
        .unwrap();
    assert_eq!(
        launch.args[0],
        BoundArg::Scalar {
            name: "n".into(),
            ty: ScalarType::Uint,
            bytes: 16u32.to_le_bytes().to_vec(),
        }
    );
    assert_eq!(
        launch.args[1],
        BoundArg::Scalar {
            name: "a".into(),
            ty: ScalarType::Float,
            bytes: (-0.25f32).to_le_bytes().to_vec(),
        }
    );
}

#[test]
fn every_scalar_type_is_little_endian_and_range_checked() {
    let cases: &[(ScalarType, &str, Vec<u8>, &str)] = &[
        (ScalarType::Char, "-128", vec![0x80], "128"),
        (ScalarType::Uchar, "255", vec![0xff], "256"),
        (
            ScalarType::Short,
            "-2",
            (-2i16).to_le_bytes().to_vec(),
            "32768",
        ),
        (ScalarType::Ushort, "65535", vec![0xff, 0xff], "-1"),
        (
            ScalarType::Int,
            "-2147483648",
            i32::MIN.to_le_bytes().to_vec(),
            "2147483648",
        ),
        (
            ScalarType::Uint,
            "4294967295",
            u32::MAX.to_le_bytes().to_vec(),
            "4294967296",
        ),
        (
            ScalarType::Long,
            "-9223372036854775808",
            i64::MIN.to_le_bytes().to_vec(),
            "9223372036854775808",
        ),
        (
            ScalarType::Ulong,
            "18446744073709551615",
            u64::MAX.to_le_bytes().to_vec(),
            "18446744073709551616",
        ),
        (
            ScalarType::Float,
            "3.5",
            3.5f32.to_le_bytes().to_vec(),
            "1e39",
        ),
        (
            ScalarType::Double,
            "1e300",
            1e300f64.to_le_bytes().to_vec(),
            "1e309",
        ),
    ];
    for (ty, good, bytes, bad) in cases {
        let spec = KernelSpec {
            kernel: "k".into(),
            device: DeviceType::Any,
            global: vec!["1".into()],
            local: vec![],
            build_options: String::new(),
            args: vec![arg("v", ArgKind::Scalar, *ty, None)],
        };
        let launch = spec.bind(&[format!("v={good}")], 0).unwrap();
        assert_eq!(
            launch.args[0],
            BoundArg::Scalar {
                name: "v".into(),
                ty: *ty,
                bytes: bytes.clone()
            },
            "{ty:?}"
        );
        assert_eq!(bytes.len() as u64, ty.size());
        let message = args_error(&spec, &[&format!("v={bad}")], 0);
        assert!(message.starts_with(&format!("`v` = `{bad}`")), "{message}");
        assert!(
            message.contains(ty.as_str()),
            "{ty:?}: the message names the type: {message}"
        );
    }
}

#[test]
fn matmul_binds_with_local_tiles_and_attribute() {
    let spec = matmul_spec();
    spec.validate().unwrap();
    spec.check_source(MATMUL).unwrap();
    let launch = spec.bind(&strings(&["n=100"]), 2 * 100 * 100 * 4).unwrap();
    assert_eq!(launch.global, vec![112, 112]);
    assert_eq!(launch.local, Some(vec![16, 16]));
    assert_eq!(launch.input_bytes, 80_000);
    assert_eq!(launch.output_bytes, 40_000);
    assert_eq!(launch.device_bytes, 120_000);
    assert_eq!(
        launch.args[4],
        BoundArg::Local {
            name: "ta".into(),
            bytes: 1024
        }
    );
    assert_eq!(
        launch.args[3],
        BoundArg::Buffer {
            name: "c".into(),
            kind: ArgKind::Out,
            elem: ScalarType::Float,
            len: 10_000,
            bytes: 40_000
        }
    );
}

#[test]
fn scratch_buffers_count_on_the_device_only() {
    let source = "__kernel void two_pass(uint n, __global const int *in, __global int *tmp, __global long *out) {}";
    let spec = spec(
        "two_pass",
        &["n"],
        vec![
            arg("n", ArgKind::Scalar, ScalarType::Uint, None),
            arg("in", ArgKind::In, ScalarType::Int, Some("n")),
            arg("tmp", ArgKind::Scratch, ScalarType::Int, Some("2 * n")),
            arg("out", ArgKind::Out, ScalarType::Long, Some("(n + 63) / 64")),
        ],
    );
    spec.check_source(source).unwrap();
    let launch = spec.bind(&strings(&["n=1000"]), 4000).unwrap();
    assert_eq!(launch.input_bytes, 4000);
    assert_eq!(launch.output_bytes, 16 * 8);
    assert_eq!(launch.device_bytes, 4000 + 8000 + 128);
}

#[test]
fn constant_in_buffers_and_c_type_names_match() {
    let source =
        "__kernel void scale(unsigned int n, __constant float *lut, global unsigned char *px) {}";
    let spec = KernelSpec {
        kernel: "scale".into(),
        device: DeviceType::Cpu,
        global: vec!["n".into()],
        local: vec![],
        build_options: String::new(),
        args: vec![
            arg("count", ArgKind::Scalar, ScalarType::Uint, None),
            arg("table", ArgKind::In, ScalarType::Float, Some("256")),
            arg("pixels", ArgKind::Inout, ScalarType::Uchar, Some("count")),
        ],
    };
    // `n` in global names the spec's arguments, not the source's parameters.
    assert!(spec_error(&spec).contains("names `n`, which is not an argument"));
    let spec = KernelSpec {
        global: vec!["count".into()],
        ..spec
    };
    spec.check_source(source).unwrap();
}

// --- the spec on its own ---------------------------------------------------

#[test]
fn bad_expressions_are_refused_with_their_position() {
    let mut spec = saxpy_spec();
    spec.args[2].len = Some("n +".into());
    let message = spec_error(&spec);
    assert!(
        message.starts_with("len of x = `n +` does not parse"),
        "{message}"
    );
    assert!(message.contains("ends early"), "{message}");

    spec.args[2].len = Some("(n))".into());
    let message = spec_error(&spec);
    assert!(message.contains("unexpected ')' at column 4"), "{message}");

    let mut spec = saxpy_spec();
    spec.global = vec!["pow(n, 2)".into()];
    let message = spec_error(&spec);
    assert!(message.starts_with("global[0] = `pow(n, 2)`"), "{message}");
    assert!(message.contains("unknown function `pow`"), "{message}");
}

#[test]
fn expressions_may_name_only_integer_scalars() {
    let mut spec = saxpy_spec();
    spec.args[2].len = Some("m".into());
    assert_eq!(
        spec_error(&spec),
        "len of x = `m` names `m`, which is not an argument; expressions can use only integer scalar arguments (the integer scalars are n)"
    );

    spec.args[2].len = Some("n * a".into());
    let message = spec_error(&spec);
    assert!(
        message.contains("names `a`, which is a float scalar"),
        "{message}"
    );

    spec.args[2].len = Some("y".into());
    let message = spec_error(&spec);
    assert!(
        message.contains("names `y`, which is an inout float buffer"),
        "{message}"
    );

    let mut spec = saxpy_spec();
    spec.local = vec!["a".into()];
    assert!(spec_error(&spec).starts_with("local[0] = `a` names `a`"));
}

#[test]
fn lengths_belong_to_buffers_and_defaults_to_scalars() {
    let mut spec = saxpy_spec();
    spec.args[2].len = None;
    assert_eq!(
        spec_error(&spec),
        "argument 2 (x) is an in float buffer without a len; give its length in elements, such as len = \"n\""
    );

    let mut spec = saxpy_spec();
    spec.args[0].len = Some("4".into());
    assert!(spec_error(&spec).starts_with("argument 0 (n) is a scalar but has a len"));

    let mut spec = saxpy_spec();
    spec.args[3].default = Some("0".into());
    assert!(spec_error(&spec).starts_with("argument 3 (y) is an inout float buffer with a default"));

    let mut spec = matmul_spec();
    spec.args[4].len = None;
    assert!(spec_error(&spec).starts_with("argument 4 (ta) is a local float buffer without a len"));

    let mut spec = saxpy_spec();
    spec.args[1].default = Some("fast".into());
    let message = spec_error(&spec);
    assert!(
        message.starts_with("argument 1 (a): the default `fast` is not a float"),
        "{message}"
    );

    let mut spec = saxpy_spec();
    spec.args[0].default = Some("-1".into());
    let message = spec_error(&spec);
    assert!(
        message.contains("is not a uint (a whole number from 0 to 4294967295)"),
        "{message}"
    );
}

#[test]
fn names_must_be_unique_identifiers() {
    let mut spec = saxpy_spec();
    spec.args[3].name = "x".into();
    assert_eq!(
        spec_error(&spec),
        "two arguments are named `x`; give each argument its own name"
    );

    let mut spec = saxpy_spec();
    spec.args[1].name = "2a".into();
    assert!(spec_error(&spec).contains("`2a` is not an identifier"));

    let mut spec = saxpy_spec();
    spec.kernel = "saxpy()".into();
    assert!(spec_error(&spec).starts_with("the kernel's name `saxpy()` is not an identifier"));

    let mut spec = saxpy_spec();
    spec.args[0].name = "n".repeat(129);
    assert!(spec_error(&spec).contains("the limit is 128"));
}

#[test]
fn work_dimensions_are_checked() {
    let mut spec = saxpy_spec();
    spec.global = strings(&["n", "1", "1", "1"]);
    assert_eq!(
        spec_error(&spec),
        "global has 4 dimensions; give 1 to 3 work sizes"
    );
    spec.global = vec![];
    assert!(spec_error(&spec).starts_with("global has 0 dimensions"));

    let mut spec = matmul_spec();
    spec.local = strings(&["16"]);
    assert_eq!(
        spec_error(&spec),
        "local has 1 dimensions but global has 2; give one local size per global dimension, or none to let the runtime choose"
    );
}

#[test]
fn build_options_cannot_reach_the_agents_files() {
    let mut spec = saxpy_spec();
    spec.build_options = "-cl-mad-enable -I/etc".into();
    assert!(spec_error(&spec).contains("include paths are not allowed"));
    spec.build_options = "-DX=1\n-DY=2".into();
    assert!(spec_error(&spec).contains("control characters"));
    spec.build_options = "-DTILE=16 -cl-fast-relaxed-math".into();
    spec.validate().unwrap();
}

// --- the spec against its source ------------------------------------------

#[test]
fn argument_count_must_match_the_kernel() {
    let mut spec = saxpy_spec();
    spec.args.pop();
    assert_eq!(
        signature_error(&spec, SAXPY),
        "the spec has 3 arguments but kernel `saxpy` has 4 parameters (uint n, float a, __global float* x, __global float* y); declare one argument per parameter, in order"
    );
}

#[test]
fn type_and_kind_mismatches_name_both_sides() {
    let source = SAXPY.replace("__global const float *x", "__global const int *x");
    assert_eq!(
        signature_error(&saxpy_spec(), &source),
        "argument 2 (x): the spec says in float buffer, the source has __global int*"
    );

    let mut spec = saxpy_spec();
    spec.args[0].ty = ScalarType::Int;
    assert_eq!(
        signature_error(&spec, SAXPY),
        "argument 0 (n): the spec says scalar int, the source has uint"
    );

    let mut spec = saxpy_spec();
    spec.args[3].kind = ArgKind::Local;
    assert_eq!(
        signature_error(&spec, SAXPY),
        "argument 3 (y): the spec says local float buffer, the source has __global float*"
    );

    let mut spec = saxpy_spec();
    spec.args[1] = arg("a", ArgKind::In, ScalarType::Float, Some("n"));
    assert_eq!(
        signature_error(&spec, SAXPY),
        "argument 1 (a): the spec says in float buffer, the source has float"
    );

    let constant_out = "__kernel void k(__constant float *y) {}";
    let spec = KernelSpec {
        kernel: "k".into(),
        device: DeviceType::Any,
        global: vec!["1".into()],
        local: vec![],
        build_options: String::new(),
        args: vec![arg("y", ArgKind::Out, ScalarType::Float, Some("1"))],
    };
    let message = signature_error(&spec, constant_out);
    assert!(
        message.contains("the source has __constant float*"),
        "{message}"
    );
    assert!(
        message.contains("only an in buffer can be __constant"),
        "{message}"
    );

    let spec_in = KernelSpec {
        args: vec![arg("y", ArgKind::In, ScalarType::Float, Some("1"))],
        ..spec.clone()
    };
    spec_in
        .check_source("__kernel void k(__constant float *y) {}")
        .unwrap();
    assert_eq!(
        signature_error(&spec_in, "__kernel void k(__constant int *y) {}"),
        "argument 0 (y): the spec says in float buffer, the source has __constant int*"
    );

    let private_pointer = "__kernel void k(float *y) {}";
    let message = signature_error(&spec, private_pointer);
    assert!(message.contains("needs an address space"), "{message}");
}

#[test]
fn unsupported_parameter_types_are_explained() {
    let mut spec = saxpy_spec();
    let size_t = SAXPY.replace("const uint n", "const size_t n");
    let message = signature_error(&spec, &size_t);
    assert!(
        message
            .starts_with("argument 0 (n): the source has `size_t n`, which Starling cannot pass"),
        "{message}"
    );
    assert!(message.contains("use uint or ulong"), "{message}");

    let vector = SAXPY.replace("__global const float *x", "__global const float4 *x");
    let message = signature_error(&spec, &vector);
    assert!(
        message.contains("vector type `float4` is not supported"),
        "{message}"
    );

    spec.args[0].ty = ScalarType::Float;
    let macro_type = "#define REAL float\n__kernel void saxpy(REAL n, float a, __global float *x, __global float *y) {}";
    let message = signature_error(&spec, macro_type);
    assert!(
        message.contains("macros and typedefs are not expanded"),
        "{message}"
    );
}

#[test]
fn missing_kernels_list_what_the_source_declares() {
    let mut spec = matmul_spec();
    spec.kernel = "matmul_naive".into();
    // The commented-out kernel does not count.
    assert_eq!(
        signature_error(&spec, MATMUL),
        "kernel `matmul_naive` not found; the source declares: matmul, fill"
    );
    let message = signature_error(&spec, "float helper(float x) { return x; }");
    assert!(message.contains("nor any other kernel"), "{message}");
}

#[test]
fn fake_kernels_in_comments_are_ignored() {
    let source = format!(
        "// __kernel void saxpy(int n) {{}}\n/* __kernel void saxpy(int n, int m) {{}} */\n{SAXPY}"
    );
    saxpy_spec().check_source(&source).unwrap();
    // A comment inside the parameter list hides a parameter.
    let hidden = SAXPY.replace("const float a,", "const float a, /* __global int *z, */");
    saxpy_spec().check_source(&hidden).unwrap();
}

#[test]
fn includes_are_refused() {
    let source = format!("#include \"helpers.h\"\n{SAXPY}");
    let message = signature_error(&saxpy_spec(), &source);
    assert!(message.contains("self-contained"), "{message}");
}

#[test]
fn reqd_work_group_size_needs_that_local_size() {
    let mut spec = matmul_spec();
    spec.local = vec![];
    assert_eq!(
        signature_error(&spec, MATMUL),
        "kernel `matmul` requires work groups of 16×16×1 (reqd_work_group_size); set local to [\"16\", \"16\"]"
    );
    spec.local = strings(&["8", "16"]);
    let message = signature_error(&spec, MATMUL);
    assert!(
        message.starts_with("local[0] is 8 but kernel `matmul` requires"),
        "{message}"
    );
    let mut spec = matmul_spec();
    spec.global = strings(&["roundup(n, 16)"]);
    spec.local = strings(&["16"]);
    let message = signature_error(&spec, MATMUL);
    assert!(message.contains("the spec has 1 dimension"), "{message}");
}

// --- binding to a submission ---------------------------------------------

#[test]
fn submission_arguments_are_checked_by_name() {
    let spec = saxpy_spec();
    assert_eq!(
        args_error(&spec, &["n=4", "m=3"], 32),
        "unknown argument `m`; this kernel's scalar arguments are n (uint), a (float)"
    );
    assert_eq!(
        args_error(&spec, &["n=4", "n=5"], 32),
        "`n` is given twice; give it once"
    );
    assert!(args_error(&spec, &["n"], 32).starts_with("`n` is not name=value"));
    assert!(args_error(&spec, &["n=4", "x=1"], 32)
        .starts_with("`x` is an in float buffer, which comes from the task's input"));
    assert_eq!(
        args_error(&spec, &["n=1.5"], 32),
        "`n` = `1.5` is not a uint (a whole number from 0 to 4294967295)"
    );
    assert!(args_error(&spec, &["n=4", "a=fast"], 32).starts_with("`a` = `fast` is not a float"));
    assert!(args_error(&spec, &["n=4", "a=inf"], 32).contains("only finite values"));
    let long_value = format!("n={}", "9".repeat(500));
    let message = args_error(&spec, &[&long_value], 32);
    assert!(message.len() < 200, "the value is shortened: {message}");
}

#[test]
fn missing_scalars_are_listed() {
    let mut spec = saxpy_spec();
    assert_eq!(
        args_error(&spec, &[], 0),
        "missing a value for n (uint): give each as name=value"
    );
    spec.args[1].default = None;
    assert_eq!(
        args_error(&spec, &[], 0),
        "missing values for n (uint), a (float): give each as name=value"
    );
}

#[test]
fn input_must_be_exactly_the_input_buffers() {
    let err = saxpy_spec().bind(&strings(&["n=1024"]), 8000).unwrap_err();
    assert_eq!(
        err,
        SpecError::InputSize {
            expected: 8192,
            got: 8000,
            layout: "x: 1024 × float, y: 1024 × float".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "the input is 8000 bytes but the kernel's input buffers take 8192 bytes (x: 1024 × float, y: 1024 × float); send exactly that"
    );
}

#[test]
fn lengths_and_sizes_must_be_positive_and_finite() {
    let spec = saxpy_spec();
    let (what, expr, detail) = eval_error(&spec, &["n=0"], 0);
    assert_eq!((what.as_str(), expr.as_str()), ("len of x", "n"));
    assert_eq!(detail, "the result is 0; a length must be at least 1");

    let mut spec = saxpy_spec();
    spec.args[0].ty = ScalarType::Int;
    let (_, _, detail) = eval_error(&spec, &["n=-4"], 0);
    assert!(detail.contains("the result is -4"), "{detail}");

    let mut spec = saxpy_spec();
    spec.args[0].ty = ScalarType::Ulong;
    let (what, _, detail) = eval_error(&spec, &["n=18446744073709551615"], 0);
    assert_eq!(what, "len of x");
    assert!(detail.contains("more than 2^64 bytes"), "{detail}");

    spec.args[2].len = Some("n * n * n".into());
    let (_, _, detail) = eval_error(&spec, &["n=18446744073709551615"], 0);
    assert!(detail.contains("overflow"), "{detail}");

    spec.args[2].len = Some("n / (n - 4)".into());
    let (_, _, detail) = eval_error(&spec, &["n=4"], 0);
    assert_eq!(detail, "division by zero");
}

#[test]
fn work_sizes_are_checked_against_each_other() {
    let mut spec = matmul_spec();
    spec.global = strings(&["n", "n"]);
    assert_eq!(
        args_error(&spec, &["n=100"], 80_000),
        "global[0] = 100 is not a multiple of local[0] = 16; OpenCL 1.2 needs each global size to be a multiple of its local size (write global[0] as roundup(..., 16))"
    );
    spec.bind(&strings(&["n=96"]), 2 * 96 * 96 * 4).unwrap();

    let huge = KernelSpec {
        kernel: "k".into(),
        device: DeviceType::Any,
        global: strings(&["n", "n"]),
        local: vec![],
        build_options: String::new(),
        args: vec![arg("n", ArgKind::Scalar, ScalarType::Ulong, None)],
    };
    let message = args_error(&huge, &["n=1048577"], 0);
    assert!(message.contains("more than the limit of 2^40"), "{message}");
    assert_eq!(
        huge.bind(&strings(&["n=1048576"]), 0).unwrap().global,
        vec![1 << 20, 1 << 20]
    );
    let (what, _, detail) = eval_error(&huge, &["n=0"], 0);
    assert_eq!(what, "global[0]");
    assert!(
        detail.contains("a work size must be at least 1"),
        "{detail}"
    );
}

#[test]
fn bind_refuses_an_invalid_spec() {
    let mut spec = saxpy_spec();
    spec.args[2].len = Some("n +".into());
    assert!(matches!(
        spec.bind(&strings(&["n=1"]), 8),
        Err(SpecError::Spec(_))
    ));
}

// --- packages --------------------------------------------------------------

#[test]
fn packages_round_trip_deterministically() {
    let package = Package::new(MATMUL.to_owned(), matmul_spec()).unwrap();
    let bytes = package.to_bytes();
    assert_eq!(bytes, package.to_bytes());
    assert!(Package::looks_like(&bytes));
    assert!(!bytes.contains(&b'\n'), "compact JSON");
    let back = Package::from_bytes(&bytes).unwrap();
    assert_eq!(back, package);
    assert_eq!(back.to_bytes(), bytes);

    // The same package written by hand, fields in another order, gives the same bytes.
    let by_hand = serde_json::json!({
        "spec": serde_json::to_value(&package.spec).unwrap(),
        "source": MATMUL,
        "format": FORMAT,
    });
    let reparsed = Package::from_bytes(by_hand.to_string().as_bytes()).unwrap();
    assert_eq!(reparsed.to_bytes(), bytes);
}

#[test]
fn packages_of_another_format_are_refused() {
    let mut value: serde_json::Value =
        serde_json::from_slice(&Package::new(SAXPY.into(), saxpy_spec()).unwrap().to_bytes())
            .unwrap();
    value["format"] = "starling-opencl/2".into();
    value["future_field"] = 1.into();
    let message = Package::from_bytes(value.to_string().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(message.contains("\"starling-opencl/2\""), "{message}");
    assert!(message.contains("\"starling-opencl/1\""), "{message}");

    value.as_object_mut().unwrap().remove("format");
    let message = Package::from_bytes(value.to_string().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(message.contains("no \"format\" field"), "{message}");
}

#[test]
fn garbage_and_unknown_fields_are_refused() {
    for bytes in [&b"\0asm\x01\0\0\0"[..], b"[1, 2]", b"{not json", b"", b"{}"] {
        assert!(
            matches!(Package::from_bytes(bytes), Err(SpecError::Package(_))),
            "{bytes:?}"
        );
    }
    let mut value: serde_json::Value =
        serde_json::from_slice(&Package::new(SAXPY.into(), saxpy_spec()).unwrap().to_bytes())
            .unwrap();
    value["spec"]["workgroup"] = 64.into();
    let message = Package::from_bytes(value.to_string().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(message.contains("unknown field `workgroup`"), "{message}");
}

#[test]
fn oversize_packages_are_refused() {
    let padding = " ".repeat(MAX_SOURCE_BYTES);
    let source = format!("{SAXPY}{padding}");
    let err = Package::new(source.clone(), saxpy_spec()).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("the limit is {MAX_SOURCE_BYTES}")),
        "{err}"
    );
    let forged = serde_json::json!({"format": FORMAT, "source": source, "spec": saxpy_spec()});
    assert!(matches!(
        Package::from_bytes(forged.to_string().as_bytes()),
        Err(SpecError::Package(_))
    ));
    let huge = vec![b' '; MAX_PACKAGE_BYTES + 1];
    let message = Package::from_bytes(&huge).unwrap_err().to_string();
    assert!(
        message.contains(&format!("the limit is {MAX_PACKAGE_BYTES}")),
        "{message}"
    );
}

#[test]
fn packages_whose_spec_does_not_fit_the_source_are_refused() {
    let err = Package::new(SAXPY.into(), matmul_spec()).unwrap_err();
    assert!(matches!(err, SpecError::Signature(_)), "{err:?}");
    let mut spec = saxpy_spec();
    spec.global = vec![];
    let err = Package::new(SAXPY.into(), spec).unwrap_err();
    assert!(matches!(err, SpecError::Spec(_)), "{err:?}");
}

// --- hostile input never panics ---------------------------------------------

proptest! {
    #[test]
    fn expression_parsing_never_panics(text in "\\PC{0,300}") {
        let _ = Expr::parse(&text);
    }

    #[test]
    fn expression_like_text_never_panics(text in "[-+*/%(),0-9a-z_ ]{0,300}", n in any::<i64>()) {
        if let Ok(expr) = Expr::parse(&text) {
            let _ = expr.eval(&|_| Some(i128::from(n)));
        }
    }

    #[test]
    fn bind_never_panics(
        args in proptest::collection::vec("[a-z=0-9.x+-]{0,24}", 0..6),
        input_len in any::<u64>(),
        len in "[-+*/%()0-9n ]{0,20}",
    ) {
        let mut spec = saxpy_spec();
        spec.args[2].len = Some(len);
        let _ = spec.bind(&args, input_len);
        let _ = matmul_spec().bind(&args, input_len);
    }

    #[test]
    fn signature_reading_never_panics(source in "[-a-z_ *(){},;/#\\n0-9]{0,200}") {
        let _ = saxpy_spec().check_source(&source);
        let _ = saxpy_spec().check_source(&format!("__kernel void saxpy({source}"));
        let _ = Package::from_bytes(source.as_bytes());
    }

    #[test]
    fn unsigned_values_bind_to_their_bytes(n in 1u32..=4096) {
        let launch = saxpy_spec().bind(&[format!("n={n}")], u64::from(n) * 8).unwrap();
        prop_assert_eq!(&launch.args[0], &BoundArg::Scalar { name: "n".into(), ty: ScalarType::Uint, bytes: n.to_le_bytes().to_vec() });
        prop_assert_eq!(launch.output_bytes, u64::from(n) * 4);
    }
}

//! Kernels and specs shared by the crate's integration tests.
#![allow(dead_code)]

use starling_opencl::{ArgKind, ArgSpec, DeviceType, KernelSpec, ScalarType};

/// y = a·x + y, one work-item per element.
pub const SAXPY: &str = r#"
__kernel void saxpy(const uint n, const float a, __global const float *x, __global float *y) {
    uint i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

/// An argument without a default.
pub fn arg(name: &str, kind: ArgKind, ty: ScalarType, len: Option<&str>) -> ArgSpec {
    ArgSpec {
        name: name.into(),
        kind,
        ty,
        len: len.map(str::to_owned),
        default: None,
    }
}

/// A spec for any device, with no local size and no build options.
pub fn spec(kernel: &str, global: &[&str], args: Vec<ArgSpec>) -> KernelSpec {
    KernelSpec {
        kernel: kernel.into(),
        device: DeviceType::Any,
        global: global.iter().map(|g| (*g).to_owned()).collect(),
        local: vec![],
        build_options: String::new(),
        args,
    }
}

/// The spec of [`SAXPY`]: n and a as scalars, x in, y in and out.
pub fn saxpy_spec() -> KernelSpec {
    spec(
        "saxpy",
        &["n"],
        vec![
            arg("n", ArgKind::Scalar, ScalarType::Uint, None),
            arg("a", ArgKind::Scalar, ScalarType::Float, None),
            arg("x", ArgKind::In, ScalarType::Float, Some("n")),
            arg("y", ArgKind::Inout, ScalarType::Float, Some("n")),
        ],
    )
}

/// The arguments of a square tiled matmul taking its 16×16 tiles as `__local`
/// arguments: n, a and b in, c out, ta and tb local.
pub fn tiled_matmul_args() -> Vec<ArgSpec> {
    vec![
        arg("n", ArgKind::Scalar, ScalarType::Uint, None),
        arg("a", ArgKind::In, ScalarType::Float, Some("n * n")),
        arg("b", ArgKind::In, ScalarType::Float, Some("n * n")),
        arg("c", ArgKind::Out, ScalarType::Float, Some("n * n")),
        arg("ta", ArgKind::Local, ScalarType::Float, Some("16 * 16")),
        arg("tb", ArgKind::Local, ScalarType::Float, Some("16 * 16")),
    ]
}

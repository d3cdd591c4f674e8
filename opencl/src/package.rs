//! The OpenCL artifact: a kernel's source and its spec in one JSON document,
//! so that the artifact digest covers both and the coordinator can validate
//! the pair on upload.

use serde::{Deserialize, Serialize};

use crate::spec::{KernelSpec, SpecError};

/// The `format` every package carries; bumped when the layout changes.
pub const FORMAT: &str = "starling-opencl/1";

/// The media type packages are uploaded and served with.
pub const MEDIA_TYPE: &str = "application/vnd.starling.opencl+json";

/// The largest kernel source accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 256 * 1024;

/// A kernel source with its spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    /// Always [`FORMAT`].
    pub format: String,
    /// The OpenCL C source.
    pub source: String,
    /// How to launch it.
    pub spec: KernelSpec,
}

impl Package {
    /// A package of `source` and `spec`, checked as [`Package::from_bytes`] checks one.
    pub fn new(source: String, spec: KernelSpec) -> Result<Package, SpecError> {
        let _ = (source, spec);
        todo!("spec helper")
    }

    /// Parses and checks a package: JSON of the right format, a source within
    /// [`MAX_SOURCE_BYTES`], a valid spec that matches the source.
    pub fn from_bytes(bytes: &[u8]) -> Result<Package, SpecError> {
        let _ = bytes;
        todo!("spec helper")
    }

    /// The package's bytes (compact JSON; the same package gives the same bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        todo!("spec helper")
    }

    /// Whether bytes look like a package rather than something else (a JSON
    /// object), to pick the right validation and error message.
    pub fn looks_like(bytes: &[u8]) -> bool {
        bytes
            .iter()
            .find(|byte| !byte.is_ascii_whitespace())
            .is_some_and(|first| *first == b'{')
    }
}

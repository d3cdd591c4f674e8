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

/// The largest package accepted, in bytes: room for a source of
/// [`MAX_SOURCE_BYTES`] even when JSON escapes much of it, and its spec.
pub const MAX_PACKAGE_BYTES: usize = 8 * MAX_SOURCE_BYTES;

/// Reads only the format, so a package of another format is refused for that
/// rather than for the fields it has.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    format: Option<serde_json::Value>,
}

impl Package {
    /// A package of `source` and `spec`, checked as [`Package::from_bytes`] checks one.
    pub fn new(source: String, spec: KernelSpec) -> Result<Package, SpecError> {
        let package = Package {
            format: FORMAT.to_owned(),
            source,
            spec,
        };
        package.check()?;
        Ok(package)
    }

    /// Parses and checks a package: JSON of the right format, a source within
    /// [`MAX_SOURCE_BYTES`], a valid spec that matches the source.
    pub fn from_bytes(bytes: &[u8]) -> Result<Package, SpecError> {
        if bytes.len() > MAX_PACKAGE_BYTES {
            return Err(SpecError::Package(format!(
                "it is {} bytes; the limit is {MAX_PACKAGE_BYTES}",
                bytes.len()
            )));
        }
        if !Package::looks_like(bytes) {
            return Err(SpecError::Package(format!(
                "it is not a JSON object; a package is {{\"format\": \"{FORMAT}\", \"source\": ..., \"spec\": ...}}"
            )));
        }
        let header: Header = serde_json::from_slice(bytes).map_err(|err| {
            SpecError::Package(format!(
                "it is not valid JSON ({err}); a package is {{\"format\": \"{FORMAT}\", \"source\": ..., \"spec\": ...}}"
            ))
        })?;
        match header.format {
            Some(serde_json::Value::String(format)) if format == FORMAT => {}
            Some(other) => {
                let shown: String = other.to_string().chars().take(64).collect();
                return Err(SpecError::Package(format!(
                    "its format is {shown}, but this agent reads {FORMAT:?}; rebuild the package with this release of starling"
                )));
            }
            None => {
                return Err(SpecError::Package(format!(
                    "it has no \"format\" field; a package says \"format\": {FORMAT:?}"
                )));
            }
        }
        let package: Package =
            serde_json::from_slice(bytes).map_err(|err| SpecError::Package(err.to_string()))?;
        package.check()?;
        Ok(package)
    }

    /// The package's bytes (compact JSON; the same package gives the same bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising these types cannot fail: every field is a string, a
        // number, an enum or a list of them, and no map has non-string keys.
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn check(&self) -> Result<(), SpecError> {
        if self.format != FORMAT {
            return Err(SpecError::Package(format!(
                "its format is {:?}, but this agent reads {FORMAT:?}",
                self.format
            )));
        }
        if self.source.len() > MAX_SOURCE_BYTES {
            return Err(SpecError::Package(format!(
                "the kernel source is {} bytes; the limit is {MAX_SOURCE_BYTES}",
                self.source.len()
            )));
        }
        self.spec.validate()?;
        self.spec.check_source(&self.source)
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

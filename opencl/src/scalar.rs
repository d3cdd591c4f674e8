//! OpenCL C scalar types, shared by the spec (argument and element types) and
//! the signature reader (parameter types read from the source). It sits below
//! both so neither has to import the other for it.

use serde::{Deserialize, Serialize};

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

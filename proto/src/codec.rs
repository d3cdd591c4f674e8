//! The one place that turns messages into bytes and back.
//!
//! Messages are CBOR maps keyed by field name, so any CBOR reader can decode
//! them. The encoder is serde_cbor, which is archived upstream
//! (RUSTSEC-2021-0127, recorded in `deny.toml`); it stays behind this module so
//! that swapping it touches nothing else. Before serde_cbor sees a byte, input
//! is checked for size and walked once for well-formed nesting no deeper than
//! [`MAX_NESTING_DEPTH`], with no allocation proportional to declared lengths.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limits::{
    MAX_INLINE_INPUT_BYTES, MAX_INLINE_OUTPUT_BYTES, MAX_MESSAGE_BYTES, MAX_NESTING_DEPTH,
};
use crate::{
    Assignment, Cancel, Capability, EventAck, SiteDigest, Status, TaskEvent, Telemetry,
    PROTOCOL_VERSION,
};

/// Why bytes could not be decoded into a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input is larger than any message may be.
    #[error("message of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Input length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The input nests arrays, maps or tags too deeply.
    #[error("message nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// The input is not well-formed CBOR.
    #[error("malformed CBOR: {0}")]
    Malformed(&'static str),
    /// The input is CBOR but not the expected message.
    #[error("not a valid {message}: {detail}")]
    Invalid {
        /// The message expected.
        message: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The message carries a protocol version this peer does not speak.
    #[error("{message} has protocol version {got}; this build speaks version {supported}")]
    UnsupportedVersion {
        /// The message.
        message: &'static str,
        /// Version found.
        got: u16,
        /// Version supported.
        supported: u16,
    },
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The encoded message would exceed the size limit.
    #[error("{message} encodes to {len} bytes, over the {max}-byte limit")]
    TooLarge {
        /// The message.
        message: &'static str,
        /// Encoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A field breaks a bound the receiver would enforce.
    #[error("{message} is invalid: {detail}")]
    Invalid {
        /// The message.
        message: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The serializer failed.
    #[error("cannot encode {message}: {detail}")]
    Serializer {
        /// The message.
        message: &'static str,
        /// The serializer's words.
        detail: String,
    },
}

/// A message of the wire protocol.
pub trait Message: Serialize + DeserializeOwned {
    /// The message's name, for errors and logs.
    const NAME: &'static str;

    /// The protocol version the message carries.
    fn version(&self) -> u16;

    /// Checks bounds the type system does not carry, returning what is wrong.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

macro_rules! message {
    ($ty:ty, $name:literal) => {
        impl Message for $ty {
            const NAME: &'static str = $name;
            fn version(&self) -> u16 {
                self.v
            }
        }
    };
}

impl Message for Capability {
    const NAME: &'static str = "capability";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        self.problems().map_or(Ok(()), Err)
    }
}

impl Message for Telemetry {
    const NAME: &'static str = "telemetry";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        self.problems().map_or(Ok(()), Err)
    }
}

message!(Status, "status");
message!(Cancel, "cancel");
message!(EventAck, "event ack");

impl Message for crate::SignedReport {
    const NAME: &'static str = "signed report";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        // The envelope is bounded by the message limit as a whole; the inner
        // message is decoded (and checked) on its own after verification.
        if self.signature.len() != 64 {
            return Err(format!(
                "signature of {} bytes where an ed25519 signature has 64",
                self.signature.len()
            ));
        }
        if self.message.is_empty() {
            return Err(String::from("the signed message is empty"));
        }
        Ok(())
    }
}

impl Message for SiteDigest {
    const NAME: &'static str = "site digest";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        self.problems().map_or(Ok(()), Err)
    }
}

impl Message for Assignment {
    const NAME: &'static str = "assignment";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        if self.input.len() > MAX_INLINE_INPUT_BYTES {
            return Err(format!(
                "input of {} bytes exceeds the {MAX_INLINE_INPUT_BYTES}-byte inline limit",
                self.input.len()
            ));
        }
        if !matches!(self.signature.len(), 0 | 64) {
            return Err(format!(
                "signature of {} bytes; an ed25519 signature has 64",
                self.signature.len()
            ));
        }
        if let Some(publisher) = &self.publisher {
            if publisher.key.len() != 32 || publisher.signature.len() != 64 {
                return Err(format!(
                    "publisher key of {} bytes and signature of {} bytes; ed25519 uses 32 and 64",
                    publisher.key.len(),
                    publisher.signature.len()
                ));
            }
        }
        Ok(())
    }
}

impl Message for TaskEvent {
    const NAME: &'static str = "task event";
    fn version(&self) -> u16 {
        self.v
    }
    fn check(&self) -> Result<(), String> {
        if self.output.len() > MAX_INLINE_OUTPUT_BYTES {
            return Err(format!(
                "output of {} bytes exceeds the {MAX_INLINE_OUTPUT_BYTES}-byte inline limit",
                self.output.len()
            ));
        }
        Ok(())
    }
}

/// Encodes a message as a CBOR map.
pub fn encode<M: Message>(message: &M) -> Result<Vec<u8>, EncodeError> {
    message.check().map_err(|detail| EncodeError::Invalid {
        message: M::NAME,
        detail,
    })?;
    let bytes = serde_cbor::to_vec(message).map_err(|e| EncodeError::Serializer {
        message: M::NAME,
        detail: format!("{e}"),
    })?;
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(EncodeError::TooLarge {
            message: M::NAME,
            len: bytes.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(bytes)
}

/// Decodes a message, refusing oversize, deep, malformed or foreign-version input.
pub fn decode<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    check_shape(bytes, MAX_NESTING_DEPTH)?;
    let message: M = serde_cbor::from_slice(bytes).map_err(|e| DecodeError::Invalid {
        message: M::NAME,
        detail: format!("{e}"),
    })?;
    if message.version() != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            message: M::NAME,
            got: message.version(),
            supported: PROTOCOL_VERSION,
        });
    }
    message.check().map_err(|detail| DecodeError::Invalid {
        message: M::NAME,
        detail,
    })?;
    Ok(message)
}

/// Decodes a message this peer stored itself (an agent's journal), written
/// by this protocol version or an older one: the same checks as [`decode`],
/// except that an older `v` is accepted when the bytes still fit the current
/// fields (fields added since are `#[serde(default)]` or the decode fails).
/// A newer version (a downgrade) is refused. The caller decides what the
/// old version number means for what it does next.
pub fn decode_stored<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    match decode::<M>(bytes) {
        Err(DecodeError::UnsupportedVersion { got, .. }) if got < PROTOCOL_VERSION => {
            let message: M = serde_cbor::from_slice(bytes).map_err(|e| DecodeError::Invalid {
                message: M::NAME,
                detail: format!("{e}"),
            })?;
            message.check().map_err(|detail| DecodeError::Invalid {
                message: M::NAME,
                detail,
            })?;
            Ok(message)
        }
        other => other,
    }
}

/// What an open container still expects.
enum Open {
    /// A definite number of items remain.
    Items(u64),
    /// Items until a break byte.
    UntilBreak,
}

/// Walks one CBOR data item without building it: checks that it is complete,
/// well-formed at the head level, nests at most `max_depth` levels, declares no
/// more items or bytes than the input holds, and is followed by nothing.
pub fn check_shape(bytes: &[u8], max_depth: usize) -> Result<(), DecodeError> {
    let mut pos = 0usize;
    // The stack holds one entry per open container; the bottom entry is the
    // top-level "one item" and does not count as nesting.
    let mut stack: Vec<Open> = Vec::with_capacity(max_depth + 1);
    stack.push(Open::Items(1));
    loop {
        while let Some(Open::Items(0)) = stack.last() {
            stack.pop();
        }
        let Some(top) = stack.last_mut() else { break };
        let initial = *bytes
            .get(pos)
            .ok_or(DecodeError::Malformed("truncated input"))?;
        pos += 1;
        if initial == 0xff {
            match top {
                Open::UntilBreak => {
                    stack.pop();
                    continue;
                }
                Open::Items(_) => return Err(DecodeError::Malformed("unexpected break")),
            }
        }
        if let Open::Items(n) = top {
            *n -= 1;
        }
        let major = initial >> 5;
        let info = initial & 0x1f;
        let argument = match info {
            0..=23 => Some(u64::from(info)),
            24..=27 => {
                let width = 1usize << (info - 24);
                let end = pos
                    .checked_add(width)
                    .filter(|&end| end <= bytes.len())
                    .ok_or(DecodeError::Malformed("truncated head"))?;
                let value = bytes[pos..end]
                    .iter()
                    .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
                pos = end;
                Some(value)
            }
            28..=30 => return Err(DecodeError::Malformed("reserved additional information")),
            _ => None,
        };
        let remaining = (bytes.len() - pos) as u64;
        let opened = match (major, argument) {
            (0 | 1, Some(_)) => None,
            (2 | 3, Some(len)) => {
                if len > remaining {
                    return Err(DecodeError::Malformed("string longer than input"));
                }
                pos += len as usize;
                None
            }
            (4, Some(count)) | (5, Some(count)) => {
                let items = if major == 5 {
                    count
                        .checked_mul(2)
                        .ok_or(DecodeError::Malformed("map too long"))?
                } else {
                    count
                };
                if items > remaining {
                    return Err(DecodeError::Malformed("container longer than input"));
                }
                Some(Open::Items(items))
            }
            (2..=5, None) => Some(Open::UntilBreak),
            (6, Some(_)) => Some(Open::Items(1)),
            (7, Some(_)) => None,
            _ => return Err(DecodeError::Malformed("indefinite length on a scalar")),
        };
        if let Some(open) = opened {
            if stack.len() > max_depth {
                return Err(DecodeError::TooDeep { max: max_depth });
            }
            stack.push(open);
        }
    }
    if pos != bytes.len() {
        return Err(DecodeError::Malformed("trailing bytes after the message"));
    }
    Ok(())
}

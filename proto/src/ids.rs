//! Identifiers with checked syntax: node ids, task ids, artifact digests, labels.

use core::fmt;
use core::str::FromStr;

use heapless::String;
use serde::{Deserialize, Deserializer, Serialize};

use crate::limits::{LABEL_KEY_LEN, LABEL_VALUE_LEN, NODE_ID_LEN, TASK_ID_LEN};

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which identifier.
        kind: &'static str,
    },
    /// The string is longer than the identifier allows.
    #[error("{kind} is longer than {max} bytes")]
    TooLong {
        /// Which identifier.
        kind: &'static str,
        /// Its maximum length.
        max: usize,
    },
    /// The string holds a character the identifier does not allow.
    #[error("{kind} may only contain {allowed}")]
    BadCharacter {
        /// Which identifier.
        kind: &'static str,
        /// What is allowed, in words.
        allowed: &'static str,
    },
}

/// Characters allowed in task ids: they appear in MQTT topic levels and URL
/// paths, so `/`, `+`, `#` and whitespace are out.
fn is_task_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

/// Whether `c` may appear in a node id: ASCII letters, digits, `-` and `_`.
///
/// Narrower than task ids because a node id is also a file-level name: it is
/// the Mosquitto user name in the `passwd` file (where `:` ends the name) and
/// the ACL, a single URL path segment (where `.` and `..` are dot segments a
/// URL parser removes, even percent-encoded) and a site's name. Tools that
/// derive a node id from a host name replace every other character.
pub fn is_node_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_')
}

fn checked<const N: usize>(
    kind: &'static str,
    s: &str,
    allowed: &'static str,
    ok: fn(char) -> bool,
) -> Result<String<N>, IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if !s.chars().all(ok) {
        return Err(IdError::BadCharacter { kind, allowed });
    }
    String::try_from(s).map_err(|_| IdError::TooLong { kind, max: N })
}

macro_rules! bounded_id {
    ($(#[$doc:meta])* $name:ident, $len:expr, $kind:literal, $allowed:literal, $ok:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String<$len>);

        impl $name {
            /// Checks and wraps an identifier.
            pub fn new(s: &str) -> Result<Self, IdError> {
                checked::<$len>($kind, s, $allowed, $ok).map(Self)
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                self.0.as_str()
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <alloc::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

bounded_id!(
    /// A node's identity: stable across restarts, unique within a site.
    NodeId,
    NODE_ID_LEN,
    "node id",
    "ASCII letters, digits, '-' and '_'",
    is_node_id_char
);
bounded_id!(
    /// A task's identity, assigned by the coordinator that accepted it.
    TaskId,
    TASK_ID_LEN,
    "task id",
    "ASCII letters, digits, '-', '_', '.' and ':'",
    is_task_id_char
);

/// The sha256 of an artifact, written as 64 lowercase hex digits. Artifacts are
/// content-addressed: an agent runs a module only if its bytes hash to this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Parses 64 hex digits (either case).
    pub fn parse(s: &str) -> Result<Self, IdError> {
        const KIND: &str = "digest";
        let s = s.strip_prefix("sha256:").unwrap_or(s);
        if s.len() != 64 {
            return Err(IdError::BadCharacter {
                kind: KIND,
                allowed: "exactly 64 hex digits (a sha256)",
            });
        }
        let mut out = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let hi = hex_value(pair[0]);
            let lo = hex_value(pair[1]);
            match (hi, lo) {
                (Some(h), Some(l)) => out[i] = (h << 4) | l,
                _ => {
                    return Err(IdError::BadCharacter {
                        kind: KIND,
                        allowed: "exactly 64 hex digits (a sha256)",
                    })
                }
            }
        }
        Ok(Self(out))
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> alloc::string::String {
        use core::fmt::Write;
        let mut s = alloc::string::String::with_capacity(64);
        for b in self.0 {
            // Writing to a String cannot fail.
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for Digest {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Hex text rather than bytes: operators read these in logs and URLs.
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <alloc::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A `key=value` label on a node, used by placement constraints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Label {
    /// The key: letters, digits, `-`, `_`, `.`, `/`.
    pub key: String<LABEL_KEY_LEN>,
    /// The value: any printable text without `,` or `=`.
    pub value: String<LABEL_VALUE_LEN>,
}

impl Label {
    /// Checks and builds a label.
    pub fn new(key: &str, value: &str) -> Result<Self, IdError> {
        let key = checked::<LABEL_KEY_LEN>(
            "label key",
            key,
            "ASCII letters, digits, '-', '_', '.' and '/'",
            |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'),
        )?;
        let value: String<LABEL_VALUE_LEN> =
            String::try_from(value).map_err(|_| IdError::TooLong {
                kind: "label value",
                max: LABEL_VALUE_LEN,
            })?;
        if value
            .chars()
            .any(|c| c.is_control() || c == ',' || c == '=')
        {
            return Err(IdError::BadCharacter {
                kind: "label value",
                allowed: "printable text without ',' or '='",
            });
        }
        Ok(Self { key, value })
    }

    /// Parses `key=value`.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let (k, v) = s.split_once('=').ok_or(IdError::BadCharacter {
            kind: "label",
            allowed: "the form key=value",
        })?;
        Self::new(k.trim(), v.trim())
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw<'a> {
            #[serde(borrow)]
            key: alloc::borrow::Cow<'a, str>,
            #[serde(borrow)]
            value: alloc::borrow::Cow<'a, str>,
        }
        let raw = Raw::deserialize(d)?;
        Self::new(&raw.key, &raw.value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_reject_topic_wildcards_and_length() {
        assert!(NodeId::new("pi-kitchen_01").is_ok());
        assert!(matches!(NodeId::new(""), Err(IdError::Empty { .. })));
        assert!(matches!(
            NodeId::new("a/b"),
            Err(IdError::BadCharacter { .. })
        ));
        assert!(matches!(
            NodeId::new("a+"),
            Err(IdError::BadCharacter { .. })
        ));
        assert!(matches!(
            NodeId::new("#"),
            Err(IdError::BadCharacter { .. })
        ));
        let long = "x".repeat(NODE_ID_LEN + 1);
        assert!(matches!(NodeId::new(&long), Err(IdError::TooLong { .. })));
    }

    #[test]
    fn node_ids_reject_dots_and_colons() {
        // `.` and `..` are URL dot segments; `:` ends a Mosquitto passwd
        // user name; `site:NAME` once named a forwarded attempt's owner.
        for bad in [
            ".",
            "..",
            ".hidden",
            "pi.local",
            "site:plant-b",
            "a:b",
            "a b",
            "é",
        ] {
            let error = NodeId::new(bad).expect_err(bad);
            assert_eq!(
                error,
                IdError::BadCharacter {
                    kind: "node id",
                    allowed: "ASCII letters, digits, '-' and '_'",
                },
                "{bad}"
            );
            assert_eq!(
                error.to_string(),
                "node id may only contain ASCII letters, digits, '-' and '_'"
            );
        }
        for good in ["a", "-", "_", "Pi-4_kitchen-01", &"x".repeat(NODE_ID_LEN)] {
            assert!(NodeId::new(good).is_ok(), "{good}");
        }
        // Decoding goes through the same check.
        assert!(node_id_from_cbor_text("..").is_err());
        // Task ids keep their wider alphabet (the coordinator makes them).
        assert!(TaskId::new("t.1:a").is_ok());
    }

    /// Deserializes a node id from a CBOR text string.
    fn node_id_from_cbor_text(text: &str) -> Result<NodeId, serde_cbor::Error> {
        let bytes = serde_cbor::to_vec(&text).unwrap();
        serde_cbor::from_slice(&bytes)
    }

    #[test]
    fn digest_round_trips_through_hex() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let d = Digest::parse(hex).unwrap();
        assert_eq!(d.to_hex(), hex);
        assert_eq!(Digest::parse(&format!("sha256:{hex}")).unwrap(), d);
        assert!(Digest::parse("abc").is_err());
        assert!(Digest::parse(&"g".repeat(64)).is_err());
    }

    #[test]
    fn labels_parse_and_reject() {
        let l = Label::parse("zone=kitchen").unwrap();
        assert_eq!(l.key.as_str(), "zone");
        assert_eq!(l.value.as_str(), "kitchen");
        assert!(Label::parse("novalue").is_err());
        assert!(Label::parse("bad key=x").is_err());
        assert!(Label::parse("k=a,b").is_err());
    }
}

//! Reading single settings: addresses, durations, certificate pairs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;

pub(super) fn parse_addr(setting: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|_| ConfigError::Address {
        setting,
        value: value.to_string(),
    })
}

/// Reads `5s`, `500ms`, `1m`, `1h` or a bare number of seconds; zero is refused.
pub fn parse_duration(setting: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let invalid = || ConfigError::Duration {
        setting,
        value: value.to_string(),
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(invalid()),
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(invalid()),
    }
}

/// A certificate and key given together, or neither.
pub(super) fn tls_pair(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    flags: (&'static str, &'static str),
) -> Result<Option<crate::server_tls::ServerTls>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(crate::server_tls::ServerTls { cert, key })),
        (None, None) => Ok(None),
        _ => Err(ConfigError::TlsPair {
            cert: flags.0,
            key: flags.1,
        }),
    }
}

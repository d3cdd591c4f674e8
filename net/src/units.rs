//! Durations (`500ms`, `10s`, `2m`, `1h`) and sizes (`64KiB`, `16MiB`) as
//! people write them in flags, environment variables, TOML files and task
//! manifests. One parser for each, so every surface reads the same text the
//! same way; callers wrap the error with the name of their setting.

use std::time::Duration;

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No number in front.
    #[error("{0:?} is not a duration like 500ms, 10s, 2m or 1h")]
    NotANumber(String),
    /// A unit other than ms, s, m (min) or h.
    #[error("{0:?} has an unknown unit; use ms, s, m or h")]
    UnknownUnit(String),
    /// Negative, infinite or beyond what a `Duration` holds.
    #[error("{0:?} is out of range")]
    OutOfRange(String),
}

/// Parses `500ms`, `1s`, `1.5s`, `2m` (or `2min`), `1h`; a bare number means
/// seconds. Zero is a valid duration here; settings that refuse it say so.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| DurationError::NotANumber(text.to_owned()))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(DurationError::UnknownUnit(text.to_owned())),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| DurationError::OutOfRange(text.to_owned()))
}

/// Why a size was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No whole number in front.
    #[error("{0:?} is not a size like 65536, 64KiB or 16MiB")]
    NotANumber(String),
    /// A unit other than B, KiB, MiB, GiB, KB, MB or GB.
    #[error("{0:?} has an unknown unit; use B, KiB, MiB or GiB")]
    UnknownUnit(String),
    /// More bytes than a `u64` counts.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses `1024`, `64KiB`, `16MiB`, `1GiB` (`K`, `M`, `G` too), and `KB`,
/// `MB`, `GB` as powers of 1000; units are case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| SizeError::NotANumber(text.to_owned()))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(SizeError::UnknownUnit(text.to_owned())),
    };
    value
        .checked_mul(factor)
        .ok_or_else(|| SizeError::TooLarge(text.to_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(
            parse_duration(" 1.5s ").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("2min").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn bad_durations_say_what_is_wrong() {
        assert!(matches!(
            parse_duration("fast"),
            Err(DurationError::NotANumber(_))
        ));
        assert!(matches!(
            parse_duration(""),
            Err(DurationError::NotANumber(_))
        ));
        assert!(matches!(
            parse_duration("1 fortnight"),
            Err(DurationError::UnknownUnit(_))
        ));
        assert!(matches!(
            parse_duration("1e400"),
            Err(DurationError::UnknownUnit(_) | DurationError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999h"),
            Err(DurationError::OutOfRange(_))
        ));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("16mib").unwrap(), 16 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert!(matches!(parse_size("lots"), Err(SizeError::NotANumber(_))));
        assert!(matches!(
            parse_size("1.5MiB"),
            Err(SizeError::UnknownUnit(_))
        ));
        assert!(matches!(parse_size("9PiB"), Err(SizeError::UnknownUnit(_))));
        assert!(matches!(
            parse_size("18446744073709551615GiB"),
            Err(SizeError::TooLarge(_))
        ));
    }
}

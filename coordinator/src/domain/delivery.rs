//! When an unacknowledged assignment is sent again: the outbox's backoff.

use core::time::Duration;

/// The longest wait between two sends of an unacknowledged assignment (unless
/// the configured first interval is longer still).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The wait after the `sends_before`-th send: `interval`, doubling with each
/// send, capped at [`MAX_BACKOFF`] (or at `interval` when that is longer).
pub fn backoff(interval: Duration, sends_before: u32) -> Duration {
    let cap = MAX_BACKOFF.max(interval);
    let factor = 2u32.saturating_pow(sends_before.min(16));
    interval.saturating_mul(factor).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let five = Duration::from_secs(5);
        let waits: Vec<u64> = (0..7).map(|n| backoff(five, n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60, 60]);
        assert_eq!(backoff(five, u32::MAX), MAX_BACKOFF);
        let long = Duration::from_secs(90);
        assert_eq!(backoff(long, 3), long);
        let short = Duration::from_millis(200);
        assert_eq!(backoff(short, 2), Duration::from_millis(800));
    }
}

//! The task model is the REST contract's (`starling_api::task`); the
//! coordinator adds the one clock it stores.

pub use starling_api::task::*;

/// Milliseconds since the Unix epoch, the one clock the coordinator stores.
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

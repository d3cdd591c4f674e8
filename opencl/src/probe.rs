//! Lists the OpenCL devices of every platform and calibrates each one.
//!
//! # The calibration reference
//!
//! [`calibrate`] times one reference kernel per device and reports its
//! single-precision throughput in GFLOP/s ([`DeviceInfo::gflops`]). Every
//! work-item of the kernel runs [`CALIBRATION_CHAINS`] independent chains of
//! dependent multiply-adds (`mad`) on `float4` values, so one iteration is
//! `CALIBRATION_CHAINS × 4 lanes × 2` = 64 floating-point operations; the
//! chains give the device instruction-level parallelism without letting the
//! compiler fold the loop away (its trip count is a run-time argument and its
//! result is stored). The figure is an arithmetic rate, not a memory bandwidth:
//! kernels bound by memory will see less.
//!
//! Placement turns GFLOP/s into a speed relative to one reference CPU core
//! (the placement crate's `REFERENCE_CORE_GFLOPS`, set from this
//! measurement): PoCL 3.1 restricted to one core (`POCL_CPU_MAX_CU_NUM=1`,
//! `POCL_MAX_PTHREAD_COUNT=1`) on one core of an Intel Xeon (Skylake-SP,
//! AVX-512, 2.3 GHz) scores 21.5 GFLOP/s on this kernel (20.6 to 22.7 over
//! five runs); both cores together score 22 to 36 on a shared machine.
//! The kernel reaches a fraction of the core's peak (PoCL vectorises across
//! work-items, and the chains are latency-bound), which is fine: the figure
//! is only ever compared with figures from the same kernel.
//!
//! A measurement is cached in `calibration.json` under the cache directory,
//! keyed by (platform, device name, driver version, kernel revision), so an
//! agent restart does not re-run it; a driver update re-measures.

use std::path::Path;
use std::time::Instant;

use opencl3::device::Device;
use serde::{Deserialize, Serialize};

// Re-exported so `probe::DeviceInfo` and `probe::CALIBRATION_CHAINS` keep
// working: the description is pure (`device`), and the chain count belongs
// with the reference kernel's source in `exec`.
pub use crate::device::DeviceInfo;
use crate::driver::{enumerate, opencl_lock};
pub use crate::exec::CALIBRATION_CHAINS;

/// Bumped whenever the reference kernel or its timing changes, so cached
/// figures measured with an older kernel are not reused.
const CALIBRATION_REVISION: u32 = 1;

/// The cache file's name under the cache directory.
const CALIBRATION_FILE: &str = "calibration.json";

/// Lists every device of every OpenCL platform. A node without an OpenCL ICD
/// loader, without platforms, or with a driver that fails while being asked
/// gets an empty list (and a log line), never a panic: a GPU-less node is
/// normal.
pub fn list_devices() -> Vec<DeviceInfo> {
    let _guard = opencl_lock();
    enumerate().into_iter().map(|(_, info)| info).collect()
}

/// One cached calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CacheEntry {
    platform: String,
    device: String,
    driver_version: String,
    revision: u32,
    gflops: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct CalibrationCache {
    entries: Vec<CacheEntry>,
}

impl CalibrationCache {
    fn load(dir: &Path) -> CalibrationCache {
        let path = dir.join(CALIBRATION_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::warn!(path = %path.display(), "ignoring an unreadable calibration cache: {error}");
                CalibrationCache::default()
            }),
            Err(_) => CalibrationCache::default(),
        }
    }

    fn get(&self, device: &DeviceInfo) -> Option<f64> {
        let (platform, name, driver) = device.cache_key();
        self.entries
            .iter()
            .find(|entry| {
                entry.revision == CALIBRATION_REVISION
                    && entry.platform == platform
                    && entry.device == name
                    && entry.driver_version == driver
            })
            .map(|entry| entry.gflops)
    }

    fn put(&mut self, device: &DeviceInfo, gflops: f64) {
        let (platform, name, driver) = device.cache_key();
        self.entries.retain(|entry| {
            !(entry.platform == platform && entry.device == name && entry.driver_version == driver)
        });
        self.entries.push(CacheEntry {
            platform: platform.to_owned(),
            device: name.to_owned(),
            driver_version: driver.to_owned(),
            revision: CALIBRATION_REVISION,
            gflops,
        });
    }

    fn store(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // Written aside and renamed so a reader never sees half a file.
        let temporary = dir.join(format!("{CALIBRATION_FILE}.{}.tmp", std::process::id()));
        std::fs::write(&temporary, bytes)?;
        std::fs::rename(&temporary, dir.join(CALIBRATION_FILE))
    }
}

/// Fills in [`DeviceInfo::gflops`] for every device in `devices` (as returned
/// by [`list_devices`]): from the calibration cache under `cache_dir` when it
/// holds a figure for the same platform, device and driver, otherwise by
/// running the reference kernel (see the module docs) and caching the result.
/// The timed launches take about 0.1 s per device; the first build of the
/// kernel adds the driver's compile time (about 0.6 s on PoCL on two busy
/// cores), which the program binary cache under `cache_dir` then spares. A device whose
/// measurement fails keeps `None` and the failure is logged.
pub fn calibrate(devices: &mut [DeviceInfo], cache_dir: Option<&Path>) {
    let mut cache = cache_dir.map(CalibrationCache::load).unwrap_or_default();
    let mut changed = false;
    let mut handles: Option<Vec<(Device, DeviceInfo)>> = None;
    let _guard = opencl_lock();
    for device in devices.iter_mut() {
        if let Some(gflops) = cache.get(device) {
            tracing::debug!(device = %device.name, gflops, "calibration from cache");
            device.gflops = Some(gflops);
            continue;
        }
        let handles = handles.get_or_insert_with(enumerate);
        let Some((handle, info)) = handles
            .iter()
            .find(|(_, info)| info.cache_key() == device.cache_key())
        else {
            tracing::warn!(device = %device.name, "device not found again for calibration");
            continue;
        };
        let started = Instant::now();
        match crate::exec::measure_gflops(handle, info, cache_dir) {
            Ok(gflops) => {
                tracing::info!(
                    device = %device.name,
                    gflops = format!("{gflops:.2}"),
                    ms = started.elapsed().as_millis() as u64,
                    "calibrated"
                );
                device.gflops = Some(gflops);
                cache.put(device, gflops);
                changed = true;
            }
            Err(error) => {
                tracing::warn!(device = %device.name, "calibration failed: {error}");
            }
        }
    }
    if let (true, Some(dir)) = (changed, cache_dir) {
        if let Err(error) = cache.store(dir) {
            tracing::warn!(dir = %dir.display(), "cannot write the calibration cache: {error}");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::device::tests::device;

    #[test]
    fn calibration_cache_round_trips_and_replaces_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = CalibrationCache::default();
        cache.put(&device("a"), 1.0);
        cache.put(&device("b"), 2.0);
        cache.put(&device("a"), 3.0);
        cache.store(dir.path()).unwrap();
        let loaded = CalibrationCache::load(dir.path());
        assert_eq!(loaded.entries.len(), 2);
        assert_eq!(loaded.get(&device("a")), Some(3.0));
        assert_eq!(loaded.get(&device("b")), Some(2.0));
        let mut newer_driver = device("a");
        newer_driver.driver_version = "7.0".into();
        assert_eq!(loaded.get(&newer_driver), None);
    }

    #[test]
    fn corrupt_calibration_cache_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CALIBRATION_FILE), b"{not json").unwrap();
        assert_eq!(
            CalibrationCache::load(dir.path()),
            CalibrationCache::default()
        );
    }
}

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

use opencl3::device::{
    Device, CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
};
use serde::{Deserialize, Serialize};
use starling_proto::task::truncate;
use starling_proto::{GpuDevice, GpuKind};

/// One OpenCL device, as the worker reports it to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The platform's name.
    pub platform: String,
    /// The device vendor.
    pub vendor: String,
    /// The device name.
    pub name: String,
    /// Device type.
    pub kind: GpuKind,
    /// `CL_DEVICE_VERSION`.
    pub version: String,
    /// `CL_DRIVER_VERSION`.
    pub driver_version: String,
    /// Compute units.
    pub compute_units: u32,
    /// Highest clock, MHz.
    pub max_clock_mhz: u32,
    /// Global memory, bytes.
    pub global_mem_bytes: u64,
    /// Local memory, bytes.
    pub local_mem_bytes: u64,
    /// Largest single allocation, bytes.
    pub max_alloc_bytes: u64,
    /// Largest work-group.
    pub max_work_group_size: u64,
    /// Double precision support.
    pub fp64: bool,
    /// Measured single-precision GFLOP/s, when calibrated.
    pub gflops: Option<f64>,
}

impl DeviceInfo {
    /// The device as the capability message carries it (strings cut to the
    /// proto's bounds).
    pub fn to_proto(&self) -> GpuDevice {
        GpuDevice {
            platform: truncate(self.platform.trim()),
            vendor: truncate(self.vendor.trim()),
            name: truncate(self.name.trim()),
            kind: self.kind,
            compute_units: self.compute_units,
            memory_bytes: self.global_mem_bytes,
            max_clock_mhz: self.max_clock_mhz,
            version: truncate(self.version.trim()),
            local_memory_bytes: self.local_mem_bytes,
            max_alloc_bytes: self.max_alloc_bytes,
            max_work_group_size: u32::try_from(self.max_work_group_size).unwrap_or(u32::MAX),
            fp64: self.fp64,
            // Placement works in f32; GFLOP/s figures lose nothing that matters.
            gflops: self.gflops.map(|gflops| gflops as f32),
        }
    }

    /// The identity a calibration and a cached binary are keyed by.
    fn cache_key(&self) -> (&str, &str, &str) {
        (&self.platform, &self.name, &self.driver_version)
    }

    /// One line for people: `name (kind, fp64)`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} ({:?}, {} compute units{})",
            self.name.trim(),
            self.kind,
            self.compute_units,
            if self.fp64 { ", fp64" } else { ", no fp64" }
        )
    }
}

/// Independent multiply-add chains per work-item in the reference kernel.
pub const CALIBRATION_CHAINS: u32 = 8;

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
    let _guard = crate::exec::opencl_lock();
    enumerate().into_iter().map(|(_, info)| info).collect()
}

/// The devices with their OpenCL handles. The caller holds
/// [`crate::exec::opencl_lock`].
pub(crate) fn enumerate() -> Vec<(Device, DeviceInfo)> {
    // A broken ICD can panic inside the bindings; a probe must never take the
    // caller down, so a panic there counts as "no devices".
    match std::panic::catch_unwind(enumerate_unguarded) {
        Ok(Ok(devices)) => {
            if devices.is_empty() {
                tracing::info!(
                    "OpenCL platforms report no devices; this node runs no OpenCL tasks"
                );
            }
            devices
        }
        Ok(Err(error)) => {
            tracing::info!(
                "no OpenCL platform ({error}); install an OpenCL driver and ICD loader to run OpenCL tasks"
            );
            Vec::new()
        }
        Err(_) => {
            tracing::warn!("the OpenCL driver panicked while listing devices; reporting none");
            Vec::new()
        }
    }
}

fn enumerate_unguarded() -> Result<Vec<(Device, DeviceInfo)>, opencl3::error_codes::ClError> {
    let mut out = Vec::new();
    for platform in opencl3::platform::get_platforms()? {
        let platform_name = platform.name().unwrap_or_default();
        let ids = match platform.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(error) => {
                tracing::info!(platform = %platform_name.trim(), "platform lists no devices: {error}");
                continue;
            }
        };
        for id in ids {
            let device = Device::new(id);
            let info = describe_device(&device, platform_name.trim());
            out.push((device, info));
        }
    }
    Ok(out)
}

fn describe_device(device: &Device, platform: &str) -> DeviceInfo {
    let device_type = device.dev_type().unwrap_or(0);
    let kind = if device_type & CL_DEVICE_TYPE_GPU != 0 {
        GpuKind::Gpu
    } else if device_type & CL_DEVICE_TYPE_CPU != 0 {
        GpuKind::Cpu
    } else if device_type & CL_DEVICE_TYPE_ACCELERATOR != 0 {
        GpuKind::Accelerator
    } else {
        GpuKind::Other
    };
    // Some drivers report an error rather than 0 for the fp64 configuration
    // of a device without doubles; either way, no doubles.
    let fp64 = device.double_fp_config().unwrap_or(0) != 0
        || device
            .extensions()
            .unwrap_or_default()
            .split_whitespace()
            .any(|extension| extension == "cl_khr_fp64");
    DeviceInfo {
        platform: platform.to_owned(),
        vendor: device.vendor().unwrap_or_default().trim().to_owned(),
        name: device.name().unwrap_or_default().trim().to_owned(),
        kind,
        version: device.version().unwrap_or_default().trim().to_owned(),
        driver_version: device
            .driver_version()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        compute_units: device.max_compute_units().unwrap_or(0),
        max_clock_mhz: device.max_clock_frequency().unwrap_or(0),
        global_mem_bytes: device.global_mem_size().unwrap_or(0),
        local_mem_bytes: device.local_mem_size().unwrap_or(0),
        max_alloc_bytes: device.max_mem_alloc_size().unwrap_or(0),
        max_work_group_size: u64::try_from(device.max_work_group_size().unwrap_or(0))
            .unwrap_or(u64::MAX),
        fp64,
        gflops: None,
    }
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
    let _guard = crate::exec::opencl_lock();
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

    fn device(name: &str) -> DeviceInfo {
        DeviceInfo {
            platform: "Portable Computing Language".into(),
            vendor: "v".repeat(200),
            name: name.into(),
            kind: GpuKind::Cpu,
            version: "OpenCL 3.0 PoCL".into(),
            driver_version: "6.0".into(),
            compute_units: 2,
            max_clock_mhz: 3000,
            global_mem_bytes: 1 << 30,
            local_mem_bytes: 1 << 20,
            max_alloc_bytes: 1 << 28,
            max_work_group_size: 1 << 40,
            fp64: true,
            gflops: Some(12.5),
        }
    }

    #[test]
    fn to_proto_truncates_and_saturates() {
        let proto = device("cpu").to_proto();
        assert_eq!(proto.vendor.len(), starling_proto::limits::NAME_LEN);
        assert_eq!(proto.max_work_group_size, u32::MAX);
        assert_eq!(proto.memory_bytes, 1 << 30);
        assert_eq!(proto.local_memory_bytes, 1 << 20);
        assert_eq!(proto.max_alloc_bytes, 1 << 28);
        assert_eq!(proto.gflops, Some(12.5));
        assert!(proto.fp64);
        assert_eq!(proto.version.as_str(), "OpenCL 3.0 PoCL");
    }

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

//! The crate's one door to the OpenCL driver: the lock that serialises OpenCL
//! use within a process, and the walk over every platform's devices. Both
//! [`crate::exec`] (to pick a device for a kernel) and [`crate::probe`] (to list
//! and calibrate devices) stand on it, so neither has to import the other for
//! it.

use std::sync::{Mutex, MutexGuard};

use opencl3::device::{
    Device, CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
};
use starling_proto::GpuKind;

use crate::device::DeviceInfo;

static OPENCL: Mutex<()> = Mutex::new(());

/// Serialises OpenCL use within one process: PoCL has crashed when two threads
/// initialise it at once. Every entry point into OpenCL in this crate holds it.
pub(crate) fn opencl_lock() -> MutexGuard<'static, ()> {
    // A panic while holding the lock leaves nothing half-written that the
    // lock protects (it guards the driver, not data), so poisoning is ignored.
    OPENCL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The devices with their OpenCL handles. The caller holds [`opencl_lock`].
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

//! The device probe: what this node is (CPU, memory, disks, network
//! interfaces, OpenCL devices, power levels), as a [`Capability`].
//!
//! Everything is read from the OS through sysinfo and `/sys`. OpenCL devices
//! come from the `starling-opencl-worker` child process ([`probe_opencl`]), so
//! a broken driver or a node without `libOpenCL` costs a log line, never the
//! agent.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heapless::Vec as BoundedVec;
use starling_opencl::probe::DeviceInfo;
use starling_opencl::worker::WorkerClient;
use starling_proto::limits::{MAX_DISKS, MAX_GPUS, MAX_INTERFACES};
use starling_proto::task::truncate;
use starling_proto::{
    Capability, CpuInfo, DiskInfo, NetInterface, PowerControl, PowerLevel, RateSource, Runtime,
    WasmEngine, PROTOCOL_VERSION,
};

use crate::config::{AgentConfig, ConfigError};
use crate::power::Cpufreq;

/// Why the device could not be probed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The configuration is invalid (node id, labels).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data directory could not be created.
    #[error("cannot create the data directory {path}: {source}; pass a writable --data-dir")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The disk measurement failed.
    #[error(
        "cannot measure disk I/O in {path}: {source}; pass --measure-io false or fix the data directory"
    )]
    MeasureIo {
        /// The file used for the measurement.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Bytes written, synced and read back by the disk probe (`--measure-io`,
/// on by default): under a second on an SD card, far less on anything faster.
pub const IO_PROBE_BYTES: usize = 8 * 1024 * 1024;

/// How this node controls power: through cpufreq when its policies under
/// the sysfs root can be written, not at all otherwise.
#[derive(Debug, Clone)]
pub struct PowerProbe {
    /// What the capability says.
    pub control: PowerControl,
    /// The policies to write, with [`PowerControl::Cpufreq`].
    pub cpufreq: Option<Cpufreq>,
    /// The speed factor of each level offered, lowest first: three from the
    /// hardware's range under control, one (full speed) without.
    pub speeds: Vec<f32>,
}

/// Finds out whether the power levels can be applied here. Without cpufreq
/// (a VM, a container) or without write access to it, the node offers one
/// level, so the coordinator plans with the speed it really gets.
pub fn probe_power(sysfs_root: &Path) -> PowerProbe {
    let none = PowerProbe {
        control: PowerControl::None,
        cpufreq: None,
        speeds: vec![1.0],
    };
    let cpufreq = match Cpufreq::open(sysfs_root) {
        Ok(Some(cpufreq)) => cpufreq,
        Ok(None) => {
            tracing::info!(sysfs = %sysfs_root.display(), "no cpufreq: power levels are not applied (power_control none)");
            return none;
        }
        Err(error) => {
            tracing::warn!("{error}: power levels are not applied (power_control none)");
            return none;
        }
    };
    if let Err(error) = cpufreq.check_writable() {
        tracing::info!("{error}: power levels are not applied (power_control none); the package's tmpfiles rule gives the agent this access");
        return none;
    }
    let low = cpufreq.min_speed().clamp(0.05, 1.0);
    let speeds = if low >= 0.99 {
        vec![1.0]
    } else {
        vec![low, (low + 1.0) / 2.0, 1.0]
    };
    PowerProbe {
        control: PowerControl::Cpufreq,
        cpufreq: Some(cpufreq),
        speeds,
    }
}

/// Probes the device.
pub fn probe(config: &AgentConfig) -> Result<Capability, ProbeError> {
    probe_with_power(config, &probe_power(&config.sysfs_root))
}

/// Probes the device, with its power control already found.
pub fn probe_with_power(
    config: &AgentConfig,
    power: &PowerProbe,
) -> Result<Capability, ProbeError> {
    config.validate()?;
    let node_id = config.resolved_node_id()?;
    std::fs::create_dir_all(&config.data_dir).map_err(|source| ProbeError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;

    let cpu = cpu_info();
    let memory_bytes = sysinfo::System::new()
        .map(|mut system| {
            system.refresh_memory();
            system.total_memory()
        })
        .unwrap_or(0);
    let data_dir_rate = if let Some((read, write)) = config.declared_io_mbps {
        Some((read, write, RateSource::Declared))
    } else if config.measure_io {
        // On by default: a disk the probe cannot write (a full or read-only
        // one) leaves the rates unknown rather than the agent down.
        match measure_io(&config.data_dir) {
            Ok((read, write)) => Some((read, write, RateSource::Measured)),
            Err(error) => {
                tracing::warn!(%error, "the disk's rates are left unknown");
                None
            }
        }
    } else {
        None
    };
    let disks = disks(&config.data_dir, data_dir_rate);

    // OpenCL devices and the `opencl` runtime are added by `add_opencl` once
    // the worker process has probed them: this function never touches OpenCL.
    let mut runtimes = BoundedVec::new();
    let _ = runtimes.push(Runtime::Wasm);
    let mut labels = BoundedVec::new();
    for label in &config.labels {
        // `validate` has checked the count against the bound.
        let _ = labels.push(label.clone());
    }
    Ok(Capability {
        v: PROTOCOL_VERSION,
        node_id,
        agent_version: truncate(env!("CARGO_PKG_VERSION")),
        arch: truncate(std::env::consts::ARCH),
        os: truncate(&os_text()),
        power_levels: power_levels(&power.speeds, cpu.cores),
        power_control: power.control,
        wasm: wasm_engine(),
        cpu,
        memory_bytes,
        gpus: BoundedVec::new(),
        disks,
        interfaces: interfaces(),
        labels,
        runtimes,
    })
}

/// How this agent runs wasm: whether it was built with a compiler, and the
/// engine and target a module must be compiled for when it was not.
pub fn wasm_engine() -> WasmEngine {
    WasmEngine {
        compiles: cfg!(feature = "cranelift"),
        engine: truncate(&starling_wasm::engine_id()),
        target: truncate(&starling_wasm::host_target()),
    }
}

fn os_text() -> String {
    sysinfo::System::long_os_version()
        .or_else(|_| sysinfo::System::name())
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

fn read_khz(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The CPU frequency range in MHz from cpufreq, when the kernel exposes it.
fn cpufreq_range_mhz() -> Option<(u32, u32)> {
    let min = read_khz("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_min_freq")?;
    let max = read_khz("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")?;
    (max > 0).then_some((min / 1000, max / 1000))
}

fn cpu_info() -> CpuInfo {
    let mut model = String::new();
    let mut cores = 0usize;
    let mut current_mhz = 0u64;
    if let Ok(mut system) = sysinfo::System::new() {
        system.refresh_cpu_all();
        let cpus = system.cpus();
        cores = cpus.len();
        if let Some(first) = cpus.first() {
            model = first.brand().trim().to_owned();
        }
        current_mhz = cpus.iter().map(|c| c.frequency()).max().unwrap_or(0);
    }
    if cores == 0 {
        cores = std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1);
    }
    if model.is_empty() {
        model = std::env::consts::ARCH.to_owned();
    }
    let (min_mhz, max_mhz) =
        cpufreq_range_mhz().unwrap_or((0, u32::try_from(current_mhz).unwrap_or(0)));
    CpuInfo {
        model: truncate(&model),
        cores: u16::try_from(cores).unwrap_or(u16::MAX),
        min_mhz,
        max_mhz,
        speed: None,
        speed_source: Default::default(),
    }
}

/// The power model used for every level, real or synthetic.
///
/// Assumption (documented because nothing on a generic Linux box measures
/// power): dynamic CPU power follows P = C·V²·f with voltage roughly
/// proportional to frequency, so it scales with the cube of the speed factor.
/// At full speed each core draws [`ACTIVE_WATTS_PER_CORE`] above idle; idle
/// power is a board base of [`IDLE_BASE_WATTS`] plus [`IDLE_WATTS_PER_CORE`]
/// per core, of which 30% scales with V² (leakage) and the rest does not.
/// The figures sit between a Raspberry Pi (≈0.5 W/core) and a laptop core
/// (≈5 W); they rank levels correctly, which is what placement needs.
pub fn power_level(level: u8, name: &str, speed_factor: f32, cores: u16) -> PowerLevel {
    let cores = f32::from(cores.max(1));
    let idle_full = IDLE_BASE_WATTS + IDLE_WATTS_PER_CORE * cores;
    let idle_watts = idle_full * (0.7 + 0.3 * speed_factor * speed_factor);
    let active_watts = idle_watts + ACTIVE_WATTS_PER_CORE * cores * speed_factor.powi(3);
    PowerLevel {
        level,
        name: truncate(name),
        speed_factor,
        idle_watts,
        active_watts,
        source: Default::default(),
    }
}

/// Board power when idle, independent of core count (W).
pub const IDLE_BASE_WATTS: f32 = 1.0;
/// Idle power per core at full speed (W).
pub const IDLE_WATTS_PER_CORE: f32 = 0.25;
/// Extra power per fully busy core at full speed (W).
pub const ACTIVE_WATTS_PER_CORE: f32 = 3.0;

/// The levels for these speed factors: `powersave`, `balanced` and
/// `performance` when there are three, `fixed` for a node that cannot change
/// its speed.
fn power_levels(
    speeds: &[f32],
    cores: u16,
) -> BoundedVec<PowerLevel, { starling_proto::limits::MAX_POWER_LEVELS }> {
    let names: &[&str] = if speeds.len() == 3 {
        &["powersave", "balanced", "performance"]
    } else {
        &["fixed"]
    };
    let mut levels = BoundedVec::new();
    for (index, (speed, name)) in speeds.iter().zip(names).enumerate() {
        let _ = levels.push(power_level(index as u8, name, *speed, cores));
    }
    levels
}

/// Writes and reads back [`IO_PROBE_BYTES`] in `dir`, returning MB/s (read, write).
/// The write is synced to the device; the read is likely served from the page
/// cache, so it is an upper bound.
pub fn measure_io(dir: &Path) -> Result<(f32, f32), ProbeError> {
    let path = dir.join(".starling-io-probe");
    let io_error = |source| ProbeError::MeasureIo {
        path: path.clone(),
        source,
    };
    let block = vec![0x5au8; 1024 * 1024];
    let started = Instant::now();
    {
        let mut file = std::fs::File::create(&path).map_err(io_error)?;
        for _ in 0..IO_PROBE_BYTES / block.len() {
            file.write_all(&block).map_err(io_error)?;
        }
        file.sync_all().map_err(io_error)?;
    }
    let write_seconds = started.elapsed().as_secs_f32().max(1e-6);
    let started = Instant::now();
    let mut buffer = vec![0u8; block.len()];
    {
        let mut file = std::fs::File::open(&path).map_err(io_error)?;
        while file.read(&mut buffer).map_err(io_error)? > 0 {}
    }
    let read_seconds = started.elapsed().as_secs_f32().max(1e-6);
    let _ = std::fs::remove_file(&path);
    let megabytes = IO_PROBE_BYTES as f32 / 1_000_000.0;
    Ok((megabytes / read_seconds, megabytes / write_seconds))
}

fn disks(
    data_dir: &Path,
    data_dir_rate: Option<(f32, f32, RateSource)>,
) -> BoundedVec<DiskInfo, MAX_DISKS> {
    let mut out = BoundedVec::new();
    let Ok(disks) = sysinfo::Disks::new_with_refreshed_list() else {
        return out;
    };
    let data_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    // The disk holding the data dir is the one with the longest matching mount point.
    let data_disk = disks
        .iter()
        .enumerate()
        .filter(|(_, d)| data_dir.starts_with(d.mount_point()))
        .max_by_key(|(_, d)| d.mount_point().as_os_str().len())
        .map(|(index, _)| index);
    for (index, disk) in disks.iter().enumerate() {
        let (read_mbps, write_mbps, rate_source) = match (Some(index) == data_disk, data_dir_rate) {
            (true, Some(rate)) => rate,
            _ => (0.0, 0.0, RateSource::Unknown),
        };
        let info = DiskInfo {
            name: truncate(&disk.name().to_string_lossy()),
            mount: truncate(&disk.mount_point().to_string_lossy()),
            total_bytes: disk.total_space(),
            available_bytes: disk.available_space(),
            read_mbps,
            write_mbps,
            rate_source,
        };
        if out.push(info).is_err() {
            break;
        }
    }
    out
}

fn interfaces() -> BoundedVec<NetInterface, MAX_INTERFACES> {
    let mut out = BoundedVec::new();
    let Ok(networks) = sysinfo::Networks::new_with_refreshed_list() else {
        return out;
    };
    let mut names: Vec<_> = networks.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    for (name, data) in names {
        let name = name.to_string_lossy();
        if name == "lo" {
            continue;
        }
        let mac = data.mac_address();
        let interface = NetInterface {
            name: truncate(&name),
            mac: (!mac.is_unspecified()).then(|| truncate(&mac.to_string())),
            speed_mbps: data
                .receive_link_speed()
                .map(|bits| u32::try_from(bits / 1_000_000).unwrap_or(u32::MAX)),
        };
        if out.push(interface).is_err() {
            break;
        }
    }
    out
}

/// How long the OpenCL worker may take to list and calibrate the devices.
/// Calibration runs once per device and driver (later starts read its cache),
/// and takes well under a second per device; a driver that hangs longer is
/// treated as no OpenCL at all.
pub const OPENCL_PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// The node's OpenCL side: the worker that runs kernels and the devices it found.
#[derive(Debug, Clone)]
pub struct OpenclNode {
    /// The worker process launcher.
    pub worker: Arc<WorkerClient>,
    /// The devices, calibrated.
    pub devices: Vec<DeviceInfo>,
}

/// Finds the OpenCL devices through the worker process, calibrating each one
/// (cached in the data directory). `None`, with a log line saying why, when
/// OpenCL is turned off, the worker is missing or fails, or there is no
/// device: the agent then serves wasm tasks only. Never fails the agent.
pub async fn probe_opencl(config: &AgentConfig) -> Option<OpenclNode> {
    if !config.opencl {
        tracing::info!("OpenCL turned off in the configuration; serving wasm tasks only");
        return None;
    }
    let Some(program) = WorkerClient::locate(config.opencl_worker.as_deref()) else {
        tracing::warn!(
            "no {} beside the agent and none configured (--opencl-worker); serving wasm tasks only",
            starling_opencl::worker::WORKER_BIN
        );
        return None;
    };
    let worker = WorkerClient::new(program.clone(), config.data_dir.join("opencl"));
    match worker.probe(true, OPENCL_PROBE_TIMEOUT).await {
        Ok(devices) if devices.is_empty() => {
            tracing::info!("no OpenCL device found; serving wasm tasks only");
            None
        }
        Ok(devices) => {
            for device in &devices {
                tracing::info!(name = %device.name, kind = ?device.kind,
                    compute_units = device.compute_units, gflops = ?device.gflops,
                    "OpenCL device");
            }
            Some(OpenclNode {
                worker: Arc::new(worker),
                devices,
            })
        }
        Err(error) => {
            tracing::warn!(worker = %program.display(), %error,
                "the OpenCL probe failed; serving wasm tasks only");
            None
        }
    }
}

/// Adds the OpenCL devices and runtime to a capability.
pub fn add_opencl(capability: &mut Capability, opencl: &OpenclNode) {
    for device in &opencl.devices {
        if capability.gpus.push(device.to_proto()).is_err() {
            tracing::warn!("more than {MAX_GPUS} OpenCL devices; reporting the first {MAX_GPUS}");
            break;
        }
    }
    // Bounded by MAX_RUNTIMES (4) with only wasm in it so far.
    let _ = capability.runtimes.push(Runtime::Opencl);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn power_control_is_cpufreq_where_it_can_be_written_and_none_elsewhere() {
        // A sysfs-shaped directory: one policy from 600 MHz to 1.5 GHz.
        let root = tempfile::tempdir().unwrap();
        let policy = root.path().join("devices/system/cpu/cpufreq/policy0");
        std::fs::create_dir_all(&policy).unwrap();
        for (file, khz) in [
            ("cpuinfo_min_freq", 600_000),
            ("cpuinfo_max_freq", 1_500_000),
            ("scaling_max_freq", 1_500_000),
        ] {
            std::fs::write(policy.join(file), format!("{khz}\n")).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let config = AgentConfig {
            node_id: Some("power-test".into()),
            data_dir: dir.path().to_owned(),
            sysfs_root: root.path().to_owned(),
            ..AgentConfig::default()
        };
        let capability = probe(&config).unwrap();
        assert_eq!(capability.power_control, PowerControl::Cpufreq);
        let speeds: Vec<f32> = capability
            .power_levels
            .iter()
            .map(|l| l.speed_factor)
            .collect();
        assert_eq!(speeds, [0.4, 0.7, 1.0]);

        // A ceiling that cannot be written (as the agent's user sees /sys
        // without the package's tmpfiles rule): the levels cannot be applied,
        // so one is offered. The stand-in is a read-only attribute of the
        // real sysfs, numeric like a frequency, which not even root writes.
        let ceiling = policy.join("scaling_max_freq");
        std::fs::remove_file(&ceiling).unwrap();
        std::os::unix::fs::symlink("/sys/devices/system/cpu/kernel_max", &ceiling).unwrap();
        let probed = probe_power(root.path());
        assert_eq!(probed.control, PowerControl::None);
        assert_eq!(probed.speeds, [1.0]);

        // No cpufreq at all (a VM): none, and one level at full speed.
        let empty = tempfile::tempdir().unwrap();
        let capability = probe(&AgentConfig {
            sysfs_root: empty.path().to_owned(),
            ..config
        })
        .unwrap();
        assert_eq!(capability.power_control, PowerControl::None);
        assert_eq!(capability.power_levels.len(), 1);
        assert_eq!(capability.power_levels[0].speed_factor, 1.0);
        assert_eq!(capability.power_levels[0].name.as_str(), "fixed");
    }

    #[test]
    fn probe_reports_this_machine_and_encodes() {
        let dir = tempfile::tempdir().unwrap();
        let config = AgentConfig {
            node_id: Some("probe-test".into()),
            data_dir: dir.path().to_owned(),
            labels: crate::config::parse_labels("zone=lab").unwrap(),
            ..AgentConfig::default()
        };
        let capability = probe(&config).unwrap();
        assert_eq!(capability.node_id.as_str(), "probe-test");
        assert!(capability.cpu.cores >= 1);
        assert!(capability.memory_bytes > 0);
        assert_eq!(capability.arch.as_str(), std::env::consts::ARCH);
        assert_eq!(capability.runtimes.as_slice(), [Runtime::Wasm]);
        assert_eq!(capability.labels[0].to_string(), "zone=lab");
        // This machine's own cpufreq decides the levels: three where it can
        // be written, one where not (this project's CI hosts are VMs).
        let expected = probe_power(Path::new("/sys"));
        assert_eq!(capability.power_control, expected.control);
        assert_eq!(capability.power_levels.len(), expected.speeds.len());
        let speeds: Vec<f32> = capability
            .power_levels
            .iter()
            .map(|l| l.speed_factor)
            .collect();
        assert!(speeds.windows(2).all(|w| w[0] < w[1]), "{speeds:?}");
        assert!(capability
            .power_levels
            .iter()
            .all(|l| l.active_watts > l.idle_watts && l.idle_watts > 0.0));
        // The data directory's disk is measured by default, the others not.
        assert!(
            capability
                .disks
                .iter()
                .filter(|d| d.rate_source == RateSource::Measured)
                .count()
                <= 1
        );
        assert!(capability
            .disks
            .iter()
            .all(|d| d.rate_source != RateSource::Declared));
        let bytes = starling_proto::encode(&capability).unwrap();
        let back: Capability = starling_proto::decode(&bytes).unwrap();
        assert_eq!(back, capability);
    }

    #[tokio::test]
    async fn opencl_is_probed_through_the_worker_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let off = AgentConfig {
            data_dir: dir.path().to_owned(),
            opencl: false,
            ..AgentConfig::default()
        };
        assert!(probe_opencl(&off).await.is_none());
        let missing = AgentConfig {
            data_dir: dir.path().to_owned(),
            opencl_worker: Some(dir.path().join("no-such-worker")),
            ..AgentConfig::default()
        };
        assert!(probe_opencl(&missing).await.is_none());

        // PoCL is installed wherever the tests run (scripts/setup installs it);
        // the worker is built with the workspace's binaries.
        let worker = starling_tests::binary(starling_opencl::worker::WORKER_BIN);
        let config = AgentConfig {
            data_dir: dir.path().to_owned(),
            opencl_worker: Some(worker),
            ..AgentConfig::default()
        };
        let node = probe_opencl(&config).await.expect("PoCL's CPU device");
        assert!(node
            .devices
            .iter()
            .any(|d| d.kind == starling_proto::GpuKind::Cpu));
        let mut capability = probe(&AgentConfig {
            node_id: Some("opencl-test".into()),
            ..config
        })
        .unwrap();
        assert!(capability.gpus.is_empty());
        add_opencl(&mut capability, &node);
        assert_eq!(
            capability.runtimes.as_slice(),
            [Runtime::Wasm, Runtime::Opencl]
        );
        let device = &capability.gpus[0];
        assert!(device.compute_units > 0 && device.memory_bytes > 0);
        assert!(device.gflops.is_some_and(|g| g > 0.0), "{device:?}");
    }

    #[test]
    fn measured_and_declared_rates_land_on_the_data_dir_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (read, write) = measure_io(dir.path()).unwrap();
        assert!(read > 0.0 && write > 0.0);
        assert!(!dir.path().join(".starling-io-probe").exists());
        let config = AgentConfig {
            node_id: Some("io-test".into()),
            data_dir: dir.path().to_owned(),
            declared_io_mbps: Some((120.0, 45.0)),
            ..AgentConfig::default()
        };
        let capability = probe(&config).unwrap();
        if !capability.disks.is_empty() {
            let declared: Vec<_> = capability
                .disks
                .iter()
                .filter(|d| d.rate_source == RateSource::Declared)
                .collect();
            assert_eq!(declared.len(), 1, "{:?}", capability.disks);
            assert_eq!(
                (declared[0].read_mbps, declared[0].write_mbps),
                (120.0, 45.0)
            );
        }
    }

    #[test]
    fn power_model_is_monotonic_in_speed() {
        let slow = power_level(0, "powersave", 0.5, 4);
        let fast = power_level(2, "performance", 1.0, 4);
        assert!(slow.active_watts < fast.active_watts);
        assert!(slow.idle_watts <= fast.idle_watts);
        assert!((fast.active_watts - fast.idle_watts - 12.0).abs() < 1e-3);
    }
}

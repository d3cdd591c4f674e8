//! Device profiles for virtual devices: the four classes of edge hardware the
//! placement simulator models (`placement/src/sim/profiles.rs`, whose comments
//! give the sources), as the [`Capability`] an agent on such a device would
//! publish, and the speeds the modelled execution runs at.
//!
//! The agent does not depend on the placement crate: only the few figures a
//! capability carries are repeated here. They are chosen so that the
//! coordinator, which derives a node's per-core speed from its architecture
//! and clock (`placement::model::core_speed`: 1/3 per GHz on x86, 0.23 on
//! Arm), sees the simulator's speeds: a Pi 4 at 1 500 MHz is 0.35, a Jetson
//! Nano at 1 430 MHz 0.33, a mini PC at 3 000 MHz 1.0, a gateway at 1 350 MHz
//! 0.45 (its real Celeron boosts higher, but that is its measured share of
//! the reference core).
//!
//! A profiles file (TOML, `--profiles FILE`) lists `[[profile]]` tables with
//! the fields of [`DeviceProfile`]; `weight` sets how many devices of each
//! there are relative to the others. A simulator scenario file
//! (`placement/scenarios/*.toml`, `[[device]]` tables) is read too: each
//! device becomes a profile weighted by its count, so a fleet described once
//! can be simulated and then run as a swarm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use starling_proto::limits::{MAX_LABELS, MAX_POWER_LEVELS};
use starling_proto::task::truncate;
use starling_proto::{
    Capability, CpuInfo, DiskInfo, GpuDevice, GpuKind, Label, NetInterface, NodeId, PowerControl,
    PowerLevel, RateSource, Runtime, PROTOCOL_VERSION,
};

/// Exponent of speed in the dynamic-power model of lower levels (the
/// simulator's `DVFS_EXPONENT`).
pub const DVFS_EXPONENT: f32 = 2.5;

/// The GFLOP/s of the reference core, the unit OpenCL speeds are measured in
/// when modelled (the placement model's `REFERENCE_CORE_GFLOPS`).
pub const REFERENCE_CORE_GFLOPS: f32 = 10.0;

const GIB: u64 = 1 << 30;

/// One kind of virtual device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Short name, used in the `profile` label.
    pub name: String,
    /// How many devices of this kind, relative to the other profiles.
    #[serde(default = "one")]
    pub weight: u32,
    /// CPU architecture as the capability says it (`aarch64`, `x86_64`).
    pub arch: String,
    /// The processor's model name.
    #[serde(default)]
    pub cpu_model: String,
    /// Logical cores.
    pub cores: u16,
    /// Highest clock, MHz: what the coordinator derives per-core speed from.
    pub max_mhz: u32,
    /// Per-core speed relative to the reference core: what modelled
    /// execution runs at.
    pub core_speed: f32,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Storage rate, MB/s.
    pub io_mbps: f32,
    /// Network link speed, Mbit/s.
    pub bandwidth_mbps: u32,
    /// Whether the link is wireless (names the interface `wlan0`, not `eth0`).
    #[serde(default)]
    pub wireless: bool,
    /// Watts idle.
    pub idle_watts: f32,
    /// Watts fully busy at the highest level.
    pub full_watts: f32,
    /// Speed factors of the power levels, lowest first, ending at 1.
    pub level_speeds: Vec<f32>,
    /// Labels every device of this profile carries.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its OpenCL device's throughput in GFLOP/s, when it has one.
    #[serde(default)]
    pub gpu_gflops: Option<f32>,
    /// Its OpenCL device's name.
    #[serde(default)]
    pub gpu_name: String,
    /// Its OpenCL device's compute units.
    #[serde(default = "one")]
    pub gpu_compute_units: u32,
    /// Whether the OpenCL device is the CPU (PoCL) rather than a GPU.
    #[serde(default)]
    pub gpu_is_cpu: bool,
}

fn one() -> u32 {
    1
}

/// Why profiles could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProfilesError {
    /// A name that is no built-in profile.
    #[error("unknown device profile {name:?}; the built-in ones are pi4, jetson, nuc and gateway (or give a TOML file of [[profile]] tables)")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A weight that is not a whole number.
    #[error("invalid weight {text:?} for profile {name:?}: write NAME=N with N a whole number")]
    Weight {
        /// The profile.
        name: String,
        /// The text.
        text: String,
    },
    /// The file could not be read.
    #[error("cannot read the profiles file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of profiles.
    #[error("invalid profiles file {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A profile whose figures cannot describe a device.
    #[error("profile {name:?}: {detail}")]
    Invalid {
        /// The profile.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// Nothing to choose from.
    #[error("no device profiles given (or all have weight 0)")]
    Empty,
}

/// Raspberry Pi 4 Model B: 4 × Cortex-A72 at 1.5 GHz, 4 GB, microSD, Wi-Fi.
pub fn raspberry_pi() -> DeviceProfile {
    DeviceProfile {
        name: "pi4".into(),
        weight: 1,
        arch: "aarch64".into(),
        cpu_model: "Cortex-A72 (Raspberry Pi 4 Model B)".into(),
        cores: 4,
        max_mhz: 1500,
        core_speed: 0.35,
        memory_mib: 4 * 1024,
        io_mbps: 40.0,
        bandwidth_mbps: 60,
        wireless: true,
        idle_watts: 2.7,
        full_watts: 6.4,
        level_speeds: vec![0.4, 0.67, 1.0],
        labels: BTreeMap::from([("class".into(), "sbc".into())]),
        gpu_gflops: None,
        gpu_name: String::new(),
        gpu_compute_units: 1,
        gpu_is_cpu: false,
    }
}

/// Jetson Nano: 4 × Cortex-A57 at 1.43 GHz, a 128-core Maxwell GPU (through
/// PoCL's CUDA back end, 150 GFLOP/s on the calibration kernel), 5 W and 10 W modes.
pub fn jetson() -> DeviceProfile {
    DeviceProfile {
        name: "jetson".into(),
        weight: 1,
        arch: "aarch64".into(),
        cpu_model: "Cortex-A57 (Jetson Nano)".into(),
        cores: 4,
        max_mhz: 1430,
        core_speed: 0.3,
        memory_mib: 4 * 1024,
        io_mbps: 80.0,
        bandwidth_mbps: 300,
        wireless: true,
        idle_watts: 1.25,
        full_watts: 10.0,
        level_speeds: vec![0.6, 1.0],
        labels: BTreeMap::from([("class".into(), "gpu".into())]),
        gpu_gflops: Some(150.0),
        gpu_name: "NVIDIA Tegra X1".into(),
        gpu_compute_units: 1,
        gpu_is_cpu: false,
    }
}

/// x86 mini PC (Intel NUC class): the reference core, 16 GB, SATA SSD, wired
/// gigabit; its CPU is an OpenCL device through PoCL.
pub fn mini_pc() -> DeviceProfile {
    DeviceProfile {
        name: "nuc".into(),
        weight: 1,
        arch: "x86_64".into(),
        cpu_model: "Intel Core i5 (mini PC)".into(),
        cores: 4,
        max_mhz: 3000,
        core_speed: 1.0,
        memory_mib: 16 * 1024,
        io_mbps: 500.0,
        bandwidth_mbps: 1000,
        wireless: false,
        idle_watts: 6.0,
        full_watts: 35.0,
        level_speeds: vec![0.5, 0.75, 1.0],
        labels: BTreeMap::from([("class".into(), "pc".into())]),
        gpu_gflops: Some(4.0 * REFERENCE_CORE_GFLOPS * 0.9),
        gpu_name: "cpu-x86-64-Intel Core i5".into(),
        gpu_compute_units: 4,
        gpu_is_cpu: true,
    }
}

/// I/O gateway (Celeron J4125 class): modest cores, 8 GB, NVMe, wired.
pub fn io_gateway() -> DeviceProfile {
    DeviceProfile {
        name: "gateway".into(),
        weight: 1,
        arch: "x86_64".into(),
        cpu_model: "Intel Celeron J4125 (I/O gateway)".into(),
        cores: 4,
        max_mhz: 1350,
        core_speed: 0.45,
        memory_mib: 8 * 1024,
        io_mbps: 1500.0,
        bandwidth_mbps: 1000,
        wireless: false,
        idle_watts: 5.0,
        full_watts: 12.0,
        level_speeds: vec![0.6, 1.0],
        labels: BTreeMap::from([
            ("class".into(), "gateway".into()),
            ("storage".into(), "fast".into()),
        ]),
        gpu_gflops: None,
        gpu_name: String::new(),
        gpu_compute_units: 1,
        gpu_is_cpu: false,
    }
}

/// The built-in profiles.
pub fn builtin() -> Vec<DeviceProfile> {
    vec![raspberry_pi(), jetson(), mini_pc(), io_gateway()]
}

/// The profiles `spec` names: a TOML file of `[[profile]]` tables when it is
/// the path of a file, otherwise built-in names separated by commas, each
/// with an optional weight (`pi4=3,nuc`).
pub fn parse(spec: &str) -> Result<Vec<DeviceProfile>, ProfilesError> {
    let path = Path::new(spec);
    let profiles = if path.is_file() {
        from_file(path)?
    } else {
        from_names(spec)?
    };
    for profile in &profiles {
        profile.check()?;
    }
    if profiles.iter().all(|profile| profile.weight == 0) {
        return Err(ProfilesError::Empty);
    }
    Ok(profiles)
}

fn from_names(spec: &str) -> Result<Vec<DeviceProfile>, ProfilesError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, weight) = match item.split_once('=') {
            Some((name, weight)) => (
                name.trim(),
                weight.trim().parse().map_err(|_| ProfilesError::Weight {
                    name: name.trim().to_owned(),
                    text: weight.to_owned(),
                })?,
            ),
            None => (item, 1),
        };
        let mut profile = builtin()
            .into_iter()
            .find(|profile| profile.name == name)
            .ok_or_else(|| ProfilesError::Unknown {
                name: name.to_owned(),
            })?;
        profile.weight = weight;
        out.push(profile);
    }
    Ok(out)
}

fn from_file(path: &Path) -> Result<Vec<DeviceProfile>, ProfilesError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        profile: Vec<DeviceProfile>,
    }
    let text = std::fs::read_to_string(path).map_err(|source| ProfilesError::Read {
        path: path.to_owned(),
        source,
    })?;
    let parse_error = |e: toml::de::Error| ProfilesError::Parse {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    if text.lines().any(|line| line.trim() == "[[device]]") {
        let scenario: scenario::File = toml::from_str(&text).map_err(parse_error)?;
        return Ok(scenario.profiles());
    }
    let file: File = toml::from_str(&text).map_err(parse_error)?;
    Ok(file.profile)
}

/// The device part of the placement simulator's scenario files, read on its
/// own: the agent does not depend on the placement crate, and the simulator
/// checks the rest of the file.
mod scenario {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::DeviceProfile;

    #[derive(Deserialize)]
    pub(super) struct File {
        #[serde(default)]
        settings: Settings,
        device: Vec<Device>,
    }

    #[derive(Default, Deserialize)]
    struct Settings {
        mips_per_reference_core: Option<f64>,
    }

    #[derive(Deserialize)]
    struct Device {
        name: String,
        #[serde(default)]
        count: u32,
        per_user: Option<f64>,
        arch: String,
        cores: f64,
        core_speed: Option<f64>,
        mips: Option<f64>,
        memory_gib: f64,
        #[serde(default = "default_io")]
        io_mbps: f32,
        bandwidth_mbps: f64,
        #[serde(default)]
        mobile: bool,
        idle_watts: f32,
        max_watts: f32,
        #[serde(default = "default_levels")]
        level_speeds: Vec<f32>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        opencl: Option<Opencl>,
    }

    #[derive(Deserialize)]
    struct Opencl {
        #[serde(default)]
        kind: String,
        gflops: f32,
        #[serde(default)]
        device_name: String,
        #[serde(default = "one")]
        compute_units: u32,
    }

    fn default_io() -> f32 {
        100.0
    }
    fn default_levels() -> Vec<f32> {
        vec![1.0]
    }
    fn one() -> u32 {
        1
    }

    impl File {
        pub(super) fn profiles(&self) -> Vec<DeviceProfile> {
            let reference = self.settings.mips_per_reference_core.unwrap_or(10_000.0);
            self.device
                .iter()
                .map(|device| {
                    let speed = device
                        .core_speed
                        .or_else(|| device.mips.map(|mips| mips / reference))
                        .unwrap_or(1.0);
                    // The clock from which the coordinator derives that very
                    // speed (1/3 per GHz on x86, 0.23 per GHz on Arm).
                    let per_ghz = if device.arch.starts_with("x86") {
                        1.0 / 3.0
                    } else {
                        0.23
                    };
                    // A device counted per user (PureEdgeSim's percentages)
                    // weighs its share of a hundred.
                    let weight = if device.count > 0 {
                        device.count
                    } else {
                        device
                            .per_user
                            .map_or(0, |share| (share * 100.0).round() as u32)
                    };
                    DeviceProfile {
                        name: device.name.clone(),
                        weight,
                        arch: device.arch.clone(),
                        cpu_model: String::new(),
                        cores: device.cores.round().clamp(1.0, f64::from(u16::MAX)) as u16,
                        max_mhz: (speed / per_ghz * 1000.0).round() as u32,
                        core_speed: speed as f32,
                        memory_mib: (device.memory_gib * 1024.0).round() as u64,
                        io_mbps: device.io_mbps,
                        bandwidth_mbps: device.bandwidth_mbps.round() as u32,
                        wireless: device.mobile,
                        // The swarm's power model wants an idle draw above
                        // zero; 1 mW stands for a cloud's "none".
                        idle_watts: device.idle_watts.max(0.001),
                        full_watts: device.max_watts.max(0.001),
                        level_speeds: device.level_speeds.clone(),
                        labels: device.labels.clone(),
                        gpu_gflops: device.opencl.as_ref().map(|gpu| gpu.gflops),
                        gpu_name: device
                            .opencl
                            .as_ref()
                            .map(|gpu| gpu.device_name.clone())
                            .unwrap_or_default(),
                        gpu_compute_units: device
                            .opencl
                            .as_ref()
                            .map_or(1, |gpu| gpu.compute_units),
                        gpu_is_cpu: device.opencl.as_ref().is_some_and(|gpu| gpu.kind == "cpu"),
                    }
                })
                .collect()
        }
    }
}

impl DeviceProfile {
    /// Checks the figures a capability and the model compute with.
    fn check(&self) -> Result<(), ProfilesError> {
        let invalid = |detail: &str| {
            Err(ProfilesError::Invalid {
                name: self.name.clone(),
                detail: detail.to_owned(),
            })
        };
        let positive = |value: f32| value.is_finite() && value > 0.0;
        if self.name.is_empty() || Label::new("profile", &self.name).is_err() {
            return invalid("the name must be a valid label value (printable, without ',' or '=')");
        }
        if self.cores == 0 || !positive(self.core_speed) {
            return invalid("cores and core_speed must be above 0");
        }
        if !(positive(self.idle_watts) && self.full_watts >= self.idle_watts) {
            return invalid("idle_watts must be above 0 and full_watts at least idle_watts");
        }
        if !self.io_mbps.is_finite() || self.io_mbps < 0.0 {
            return invalid("io_mbps must not be negative");
        }
        if self.gpu_gflops.is_some_and(|gflops| !positive(gflops)) {
            return invalid("gpu_gflops must be above 0");
        }
        let levels = &self.level_speeds;
        if levels.is_empty()
            || levels.len() > MAX_POWER_LEVELS
            || levels
                .iter()
                .any(|speed| !(positive(*speed) && *speed <= 1.0))
            || levels.windows(2).any(|pair| pair[0] >= pair[1])
            || levels.last() != Some(&1.0)
        {
            return invalid(&format!("level_speeds must be 1 to {MAX_POWER_LEVELS} increasing speeds in (0, 1], the last 1.0"));
        }
        if self.labels.len() + 1 > MAX_LABELS {
            return invalid(&format!("at most {} labels", MAX_LABELS - 1));
        }
        for (key, value) in &self.labels {
            if let Err(error) = Label::new(key, value) {
                return invalid(&format!("label {key}={value}: {error}"));
            }
        }
        Ok(())
    }

    /// Memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1 << 20)
    }

    /// The power levels, with dynamic power (above idle) scaling as
    /// speed^[`DVFS_EXPONENT`], as the simulator models them.
    pub fn power_levels(&self) -> Vec<PowerLevel> {
        let dynamic = (self.full_watts - self.idle_watts).max(0.0);
        let names: &[&str] = match self.level_speeds.len() {
            1 => &["fixed"],
            2 => &["powersave", "performance"],
            _ => &["powersave", "balanced", "performance"],
        };
        self.level_speeds
            .iter()
            .enumerate()
            .map(|(index, speed)| PowerLevel {
                level: u8::try_from(index).unwrap_or(u8::MAX),
                name: truncate(names.get(index).copied().unwrap_or("level")),
                speed_factor: *speed,
                idle_watts: self.idle_watts,
                active_watts: self.idle_watts + dynamic * speed.powf(DVFS_EXPONENT),
                source: Default::default(),
            })
            .collect()
    }

    /// The OpenCL device an agent on this device would report.
    pub fn opencl_device(&self) -> Option<GpuDevice> {
        let gflops = self.gpu_gflops?;
        let memory_bytes = self.memory_bytes() / 16 * 15;
        Some(GpuDevice {
            platform: truncate("Portable Computing Language"),
            vendor: truncate(if self.gpu_is_cpu {
                "GenuineIntel"
            } else {
                "NVIDIA Corporation"
            }),
            name: truncate(&self.gpu_name),
            kind: if self.gpu_is_cpu {
                GpuKind::Cpu
            } else {
                GpuKind::Gpu
            },
            compute_units: self.gpu_compute_units,
            memory_bytes,
            max_clock_mhz: self.max_mhz,
            version: truncate("OpenCL 3.0 PoCL"),
            local_memory_bytes: 48 << 10,
            max_alloc_bytes: memory_bytes / 4,
            max_work_group_size: 1024,
            fp64: true,
            gflops: Some(gflops),
        })
    }

    /// The speed of an OpenCL task here relative to one reference core.
    pub fn opencl_speed(&self) -> Option<f32> {
        self.gpu_gflops.map(|gflops| gflops / REFERENCE_CORE_GFLOPS)
    }

    /// The capability a device of this profile publishes as `node_id`, with
    /// `extra_labels` (the operator's, from `--labels`) after its own and
    /// `profile=<name>`.
    ///
    /// `modelled` devices offer every power level, with power control (the
    /// model runs slower at a lower level), and the `opencl` runtime when the
    /// profile has an OpenCL device. Devices that really run wasm offer what
    /// they can honour: one fixed level and wasm only, the OpenCL device
    /// listed but not offered.
    pub fn capability(
        &self,
        node_id: NodeId,
        extra_labels: &[Label],
        modelled: bool,
    ) -> Capability {
        let mut labels = heapless::Vec::new();
        let own = self
            .labels
            .iter()
            .filter_map(|(key, value)| Label::new(key, value).ok())
            .chain(Label::new("profile", &self.name).ok());
        for label in own.chain(extra_labels.iter().cloned()) {
            if labels.push(label).is_err() {
                tracing::warn!(profile = %self.name, "more labels than a capability carries; the operator's last ones are left out");
                break;
            }
        }
        let mut runtimes = heapless::Vec::new();
        let _ = runtimes.push(Runtime::Wasm);
        let mut gpus = heapless::Vec::new();
        if let Some(device) = self.opencl_device() {
            let _ = gpus.push(device);
            if modelled {
                let _ = runtimes.push(Runtime::Opencl);
            }
        }
        let all_levels = self.power_levels();
        let (power_levels, power_control) = if modelled {
            (all_levels, PowerControl::Cpufreq)
        } else {
            let top = all_levels.last().cloned().map(|level| PowerLevel {
                level: 0,
                name: truncate("fixed"),
                ..level
            });
            (top.into_iter().collect(), PowerControl::None)
        };
        let mut disks = heapless::Vec::new();
        let _ = disks.push(DiskInfo {
            name: truncate(if self.io_mbps >= 1000.0 {
                "nvme0n1"
            } else if self.io_mbps >= 200.0 {
                "sda"
            } else {
                "mmcblk0"
            }),
            mount: truncate("/"),
            total_bytes: 64 * GIB,
            available_bytes: 48 * GIB,
            read_mbps: self.io_mbps,
            write_mbps: self.io_mbps / 2.0,
            rate_source: RateSource::Declared,
        });
        let mut interfaces = heapless::Vec::new();
        let _ = interfaces.push(NetInterface {
            name: truncate(if self.wireless { "wlan0" } else { "eth0" }),
            mac: None,
            speed_mbps: Some(self.bandwidth_mbps),
        });
        Capability {
            v: PROTOCOL_VERSION,
            node_id,
            agent_version: truncate(env!("CARGO_PKG_VERSION")),
            arch: truncate(&self.arch),
            os: truncate(&format!(
                "Linux (starling-agent swarm, profile {})",
                self.name
            )),
            cpu: CpuInfo {
                model: truncate(&self.cpu_model),
                cores: self.cores,
                min_mhz: (self.max_mhz as f32 * self.level_speeds[0]) as u32,
                max_mhz: self.max_mhz,
                speed: None,
                speed_source: Default::default(),
            },
            memory_bytes: self.memory_bytes(),
            gpus,
            disks,
            interfaces,
            labels,
            runtimes,
            power_levels: power_levels.into_iter().take(MAX_POWER_LEVELS).collect(),
            power_control,
            wasm: crate::probe::wasm_engine(),
        }
    }
}

/// Which profile each device gets: weighted round-robin without a seed (the
/// proportions exact for any prefix of the fleet), a weighted draw from a
/// generator seeded with `seed` otherwise (the same seed, the same fleet).
#[derive(Debug, Clone)]
pub struct ProfileMix {
    profiles: Vec<DeviceProfile>,
    seed: Option<u64>,
}

impl ProfileMix {
    /// A mix of `profiles` (at least one with a weight above 0, as [`parse`]
    /// checks).
    pub fn new(profiles: Vec<DeviceProfile>, seed: Option<u64>) -> Self {
        Self { profiles, seed }
    }

    /// The profile of device `index` (from 0).
    pub fn pick(&self, index: usize) -> &DeviceProfile {
        let total: u64 = self.profiles.iter().map(|p| u64::from(p.weight)).sum();
        let slot = match self.seed {
            None => index as u64 % total.max(1),
            Some(seed) => {
                splitmix64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) % total.max(1)
            }
        };
        let mut left = slot;
        for profile in &self.profiles {
            let weight = u64::from(profile.weight);
            if left < weight {
                return profile;
            }
            left -= weight;
        }
        // Unreachable with a positive total; the first profile otherwise.
        &self.profiles[0]
    }
}

/// One step of SplitMix64: a well-mixed 64-bit value from `state`.
fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn node() -> NodeId {
        NodeId::new("swarm-00001").unwrap()
    }

    /// The coordinator's per-core speed rule (placement's `core_speed`).
    fn coordinator_core_speed(arch: &str, max_mhz: u32) -> f32 {
        let per_ghz = if arch.starts_with("x86") {
            1.0 / 3.0
        } else {
            0.23
        };
        per_ghz * max_mhz as f32 / 1000.0
    }

    /// The simulator's scenario files feed the swarm too: the standard fleet
    /// file gives the built-in profiles' figures, and every shipped file
    /// gives valid profiles the coordinator sees at the file's speeds.
    #[test]
    fn scenario_files_give_swarm_profiles() {
        let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("../placement/scenarios");
        let standard = parse(directory.join("standard.toml").to_str().unwrap()).unwrap();
        let names: Vec<&str> = standard.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["pi4", "jetson", "nuc", "gateway"]);
        for (from_file, built_in) in standard.iter().zip(builtin()) {
            assert_eq!(from_file.weight, 25);
            assert_eq!(from_file.cores, built_in.cores, "{}", built_in.name);
            assert_eq!(
                from_file.core_speed, built_in.core_speed,
                "{}",
                built_in.name
            );
            assert_eq!(
                from_file.level_speeds, built_in.level_speeds,
                "{}",
                built_in.name
            );
            assert_eq!(
                from_file.gpu_gflops, built_in.gpu_gflops,
                "{}",
                built_in.name
            );
            assert_eq!(
                from_file.gpu_is_cpu, built_in.gpu_is_cpu,
                "{}",
                built_in.name
            );
            assert_eq!(
                (from_file.idle_watts, from_file.full_watts),
                (built_in.idle_watts, built_in.full_watts)
            );
        }
        for name in ["unseen", "pureedgesim-default", "edgecloudsim-sample-app1"] {
            let path = directory.join(format!("{name}.toml"));
            for profile in parse(path.to_str().unwrap()).unwrap() {
                profile.check().unwrap();
                // The coordinator caps a core at 4 reference cores (a
                // PureEdgeSim laptop core is 11).
                let seen = coordinator_core_speed(&profile.arch, profile.max_mhz).min(4.0);
                assert!(
                    (seen - profile.core_speed.min(4.0)).abs() < 0.01,
                    "{name} {}: {seen} against {}",
                    profile.name,
                    profile.core_speed
                );
            }
        }
    }

    #[test]
    fn every_builtin_profile_is_valid_and_the_coordinator_sees_its_speed() {
        for profile in builtin() {
            profile.check().unwrap();
            let seen = coordinator_core_speed(&profile.arch, profile.max_mhz);
            assert!(
                (seen - profile.core_speed).abs() < 0.04,
                "{}: the coordinator would see {seen}, the model runs at {}",
                profile.name,
                profile.core_speed
            );
            let capability = profile.capability(node(), &[], true);
            assert!(capability.problems().is_none(), "{}", profile.name);
        }
    }

    #[test]
    fn a_modelled_capability_offers_its_levels_and_gpu_a_real_one_what_it_can_honour() {
        let nuc = mini_pc();
        let modelled = nuc.capability(node(), &[], true);
        assert_eq!(modelled.arch.as_str(), "x86_64");
        assert_eq!(modelled.cpu.cores, 4);
        assert_eq!(modelled.cpu.max_mhz, 3000);
        assert_eq!(modelled.memory_bytes, 16 * GIB);
        assert_eq!(modelled.power_levels.len(), 3);
        assert_eq!(modelled.power_control, PowerControl::Cpufreq);
        assert_eq!(
            modelled.runtimes.as_slice(),
            &[Runtime::Wasm, Runtime::Opencl]
        );
        assert_eq!(modelled.gpus.len(), 1);
        assert_eq!(modelled.gpus[0].gflops, Some(36.0));
        let top = &modelled.power_levels[2];
        assert_eq!((top.idle_watts, top.active_watts), (6.0, 35.0));
        // Half speed draws about 18% of the full dynamic power.
        let low = &modelled.power_levels[0];
        assert!((low.active_watts - (6.0 + 29.0 * 0.5f32.powf(2.5))).abs() < 1e-4);

        let real = nuc.capability(node(), &[], false);
        assert_eq!(real.runtimes.as_slice(), &[Runtime::Wasm]);
        assert_eq!(real.power_control, PowerControl::None);
        assert_eq!(real.power_levels.len(), 1);
        assert_eq!(real.power_levels[0].speed_factor, 1.0);
        assert_eq!(real.gpus.len(), 1, "listed, not offered");
    }

    #[test]
    fn labels_are_the_profiles_then_its_name_then_the_operators() {
        let extra = [Label::new("zone", "lab").unwrap()];
        let capability = io_gateway().capability(node(), &extra, false);
        let labels: Vec<String> = capability.labels.iter().map(ToString::to_string).collect();
        assert_eq!(
            labels,
            [
                "class=gateway",
                "storage=fast",
                "profile=gateway",
                "zone=lab"
            ]
        );
    }

    #[test]
    fn names_with_weights_parse_and_unknown_ones_are_refused() {
        let profiles = parse("pi4=3, nuc").unwrap();
        assert_eq!(profiles.len(), 2);
        assert_eq!((profiles[0].name.as_str(), profiles[0].weight), ("pi4", 3));
        assert_eq!((profiles[1].name.as_str(), profiles[1].weight), ("nuc", 1));
        assert!(matches!(
            parse("pi4,toaster"),
            Err(ProfilesError::Unknown { .. })
        ));
        assert!(matches!(parse("pi4=x"), Err(ProfilesError::Weight { .. })));
        assert!(matches!(parse("pi4=0"), Err(ProfilesError::Empty)));
    }

    #[test]
    fn a_profiles_file_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles.toml");
        std::fs::write(
            &path,
            r#"
[[profile]]
name = "pi5"
weight = 2
arch = "aarch64"
cores = 4
max_mhz = 2400
core_speed = 0.7
memory_mib = 8192
io_mbps = 400
bandwidth_mbps = 100
wireless = true
idle_watts = 3.0
full_watts = 10.0
level_speeds = [0.63, 1.0]
labels = { class = "sbc" }
"#,
        )
        .unwrap();
        let profiles = parse(path.to_str().unwrap()).unwrap();
        assert_eq!(profiles[0].name, "pi5");
        assert_eq!(profiles[0].weight, 2);
        std::fs::write(&path, "[[profile]]\nname = \"x\"\n").unwrap();
        assert!(matches!(
            parse(path.to_str().unwrap()),
            Err(ProfilesError::Parse { .. })
        ));
    }

    #[test]
    fn bad_level_speeds_are_refused() {
        let mut profile = raspberry_pi();
        profile.level_speeds = vec![1.0, 0.5];
        assert!(profile.check().is_err());
        profile.level_speeds = vec![0.5];
        assert!(profile.check().is_err());
    }

    #[test]
    fn round_robin_keeps_the_weights_and_a_seed_gives_the_same_fleet() {
        let profiles = parse("pi4=2,nuc").unwrap();
        let mix = ProfileMix::new(profiles.clone(), None);
        let names: Vec<&str> = (0..6).map(|i| mix.pick(i).name.as_str()).collect();
        assert_eq!(names, ["pi4", "pi4", "nuc", "pi4", "pi4", "nuc"]);

        let seeded = ProfileMix::new(profiles.clone(), Some(7));
        let again = ProfileMix::new(profiles, Some(7));
        let fleet: Vec<&str> = (0..300).map(|i| seeded.pick(i).name.as_str()).collect();
        let fleet_again: Vec<&str> = (0..300).map(|i| again.pick(i).name.as_str()).collect();
        assert_eq!(fleet, fleet_again);
        let pis = fleet.iter().filter(|n| **n == "pi4").count();
        assert!(
            (170..230).contains(&pis),
            "{pis} of 300 should be about 200"
        );
    }
}

//! The hardware's own numbers, read from sysfs (under the configured root,
//! so tests read sysfs-shaped trees): energy counters and power gauges for
//! the node's energy, the GPU's load, and each core's relative capacity.
//!
//! What is read, in the order one is preferred to the next (the first kind
//! found is used alone: RAPL's package zone and a board's input rail would
//! count the same joules twice):
//!
//! 1. RAPL (`class/powercap/intel-rapl:N/energy_uj`, top-level zones only:
//!    subzones such as `intel-rapl:0:0` are inside their package), which
//!    wraps at `max_energy_range_uj`. AMD's recent kernels expose their
//!    counters under the same names.
//! 2. hwmon energy counters (`class/hwmon/hwmonN/energyM_input`, µJ).
//! 3. hwmon power gauges (`powerM_input`, µW), integrated over time.
//! 4. INA3221 rails (Jetson; hwmon `name` is `ina3221`): volts
//!    (`inM_input`, mV) times amps (`currM_input`, mA); where a rail is
//!    labelled as the board's input (`VDD_IN`), that rail alone.
//! 5. Power supplies (`class/power_supply/*/power_now`, µW): a battery or a
//!    PSU that reports what it delivers.
//!
//! Each is the scope its hardware measures (RAPL: the CPU package; a board
//! rail: the whole board); the coordinator is told only that the figure is a
//! sensor's, not a model's.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// One place the kernel reports energy or power.
#[derive(Debug, Clone, PartialEq)]
pub enum PowerSensor {
    /// A cumulative energy counter in microjoules that wraps to 0 past
    /// `range_uj` (RAPL) or never (hwmon: `u64::MAX`).
    Counter {
        /// The counter's file.
        path: PathBuf,
        /// Where it wraps.
        range_uj: u64,
    },
    /// An instantaneous power reading in microwatts.
    Gauge {
        /// The reading's file.
        path: PathBuf,
    },
    /// A rail's voltage (mV) and current (mA), whose product is its power.
    Rail {
        /// The voltage's file.
        volts: PathBuf,
        /// The current's file.
        amps: PathBuf,
    },
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_text(path: &Path) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim().to_owned())
}

/// The entries of `dir` whose names start with `prefix`, sorted.
fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found
}

/// The files in a hwmon directory named `{kind}{N}_input`, with N.
fn channels(hwmon: &Path, kind: &str) -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = entries(hwmon, kind)
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            let number = name.strip_prefix(kind)?.strip_suffix("_input")?;
            Some((number.parse().ok()?, path))
        })
        .collect();
    found.sort();
    found
}

/// The power sensors of the first kind found under `root` (a sysfs root),
/// each readable now; empty where the node has none.
pub fn power_sensors(root: &Path) -> Vec<PowerSensor> {
    let readable = |sensors: Vec<PowerSensor>| -> Vec<PowerSensor> {
        sensors
            .into_iter()
            .filter(|sensor| read_power_input(sensor).is_some())
            .collect()
    };
    let rapl = readable(
        entries(&root.join("class/powercap"), "intel-rapl:")
            .into_iter()
            // Top-level zones only: `intel-rapl:0`, not `intel-rapl:0:1`.
            .filter(|zone| {
                zone.file_name()
                    .is_some_and(|name| name.to_string_lossy().matches(':').count() == 1)
            })
            .map(|zone| PowerSensor::Counter {
                range_uj: read_u64(&zone.join("max_energy_range_uj")).unwrap_or(u64::MAX),
                path: zone.join("energy_uj"),
            })
            .collect(),
    );
    if !rapl.is_empty() {
        return rapl;
    }
    let hwmons = entries(&root.join("class/hwmon"), "hwmon");
    let energy = readable(
        hwmons
            .iter()
            .flat_map(|hwmon| channels(hwmon, "energy"))
            .map(|(_, path)| PowerSensor::Counter {
                path,
                range_uj: u64::MAX,
            })
            .collect(),
    );
    if !energy.is_empty() {
        return energy;
    }
    let gauges = readable(
        hwmons
            .iter()
            .flat_map(|hwmon| channels(hwmon, "power"))
            .map(|(_, path)| PowerSensor::Gauge { path })
            .collect(),
    );
    if !gauges.is_empty() {
        return gauges;
    }
    let rails = readable(ina3221_rails(&hwmons));
    if !rails.is_empty() {
        return rails;
    }
    readable(
        entries(&root.join("class/power_supply"), "")
            .into_iter()
            .map(|supply| PowerSensor::Gauge {
                path: supply.join("power_now"),
            })
            .collect(),
    )
}

/// INA3221 rails: the board's input rail alone where one is labelled so,
/// every rail otherwise.
fn ina3221_rails(hwmons: &[PathBuf]) -> Vec<PowerSensor> {
    let mut all = Vec::new();
    for hwmon in hwmons {
        if read_text(&hwmon.join("name")).as_deref() != Some("ina3221") {
            continue;
        }
        for (number, volts) in channels(hwmon, "in") {
            let amps = hwmon.join(format!("curr{number}_input"));
            if !amps.exists() {
                continue;
            }
            let label = read_text(&hwmon.join(format!("in{number}_label"))).unwrap_or_default();
            let rail = PowerSensor::Rail { volts, amps };
            if label.eq_ignore_ascii_case("VDD_IN") || label.eq_ignore_ascii_case("VIN") {
                return vec![rail];
            }
            all.push(rail);
        }
    }
    all
}

/// What one sensor says now: microjoules so far for a counter, microwatts
/// for a gauge or a rail.
fn read_power_input(sensor: &PowerSensor) -> Option<u64> {
    match sensor {
        PowerSensor::Counter { path, .. } | PowerSensor::Gauge { path } => read_u64(path),
        PowerSensor::Rail { volts, amps } => {
            // mV × mA = µW.
            Some(read_u64(volts)?.saturating_mul(read_u64(amps)?))
        }
    }
}

/// Integrates the node's sensors into joules since it was opened.
#[derive(Debug)]
pub struct EnergyMeter {
    sensors: Vec<PowerSensor>,
    /// Each sensor's last reading (µJ or µW).
    last: Vec<u64>,
    last_at: Instant,
    joules: f64,
}

impl EnergyMeter {
    /// A meter over the node's sensors under `root`; `None` where it has
    /// none (the energy is then the power model's).
    pub fn open(root: &Path) -> Option<EnergyMeter> {
        Self::over(power_sensors(root), Instant::now())
    }

    /// A meter over `sensors`, first read at `now`.
    pub fn over(sensors: Vec<PowerSensor>, now: Instant) -> Option<EnergyMeter> {
        let last = sensors
            .iter()
            .map(read_power_input)
            .collect::<Option<Vec<u64>>>()?;
        (!sensors.is_empty()).then_some(EnergyMeter {
            sensors,
            last,
            last_at: now,
            joules: 0.0,
        })
    }

    /// The sensors it reads.
    pub fn sensors(&self) -> &[PowerSensor] {
        &self.sensors
    }

    /// Joules since the meter was opened, read at `now`; `None` when a
    /// sensor can no longer be read (the caller goes back to the model).
    pub fn read(&mut self, now: Instant) -> Option<f64> {
        let seconds = now.saturating_duration_since(self.last_at).as_secs_f64();
        let mut microjoules = 0.0;
        let mut readings = Vec::with_capacity(self.sensors.len());
        for (sensor, before) in self.sensors.iter().zip(&self.last) {
            let now_value = read_power_input(sensor)?;
            microjoules += match sensor {
                PowerSensor::Counter { range_uj, .. } => {
                    counter_delta(*before, now_value, *range_uj) as f64
                }
                // The mean of the two readings over the interval.
                PowerSensor::Gauge { .. } | PowerSensor::Rail { .. } => {
                    (*before as f64 + now_value as f64) / 2.0 * seconds
                }
            };
            readings.push(now_value);
        }
        self.last = readings;
        self.last_at = now;
        self.joules += microjoules / 1e6;
        Some(self.joules)
    }
}

/// How far a counter that wraps to 0 past `range` moved from `before` to
/// `after`: once round at most (a counter read every second wraps after
/// hours at the most).
fn counter_delta(before: u64, after: u64, range: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        range.saturating_sub(before).saturating_add(after)
    }
}

/// Where the kernel reports a GPU's load.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuLoadSensor {
    path: PathBuf,
    /// What a fully busy GPU reads (100 for DRM's percent, 1000 for
    /// Jetson's per mille).
    full_scale: f32,
}

/// The GPU load sensors under `root`: DRM's `gpu_busy_percent` (AMD, some
/// Intel and Arm drivers) and Jetson's `load` (per mille).
pub fn gpu_load_sensors(root: &Path) -> Vec<GpuLoadSensor> {
    let mut found: Vec<GpuLoadSensor> = entries(&root.join("class/drm"), "card")
        .into_iter()
        .map(|card| GpuLoadSensor {
            path: card.join("device/gpu_busy_percent"),
            full_scale: 100.0,
        })
        .collect();
    for jetson in ["devices/gpu.0/load", "devices/platform/gpu.0/load"] {
        found.push(GpuLoadSensor {
            path: root.join(jetson),
            full_scale: 1000.0,
        });
    }
    found.retain(|sensor| read_u64(&sensor.path).is_some());
    found
}

/// The busiest GPU's load, 0..=1, or `None` when no sensor reads.
pub fn gpu_load(sensors: &[GpuLoadSensor]) -> Option<f32> {
    sensors
        .iter()
        .filter_map(|sensor| {
            let value = read_u64(&sensor.path)? as f32;
            Some((value / sensor.full_scale).clamp(0.0, 1.0))
        })
        .reduce(f32::max)
}

/// Each core's capacity relative to the node's fastest (1.0), from
/// `devices/system/cpu/cpuN/cpu_capacity` (Arm's big.LITTLE and DynamIQ
/// kernels); empty where the kernel does not say (every core alike).
pub fn core_capacities(root: &Path) -> Vec<f32> {
    let cpus = entries(&root.join("devices/system/cpu"), "cpu");
    let raw: Vec<u64> = cpus
        .iter()
        .filter(|cpu| {
            cpu.file_name()
                .and_then(|name| name.to_str()?.strip_prefix("cpu")?.parse::<u32>().ok())
                .is_some()
        })
        .filter_map(|cpu| read_u64(&cpu.join("cpu_capacity")))
        .collect();
    let Some(&max) = raw.iter().max() else {
        return Vec::new();
    };
    if max == 0 {
        return Vec::new();
    }
    raw.iter().map(|&value| value as f32 / max as f32).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn write(root: &Path, path: &str, value: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("{value}\n")).unwrap();
    }

    #[test]
    fn rapl_counts_top_level_zones_and_survives_a_wrap() {
        let root = tempfile::tempdir().unwrap();
        let zone = "class/powercap/intel-rapl:0";
        write(root.path(), &format!("{zone}/energy_uj"), "999000000");
        write(
            root.path(),
            &format!("{zone}/max_energy_range_uj"),
            "1000000000",
        );
        // A subzone (the cores, inside the package) must not count twice.
        write(root.path(), "class/powercap/intel-rapl:0:0/energy_uj", "5");
        // Lower in preference: present, but RAPL wins.
        write(root.path(), "class/hwmon/hwmon0/power1_input", "7000000");
        let sensors = power_sensors(root.path());
        assert_eq!(sensors.len(), 1, "{sensors:?}");
        let start = Instant::now();
        let mut meter = EnergyMeter::over(sensors, start).unwrap();
        // 0.5 J up to the wrap, 2.5 J after it.
        write(root.path(), &format!("{zone}/energy_uj"), "2500000");
        let joules = meter.read(start + Duration::from_secs(1)).unwrap();
        assert!((joules - 3.5).abs() < 1e-9, "{joules}");
        write(root.path(), &format!("{zone}/energy_uj"), "4500000");
        let joules = meter.read(start + Duration::from_secs(2)).unwrap();
        assert!((joules - 5.5).abs() < 1e-9, "{joules}");
        // A counter that disappears (a driver unloaded) ends the meter.
        std::fs::remove_file(root.path().join(format!("{zone}/energy_uj"))).unwrap();
        assert_eq!(meter.read(start + Duration::from_secs(3)), None);
    }

    #[test]
    fn hwmon_energy_counters_come_before_power_gauges() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "class/hwmon/hwmon1/energy1_input", "1000000");
        write(root.path(), "class/hwmon/hwmon1/energy2_input", "3000000");
        write(root.path(), "class/hwmon/hwmon2/power1_input", "5000000");
        let sensors = power_sensors(root.path());
        assert_eq!(sensors.len(), 2, "{sensors:?}");
        let start = Instant::now();
        let mut meter = EnergyMeter::over(sensors, start).unwrap();
        write(root.path(), "class/hwmon/hwmon1/energy1_input", "2000000");
        write(root.path(), "class/hwmon/hwmon1/energy2_input", "5000000");
        let joules = meter.read(start + Duration::from_secs(1)).unwrap();
        assert!((joules - 3.0).abs() < 1e-9, "{joules}");
    }

    #[test]
    fn power_gauges_integrate_over_time() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "class/hwmon/hwmon0/name", "amdgpu");
        write(root.path(), "class/hwmon/hwmon0/power1_input", "4000000");
        let start = Instant::now();
        let mut meter = EnergyMeter::over(power_sensors(root.path()), start).unwrap();
        write(root.path(), "class/hwmon/hwmon0/power1_input", "6000000");
        // 4 W then 6 W over 2 s: 10 J.
        let joules = meter.read(start + Duration::from_secs(2)).unwrap();
        assert!((joules - 10.0).abs() < 1e-9, "{joules}");
    }

    #[test]
    fn ina3221_reads_the_board_input_rail_alone_where_it_is_labelled() {
        let root = tempfile::tempdir().unwrap();
        let hwmon = "class/hwmon/hwmon3";
        write(root.path(), &format!("{hwmon}/name"), "ina3221");
        for (number, label, mv, ma) in [
            (1, "VDD_IN", 5000, 1200),
            (2, "VDD_CPU_GPU_CV", 5000, 400),
            (3, "VDD_SOC", 5000, 300),
        ] {
            write(root.path(), &format!("{hwmon}/in{number}_label"), label);
            write(
                root.path(),
                &format!("{hwmon}/in{number}_input"),
                &mv.to_string(),
            );
            write(
                root.path(),
                &format!("{hwmon}/curr{number}_input"),
                &ma.to_string(),
            );
        }
        let sensors = power_sensors(root.path());
        assert_eq!(sensors.len(), 1, "{sensors:?}");
        let start = Instant::now();
        let mut meter = EnergyMeter::over(sensors, start).unwrap();
        // 5 V × 1.2 A = 6 W for 1 s.
        let joules = meter.read(start + Duration::from_secs(1)).unwrap();
        assert!((joules - 6.0).abs() < 1e-9, "{joules}");

        // Without a label naming the input, every rail counts.
        for number in 1..=3 {
            std::fs::remove_file(root.path().join(format!("{hwmon}/in{number}_label"))).unwrap();
        }
        assert_eq!(power_sensors(root.path()).len(), 3);
    }

    #[test]
    fn a_power_supply_is_the_last_resort_and_nothing_is_none() {
        let root = tempfile::tempdir().unwrap();
        assert!(power_sensors(root.path()).is_empty());
        assert!(EnergyMeter::open(root.path()).is_none());
        write(root.path(), "class/power_supply/BAT0/power_now", "8000000");
        write(root.path(), "class/power_supply/AC/online", "0");
        let sensors = power_sensors(root.path());
        assert_eq!(
            sensors,
            [PowerSensor::Gauge {
                path: root.path().join("class/power_supply/BAT0/power_now")
            }]
        );
    }

    #[test]
    fn gpu_load_reads_drm_percent_and_jetson_per_mille() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(gpu_load(&gpu_load_sensors(root.path())), None);
        write(root.path(), "class/drm/card0/device/gpu_busy_percent", "35");
        // A card without the file (another driver) is not a sensor.
        std::fs::create_dir_all(root.path().join("class/drm/card1/device")).unwrap();
        let sensors = gpu_load_sensors(root.path());
        assert_eq!(sensors.len(), 1);
        assert_eq!(gpu_load(&sensors), Some(0.35));
        write(root.path(), "devices/gpu.0/load", "800");
        let sensors = gpu_load_sensors(root.path());
        assert_eq!(gpu_load(&sensors), Some(0.8));
        // A reading past full scale is clamped, never reported as more than busy.
        write(root.path(), "devices/gpu.0/load", "1500");
        assert_eq!(gpu_load(&sensors), Some(1.0));
    }

    #[test]
    fn core_capacities_tell_big_from_little_cores() {
        let root = tempfile::tempdir().unwrap();
        assert!(core_capacities(root.path()).is_empty());
        for (cpu, capacity) in [(0, 446), (1, 446), (2, 1024), (3, 1024)] {
            write(
                root.path(),
                &format!("devices/system/cpu/cpu{cpu}/cpu_capacity"),
                &capacity.to_string(),
            );
        }
        // Not a core: the kernel's cpufreq and cpuidle directories.
        std::fs::create_dir_all(root.path().join("devices/system/cpu/cpufreq")).unwrap();
        let capacities = core_capacities(root.path());
        assert_eq!(capacities.len(), 4);
        assert!((capacities[0] - 446.0 / 1024.0).abs() < 1e-6);
        assert_eq!(capacities[3], 1.0);
    }
}

//! Periodic load reports: CPU load, free memory, disk I/O rates from
//! `/proc/diskstats` deltas, the link toward the broker, task counts, the
//! power level in force, the GPU's load where a sensor says it, and the
//! energy used: the node's energy sensors' where it has them
//! ([`crate::sensors`]), integrated from the power model over the measured
//! load otherwise, and the report says which.

use std::path::Path;
use std::time::Instant;

use starling_proto::{LinkState, NodeId, PowerLevel, Source, Telemetry, PROTOCOL_VERSION};

use crate::sensors::{gpu_load, gpu_load_sensors, EnergyMeter, GpuLoadSensor};

/// Task counts at the moment of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Executing now.
    pub running: usize,
    /// Accepted and waiting for a slot.
    pub queued: usize,
}

/// Cumulative bytes read and written by whole disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DiskTotals {
    read_bytes: u64,
    written_bytes: u64,
}

/// Builds successive [`Telemetry`] reports; keeps the state deltas need.
pub struct TelemetrySampler {
    node_id: NodeId,
    system: Option<sysinfo::System>,
    power_levels: Vec<PowerLevel>,
    started: Instant,
    last_sample: Instant,
    last_disk: Option<DiskTotals>,
    energy_joules: f64,
    /// The node's energy sensors, while they read.
    meter: Option<EnergyMeter>,
    /// The meter's reading when its joules were last added.
    meter_joules: f64,
    gpu_sensors: Vec<GpuLoadSensor>,
    seq: u64,
}

impl std::fmt::Debug for TelemetrySampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetrySampler")
            .field("node_id", &self.node_id)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl TelemetrySampler {
    /// A sampler for `node_id` using the capability's power levels.
    pub fn new(node_id: NodeId, power_levels: Vec<PowerLevel>) -> Self {
        let mut system = sysinfo::System::new().ok();
        if let Some(system) = system.as_mut() {
            // CPU usage is a delta between two refreshes; prime the first.
            system.refresh_cpu_usage();
        }
        let now = Instant::now();
        Self {
            node_id,
            system,
            power_levels,
            started: now,
            last_sample: now,
            last_disk: read_disk_totals(),
            energy_joules: 0.0,
            meter: None,
            meter_joules: 0.0,
            gpu_sensors: Vec::new(),
            seq: 0,
        }
    }

    /// Reads the node's energy and GPU load sensors under `sysfs_root`
    /// where it has them.
    pub fn with_sensors(mut self, sysfs_root: &Path) -> Self {
        self.meter = EnergyMeter::open(sysfs_root);
        if let Some(meter) = &self.meter {
            tracing::info!(sensors = ?meter.sensors(), "energy from the node's sensors");
        } else {
            tracing::info!("no readable energy sensor (RAPL, hwmon, power supply): energy is the power model's");
        }
        self.gpu_sensors = gpu_load_sensors(sysfs_root);
        self
    }

    /// Samples the node now.
    pub fn sample(&mut self, counts: TaskCounts, power_level: u8, link: LinkState) -> Telemetry {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_sample).as_secs_f64();
        self.last_sample = now;

        let (cpu_load, free_memory_bytes) = match self.system.as_mut() {
            Some(system) => {
                system.refresh_cpu_usage();
                system.refresh_memory();
                // The coordinator refuses a NaN load (clamp keeps NaN), and
                // one refused report would drop the whole telemetry message.
                let usage = system.global_cpu_usage() / 100.0;
                (
                    if usage.is_finite() {
                        usage.clamp(0.0, 1.0)
                    } else {
                        0.0
                    },
                    system.available_memory(),
                )
            }
            None => (0.0, 0),
        };

        let disk = read_disk_totals();
        let (io_read_bps, io_write_bps) = match (self.last_disk, disk) {
            (Some(before), Some(after)) if elapsed > 0.0 => (
                rate(before.read_bytes, after.read_bytes, elapsed),
                rate(before.written_bytes, after.written_bytes, elapsed),
            ),
            _ => (0, 0),
        };
        if disk.is_some() {
            self.last_disk = disk;
        }

        let metered = self.meter.as_mut().map(|meter| meter.read(now));
        let energy_source = match metered {
            Some(Some(joules)) => {
                self.energy_joules += joules - self.meter_joules;
                self.meter_joules = joules;
                Source::Sensor
            }
            unread => {
                if unread.is_some() {
                    // Read before, not now (a driver unloaded): the model
                    // from here on, never a sensor's figure that stopped.
                    tracing::warn!("the energy sensors stopped reading; energy is the power model's from now on");
                    self.meter = None;
                }
                if let Some(level) = self.level(power_level) {
                    let watts = f64::from(level.idle_watts)
                        + f64::from(level.active_watts - level.idle_watts) * f64::from(cpu_load);
                    self.energy_joules += watts * elapsed;
                }
                Source::Model
            }
        };

        self.seq += 1;
        Telemetry {
            v: PROTOCOL_VERSION,
            node_id: self.node_id.clone(),
            seq: self.seq,
            uptime_ms: u64::try_from(now.duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
            cpu_load,
            free_memory_bytes,
            io_read_bps,
            io_write_bps,
            link,
            running_tasks: u16::try_from(counts.running).unwrap_or(u16::MAX),
            queued_tasks: u16::try_from(counts.queued).unwrap_or(u16::MAX),
            power_level,
            energy_joules: self.energy_joules,
            energy_source,
            gpu_load: gpu_load(&self.gpu_sensors),
            // The session fills these in (`Session::list_attempts`).
            attempts: Default::default(),
            attempts_complete: false,
        }
    }

    fn level(&self, index: u8) -> Option<&PowerLevel> {
        self.power_levels
            .iter()
            .find(|l| l.level == index)
            .or_else(|| self.power_levels.last())
    }
}

fn rate(before: u64, after: u64, seconds: f64) -> u64 {
    (after.saturating_sub(before) as f64 / seconds) as u64
}

/// Sums sectors read and written over whole disks (those listed in
/// `/sys/block`, minus loop and RAM devices) so partitions are not counted twice.
fn read_disk_totals() -> Option<DiskTotals> {
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    Some(parse_diskstats(&text, |name| {
        !name.starts_with("loop")
            && !name.starts_with("ram")
            && !name.starts_with("zram")
            && std::path::Path::new("/sys/block").join(name).exists()
    }))
}

/// `/proc/diskstats` counts 512-byte sectors whatever the device's block size.
const SECTOR_BYTES: u64 = 512;

fn parse_diskstats(text: &str, is_whole_disk: impl Fn(&str) -> bool) -> DiskTotals {
    let mut totals = DiskTotals {
        read_bytes: 0,
        written_bytes: 0,
    };
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // major minor name reads merged sectors_read ms writes merged sectors_written ...
        if fields.len() < 10 || !is_whole_disk(fields[2]) {
            continue;
        }
        let sectors_read: u64 = fields[5].parse().unwrap_or(0);
        let sectors_written: u64 = fields[9].parse().unwrap_or(0);
        totals.read_bytes += sectors_read * SECTOR_BYTES;
        totals.written_bytes += sectors_written * SECTOR_BYTES;
    }
    totals
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::probe::power_level;

    #[test]
    fn diskstats_sums_whole_disks_only() {
        let text = "\
   8       0 sda 100 0 2000 0 50 0 4000 0 0 0 0
   8       1 sda1 100 0 2000 0 50 0 4000 0 0 0 0
   7       0 loop0 9 0 9999 0 9 0 9999 0 0 0 0
 259       0 nvme0n1 1 0 10 0 1 0 20 0 0 0 0";
        let totals = parse_diskstats(text, |name| matches!(name, "sda" | "nvme0n1"));
        assert_eq!(totals.read_bytes, 2010 * 512);
        assert_eq!(totals.written_bytes, 4020 * 512);
    }

    #[test]
    fn samples_count_up_and_integrate_energy() {
        let levels = vec![
            power_level(0, "powersave", 0.5, 2),
            power_level(1, "performance", 1.0, 2),
        ];
        let idle_floor = f64::from(levels[1].idle_watts);
        let mut sampler = TelemetrySampler::new(NodeId::new("t").unwrap(), levels);
        let link = LinkState {
            rtt_ms: Some(1.5),
            bandwidth_mbps: None,
            loss: None,
        };
        let first = sampler.sample(TaskCounts::default(), 1, link.clone());
        std::thread::sleep(std::time::Duration::from_millis(200));
        let second = sampler.sample(
            TaskCounts {
                running: 2,
                queued: 3,
            },
            1,
            link,
        );
        assert_eq!((first.seq, second.seq), (1, 2));
        assert!(second.uptime_ms >= 200);
        assert_eq!((second.running_tasks, second.queued_tasks), (2, 3));
        assert!((0.0..=1.0).contains(&second.cpu_load));
        assert!(second.free_memory_bytes > 0);
        // At least idle power for the 0.2 s between samples.
        assert!(
            second.energy_joules >= idle_floor * 0.2,
            "{}",
            second.energy_joules
        );
        assert!(second.energy_joules > first.energy_joules);
        assert_eq!(second.link.rtt_ms, Some(1.5));
        assert_eq!(second.energy_source, Source::Model);
        assert_eq!(second.gpu_load, None);
    }

    #[test]
    fn a_node_with_sensors_reports_their_energy_and_gpu_load() {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, value: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, value).unwrap();
        };
        write("class/powercap/intel-rapl:0/energy_uj", "1000000");
        write("class/drm/card0/device/gpu_busy_percent", "40");
        let levels = vec![power_level(0, "fixed", 1.0, 2)];
        let mut sampler =
            TelemetrySampler::new(NodeId::new("t").unwrap(), levels).with_sensors(root.path());
        write("class/powercap/intel-rapl:0/energy_uj", "3500000");
        let first = sampler.sample(TaskCounts::default(), 0, LinkState::default());
        assert_eq!(first.energy_source, Source::Sensor);
        assert!(
            (first.energy_joules - 2.5).abs() < 1e-9,
            "{}",
            first.energy_joules
        );
        assert_eq!(first.gpu_load, Some(0.4));
        // The counter gone: the model goes on from the sensor's total.
        std::fs::remove_file(root.path().join("class/powercap/intel-rapl:0/energy_uj")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = sampler.sample(TaskCounts::default(), 0, LinkState::default());
        assert_eq!(second.energy_source, Source::Model);
        assert!(second.energy_joules > first.energy_joules);
    }
}

//! Power levels applied: the coordinator chooses a level for each task
//! (joint placement and power control, the HiRL model); the agent sets the
//! CPU's frequency ceiling for it through the kernel's cpufreq interface
//! (`scaling_max_freq` of each policy under
//! `/sys/devices/system/cpu/cpufreq/`) and restores the ceiling it found
//! once no task runs.
//!
//! Tasks at different levels share the CPU's policies, so one ceiling is in
//! force at a time: the highest level any running task asked for. No task
//! then runs slower than the coordinator planned; a task that asked for less
//! is told which level won (its events carry it). [`Arbiter`] is that rule,
//! with no I/O; [`Cpufreq`] is the sysfs side; [`PowerLevels`] joins them
//! for the runner.
//!
//! Where there is no cpufreq, or it cannot be written (VMs, containers, an
//! unprivileged agent without the package's tmpfiles rule), the node says
//! `power_control: none` and offers one level, so placement counts no energy
//! savings that the node cannot make.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use starling_proto::PowerApplied;

/// Where cpufreq's policies are, below the sysfs root.
const POLICIES: &str = "devices/system/cpu/cpufreq";

/// Why cpufreq could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// A sysfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A sysfs file did not hold a frequency.
    #[error("{path} does not hold a frequency in kHz: {text:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// A frequency ceiling could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The rule for one ceiling shared by concurrent tasks, as a state machine:
/// the highest level among the running attempts is in force. Each attempt
/// also remembers the highest level that was in force while it ran.
#[derive(Debug, Default)]
pub struct Arbiter {
    next: u64,
    active: BTreeMap<u64, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    requested: u8,
    peak: u8,
}

/// One attempt's place in the [`Arbiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

impl Arbiter {
    /// The level in force, if any attempt runs.
    pub fn in_force(&self) -> Option<u8> {
        self.active.values().map(|e| e.requested).max()
    }

    /// An attempt asking for `level` starts; returns its ticket and the level
    /// now in force (which every running attempt records as seen).
    pub fn enter(&mut self, level: u8) -> (Ticket, u8) {
        let ticket = Ticket(self.next);
        self.next += 1;
        self.active.insert(
            ticket.0,
            Entry {
                requested: level,
                peak: level,
            },
        );
        let in_force = self.in_force().unwrap_or(level);
        for entry in self.active.values_mut() {
            entry.peak = entry.peak.max(in_force);
        }
        (ticket, in_force)
    }

    /// The attempt ends; returns the highest level in force while it ran
    /// and the level in force after it (`None`: no attempt left, restore).
    pub fn leave(&mut self, ticket: Ticket) -> (Option<u8>, Option<u8>) {
        let peak = self.active.remove(&ticket.0).map(|e| e.peak);
        (peak, self.in_force())
    }
}

/// One cpufreq policy (a group of CPUs sharing a clock).
#[derive(Debug, Clone)]
struct Policy {
    ceiling: PathBuf,
    min_khz: u32,
    max_khz: u32,
    original_khz: u32,
    available_khz: Vec<u32>,
}

impl Policy {
    /// The ceiling for a speed factor: that share of the top frequency,
    /// within the hardware's range, rounded up to a frequency the driver
    /// offers (so a task never runs slower than its level's speed).
    fn ceiling_for(&self, speed: f32) -> u32 {
        // Rounded, not ceiled: a speed factor is an f32, and 0.6 × 2 GHz
        // must be 1.2 GHz, not a kHz above it.
        let wanted = (f64::from(self.max_khz) * f64::from(speed.clamp(0.0, 1.0))).round() as u32;
        let wanted = wanted.clamp(self.min_khz, self.max_khz);
        self.available_khz
            .iter()
            .copied()
            .filter(|&f| f >= wanted)
            .min()
            .unwrap_or(wanted)
    }
}

/// The cpufreq policies of a machine, read from a sysfs root (`/sys`, or a
/// directory shaped like it in tests).
#[derive(Debug, Clone)]
pub struct Cpufreq {
    policies: Vec<Policy>,
}

fn read_khz(path: &Path) -> Result<u32, PowerError> {
    let text = std::fs::read_to_string(path).map_err(|source| PowerError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.trim().parse().map_err(|_| PowerError::Parse {
        path: path.to_owned(),
        text: text.trim().to_owned(),
    })
}

fn write_khz(path: &Path, khz: u32) -> Result<(), PowerError> {
    std::fs::write(path, format!("{khz}\n")).map_err(|source| PowerError::Write {
        path: path.to_owned(),
        source,
    })
}

impl Cpufreq {
    /// Reads every policy under `sysfs_root`; `Ok(None)` when there is no
    /// cpufreq at all (a VM, a container).
    pub fn open(sysfs_root: &Path) -> Result<Option<Self>, PowerError> {
        let dir = sysfs_root.join(POLICIES);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(None);
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("policy"))
            })
            .collect();
        dirs.sort();
        let mut policies = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let ceiling = dir.join("scaling_max_freq");
            let available_khz = std::fs::read_to_string(dir.join("scaling_available_frequencies"))
                .map(|text| {
                    text.split_whitespace()
                        .filter_map(|f| f.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            policies.push(Policy {
                min_khz: read_khz(&dir.join("cpuinfo_min_freq"))?,
                max_khz: read_khz(&dir.join("cpuinfo_max_freq"))?,
                original_khz: read_khz(&ceiling)?,
                ceiling,
                available_khz,
            });
        }
        Ok((!policies.is_empty()).then_some(Self { policies }))
    }

    /// Whether the ceilings can be written: each is written back unchanged.
    pub fn check_writable(&self) -> Result<(), PowerError> {
        for policy in &self.policies {
            write_khz(&policy.ceiling, policy.original_khz)?;
        }
        Ok(())
    }

    /// The lowest speed factor the hardware allows (its lowest frequency
    /// over its highest, on the slowest-ranging policy).
    pub fn min_speed(&self) -> f32 {
        self.policies
            .iter()
            .map(|p| p.min_khz as f32 / p.max_khz.max(1) as f32)
            .fold(0.0_f32, f32::max)
    }

    /// Sets every policy's ceiling for `speed`; returns the highest ceiling
    /// written, in kHz.
    pub fn apply(&self, speed: f32) -> Result<u32, PowerError> {
        let mut highest = 0;
        for policy in &self.policies {
            let khz = policy.ceiling_for(speed);
            write_khz(&policy.ceiling, khz)?;
            highest = highest.max(khz);
        }
        Ok(highest)
    }

    /// Puts back the ceilings found at [`Cpufreq::open`].
    pub fn restore(&self) -> Result<(), PowerError> {
        for policy in &self.policies {
            write_khz(&policy.ceiling, policy.original_khz)?;
        }
        Ok(())
    }
}

/// The agent's power control: the [`Arbiter`] and, where the node has one,
/// a writable [`Cpufreq`], with the speed factor of each level it offers.
#[derive(Debug)]
pub struct PowerLevels {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    arbiter: Arbiter,
    cpufreq: Option<Cpufreq>,
    speeds: Vec<f32>,
    /// The level whose ceiling is written now, and that ceiling.
    written: Option<(u8, u32)>,
    /// The ceiling last written for each level, for the events of attempts
    /// that end after the level they ran under.
    ceilings: BTreeMap<u8, u32>,
}

impl PowerLevels {
    /// Control through `cpufreq` (None: the node reports levels it cannot
    /// apply, and only arbitrates), for levels with these speed factors.
    pub fn new(cpufreq: Option<Cpufreq>, speeds: Vec<f32>) -> Self {
        Self {
            state: Mutex::new(State {
                arbiter: Arbiter::default(),
                cpufreq,
                speeds,
                written: None,
                ceilings: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it leaves plain data that is still valid.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An attempt at `level` starts: the level in force is set, and what
    /// was applied is returned for its events.
    pub fn enter(&self, level: u8) -> (Ticket, PowerApplied) {
        let mut state = self.lock();
        let (ticket, in_force) = state.arbiter.enter(level);
        let khz = state.set(in_force);
        (
            ticket,
            PowerApplied {
                requested: level,
                in_force,
                max_frequency_khz: khz,
            },
        )
    }

    /// The attempt ends: the ceiling follows the attempts left, or goes back
    /// to where it was. Returns the highest level in force while it ran.
    pub fn leave(&self, ticket: Ticket, requested: u8) -> PowerApplied {
        let mut state = self.lock();
        let (peak, after) = state.arbiter.leave(ticket);
        let peak = peak.unwrap_or(requested);
        let khz = state.ceilings.get(&peak).copied();
        match after {
            Some(level) => {
                state.set(level);
            }
            None => state.restore(),
        }
        PowerApplied {
            requested,
            in_force: peak,
            max_frequency_khz: khz,
        }
    }

    /// The level in force now, if a task runs.
    pub fn in_force(&self) -> Option<u8> {
        self.lock().arbiter.in_force()
    }
}

impl State {
    /// Writes the ceiling for `level` unless it is already in force;
    /// returns the ceiling in force (None without cpufreq, or if the write
    /// failed: then the task runs under whatever ceiling there was).
    fn set(&mut self, level: u8) -> Option<u32> {
        if let Some((written, khz)) = self.written {
            if written == level {
                return Some(khz);
            }
        }
        let cpufreq = self.cpufreq.as_ref()?;
        let speed = self
            .speeds
            .get(usize::from(level))
            .or(self.speeds.last())
            .copied()
            .unwrap_or(1.0);
        match cpufreq.apply(speed) {
            Ok(khz) => {
                tracing::debug!(level, khz, "power level applied");
                self.written = Some((level, khz));
                self.ceilings.insert(level, khz);
                Some(khz)
            }
            Err(error) => {
                tracing::warn!("{error}; the task runs at the current frequency");
                None
            }
        }
    }

    fn restore(&mut self) {
        if self.written.take().is_some() {
            if let Some(cpufreq) = &self.cpufreq {
                if let Err(error) = cpufreq.restore() {
                    tracing::warn!("{error}; the frequency ceiling stays lowered");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_running_level_wins_and_each_attempt_remembers_its_peak() {
        let mut arbiter = Arbiter::default();
        assert_eq!(arbiter.in_force(), None);
        let (low, in_force) = arbiter.enter(0);
        assert_eq!(in_force, 0);
        let (high, in_force) = arbiter.enter(2);
        assert_eq!(in_force, 2, "no task runs slower than planned");
        let (mid, in_force) = arbiter.enter(1);
        assert_eq!(in_force, 2);
        // The high one ends: the ceiling drops to the highest left.
        assert_eq!(arbiter.leave(high), (Some(2), Some(1)));
        // The low one ran while 2 was in force: it says so.
        assert_eq!(arbiter.leave(low), (Some(2), Some(1)));
        assert_eq!(arbiter.leave(mid), (Some(2), None));
        assert_eq!(arbiter.in_force(), None);
        // A ticket that already left is not found twice.
        assert_eq!(arbiter.leave(mid), (None, None));
    }

    /// A sysfs-shaped directory with one policy per (min, max, current).
    fn sysfs(policies: &[(u32, u32, u32, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (index, (min, max, current, available)) in policies.iter().enumerate() {
            let dir = root.path().join(POLICIES).join(format!("policy{index}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpuinfo_min_freq"), format!("{min}\n")).unwrap();
            std::fs::write(dir.join("cpuinfo_max_freq"), format!("{max}\n")).unwrap();
            std::fs::write(dir.join("scaling_max_freq"), format!("{current}\n")).unwrap();
            if !available.is_empty() {
                std::fs::write(dir.join("scaling_available_frequencies"), available).unwrap();
            }
        }
        root
    }

    fn ceiling(root: &Path, policy: usize) -> u32 {
        read_khz(
            &root
                .join(POLICIES)
                .join(format!("policy{policy}"))
                .join("scaling_max_freq"),
        )
        .unwrap()
    }

    #[test]
    fn no_cpufreq_directory_means_no_control() {
        let root = tempfile::tempdir().unwrap();
        assert!(Cpufreq::open(root.path()).unwrap().is_none());
    }

    #[test]
    fn ceilings_round_up_to_an_offered_frequency_and_are_restored() {
        // A Pi 4 (600 MHz to 1.5 GHz in steps) and a second policy without a list.
        let root = sysfs(&[
            (
                600_000,
                1_500_000,
                1_500_000,
                "600000 750000 1000000 1500000\n",
            ),
            (400_000, 2_000_000, 1_800_000, ""),
        ]);
        let cpufreq = Cpufreq::open(root.path()).unwrap().unwrap();
        cpufreq.check_writable().unwrap();
        assert!((cpufreq.min_speed() - 0.4).abs() < 1e-6);
        // 0.6 × 1.5 GHz = 900 MHz: the next offered step is 1 GHz.
        assert_eq!(cpufreq.apply(0.6).unwrap(), 1_200_000);
        assert_eq!(ceiling(root.path(), 0), 1_000_000);
        assert_eq!(ceiling(root.path(), 1), 1_200_000);
        // Below the hardware's floor: the floor.
        cpufreq.apply(0.1).unwrap();
        assert_eq!(ceiling(root.path(), 0), 600_000);
        assert_eq!(ceiling(root.path(), 1), 400_000);
        cpufreq.restore().unwrap();
        assert_eq!(ceiling(root.path(), 0), 1_500_000);
        assert_eq!(
            ceiling(root.path(), 1),
            1_800_000,
            "what was there, not the max"
        );
    }

    #[test]
    fn a_garbled_policy_file_is_an_error_naming_it() {
        let root = sysfs(&[(600_000, 1_500_000, 1_500_000, "")]);
        let file = root.path().join(POLICIES).join("policy0/cpuinfo_max_freq");
        std::fs::write(&file, "fast\n").unwrap();
        let error = Cpufreq::open(root.path()).unwrap_err();
        assert!(error.to_string().contains("cpuinfo_max_freq"), "{error}");
    }

    #[test]
    fn control_applies_the_level_in_force_and_restores_after_the_last_task() {
        let root = sysfs(&[(500_000, 2_000_000, 2_000_000, "")]);
        let cpufreq = Cpufreq::open(root.path()).unwrap();
        let control = PowerLevels::new(cpufreq, vec![0.25, 0.5, 1.0]);
        let (low, applied) = control.enter(0);
        assert_eq!(
            applied,
            PowerApplied {
                requested: 0,
                in_force: 0,
                max_frequency_khz: Some(500_000)
            }
        );
        assert_eq!(ceiling(root.path(), 0), 500_000);
        let (mid, applied) = control.enter(1);
        assert_eq!(applied.in_force, 1);
        assert_eq!(ceiling(root.path(), 0), 1_000_000);
        let ended = control.leave(low, 0);
        assert_eq!((ended.requested, ended.in_force), (0, 1), "level 1 won");
        assert_eq!(ceiling(root.path(), 0), 1_000_000, "mid still runs");
        control.leave(mid, 1);
        assert_eq!(ceiling(root.path(), 0), 2_000_000, "restored");
        assert_eq!(control.in_force(), None);
    }

    #[test]
    fn a_level_the_node_does_not_offer_gets_the_top_ceiling() {
        // The assignment's level is the coordinator's word: a wrong or hostile
        // one must neither panic nor slow the node below its top level.
        let root = sysfs(&[(500_000, 2_000_000, 2_000_000, "")]);
        let control = PowerLevels::new(Cpufreq::open(root.path()).unwrap(), vec![0.25, 1.0]);
        let (ticket, applied) = control.enter(u8::MAX);
        assert_eq!(applied.max_frequency_khz, Some(2_000_000));
        assert_eq!(ceiling(root.path(), 0), 2_000_000);
        control.leave(ticket, u8::MAX);
    }

    #[test]
    fn without_cpufreq_levels_are_arbitrated_but_nothing_is_written() {
        let control = PowerLevels::new(None, vec![1.0]);
        let (ticket, applied) = control.enter(0);
        assert_eq!(applied.max_frequency_khz, None);
        assert_eq!(control.leave(ticket, 0).max_frequency_khz, None);
    }
}

//! The CPU's speed, measured: a short loop run through the same wasm
//! engine, WASI set-up and limits as every task, timed, and turned into
//! placement's unit (a core of speed 1.0 runs a second of reference work in
//! a second). The coordinator otherwise models the speed from the
//! architecture and the clock, which cannot tell a Cortex-A76 from an A53
//! at the same clock, nor a throttled or shared core from a free one.
//!
//! The loop is integer work with a dependency chain and loads and stores in
//! a 4 KiB table (an xorshift generator counting into buckets): neither a
//! bare counter, which a wide core runs at one iteration a cycle, nor a
//! memory benchmark. The median of some twenty runs is the speed: what a
//! task gets of a core here now, a process it shares the core with
//! included (the best run would hide one; the mean would count a single
//! preemption in full). Where the kernel says cores differ (`cpu_capacity`:
//! big.LITTLE), the speed is scaled to the mean core, since the placement
//! model counts cores as equal and a busy thread runs on a fast one. It runs at the power level in force at start (the top one);
//! the lower levels' speeds are the cpufreq ratios.
//!
//! An agent without a compiler (starling-agent-small) cannot run a plain
//! module and reports no measured speed.

use std::path::Path;
use std::time::{Duration, Instant};

use starling_proto::{Capability, ExecLimits, Source};

use crate::sensors::core_capacities;
use crate::wasm::{ExecError, WasmExecutor};

/// The calibration module as text; [`CALIBRATION_WASM`] is its binary
/// form, which the agent carries so that it needs no WAT parser (a test
/// checks that the two agree). Locals: 0 the count down, 1 the table slot,
/// 2 the generator's state (numbers, not names: names would add a custom
/// section to the binary).
pub const CALIBRATION_WAT: &str = r#"
(module
  (memory 1)
  (func (export "_start")
    (local i32 i32 i64)
    (local.set 2 (i64.const 88172645463325252))
    (local.set 0 (i32.const 4000000))
    (loop
      (local.set 2 (i64.xor (local.get 2) (i64.shl (local.get 2) (i64.const 13))))
      (local.set 2 (i64.xor (local.get 2) (i64.shr_u (local.get 2) (i64.const 7))))
      (local.tee 2 (i64.xor (local.get 2) (i64.shl (local.get 2) (i64.const 17))))
      (i32.and (i32.wrap_i64) (i32.const 4092))
      (local.tee 1)
      (i32.store (i32.add (i32.load (local.get 1)) (i32.const 1)))
      (br_if 0 (local.tee 0 (i32.sub (local.get 0) (i32.const 1)))))))
"#;

/// [`CALIBRATION_WAT`], assembled.
pub const CALIBRATION_WASM: [u8; 124] = [
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02,
    0x01, 0x00, 0x05, 0x03, 0x01, 0x00, 0x01, 0x07, 0x0a, 0x01, 0x06, 0x5f, 0x73, 0x74, 0x61, 0x72,
    0x74, 0x00, 0x00, 0x0a, 0x57, 0x01, 0x55, 0x02, 0x02, 0x7f, 0x01, 0x7e, 0x42, 0xc4, 0xf4, 0xfd,
    0xdd, 0xdc, 0x91, 0xd0, 0x9c, 0x01, 0x21, 0x02, 0x41, 0x80, 0x92, 0xf4, 0x01, 0x21, 0x00, 0x03,
    0x40, 0x20, 0x02, 0x20, 0x02, 0x42, 0x0d, 0x86, 0x85, 0x21, 0x02, 0x20, 0x02, 0x20, 0x02, 0x42,
    0x07, 0x88, 0x85, 0x21, 0x02, 0x20, 0x02, 0x20, 0x02, 0x42, 0x11, 0x86, 0x85, 0x22, 0x02, 0xa7,
    0x41, 0xfc, 0x1f, 0x71, 0x22, 0x01, 0x20, 0x01, 0x28, 0x02, 0x00, 0x41, 0x01, 0x6a, 0x36, 0x02,
    0x00, 0x20, 0x00, 0x41, 0x01, 0x6b, 0x22, 0x00, 0x0d, 0x00, 0x0b, 0x0b,
];

/// How long one run of the calibration module takes on a core of speed
/// 1.0, in seconds. Anchored where the model and the measurement meet: on
/// this project's reference machine (a 2.6 GHz AMD EPYC core, which the
/// model puts at 0.865) the median of 20 runs took 7.2 ms
/// (`cargo test --workspace -- calibrate --nocapture` prints it).
pub const REFERENCE_RUN_S: f64 = 0.00623;

/// How long a calibration may run: well under the 2 s a start on a Pi 4
/// class device may spend measuring (a run there takes some 40 ms).
pub const BUDGET: Duration = Duration::from_millis(150);

/// Fewer runs than this say little, whatever the budget.
const MIN_RUNS: usize = 3;

/// What a calibration found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// One (mean) core's speed, relative to the reference core.
    pub speed: f32,
    /// The median run's time.
    pub median_run: Duration,
    /// How many runs it took.
    pub runs: u32,
    /// The whole calibration, compile included.
    pub took: Duration,
}

/// Measures one core's speed through `executor` for about `budget`, scaled
/// by the core capacities (`sensors::core_capacities`; empty: all alike).
pub fn calibrate(
    executor: &WasmExecutor,
    capacities: &[f32],
    budget: Duration,
) -> Result<Calibration, ExecError> {
    let started = Instant::now();
    let module = executor.compile(&CALIBRATION_WASM)?;
    let limits = ExecLimits {
        wall_ms: 10_000,
        ..ExecLimits::default()
    };
    let mut times = Vec::new();
    while times.len() < MIN_RUNS || started.elapsed() < budget {
        let run_started = Instant::now();
        executor.run(&module, b"", &[], &limits)?;
        times.push(run_started.elapsed());
    }
    times.sort_unstable();
    // At least MIN_RUNS (3) times: the loop above runs until there are.
    let median = times[times.len() / 2];
    let mean_capacity = if capacities.is_empty() {
        1.0
    } else {
        capacities.iter().sum::<f32>() / capacities.len() as f32
    };
    let speed = REFERENCE_RUN_S / median.as_secs_f64().max(1e-9) * f64::from(mean_capacity);
    Ok(Calibration {
        speed: (speed as f32).clamp(0.01, 64.0),
        median_run: median,
        runs: u32::try_from(times.len()).unwrap_or(u32::MAX),
        took: started.elapsed(),
    })
}

/// Writes the CPU's speed into `capability`: the operator's figure where
/// one is declared (source `operator`), else a calibration's (`measured`);
/// leaves it to the model, with a log line saying why, where it cannot.
pub fn measure_cpu(
    capability: &mut Capability,
    executor: &WasmExecutor,
    sysfs_root: &Path,
    declared: Option<f32>,
) {
    if let Some(speed) = declared {
        capability.cpu.speed = Some(speed);
        capability.cpu.speed_source = Source::Operator;
        return;
    }
    if !executor.compiles() {
        tracing::info!(
            "no wasm compiler in this agent: the CPU's speed is left to the coordinator's model"
        );
        return;
    }
    match calibrate(executor, &core_capacities(sysfs_root), BUDGET) {
        Ok(calibration) => {
            tracing::info!(speed = calibration.speed, median_run = ?calibration.median_run,
                runs = calibration.runs, took = ?calibration.took, "measured the CPU's speed");
            capability.cpu.speed = Some(calibration.speed);
            capability.cpu.speed_source = Source::Measured;
        }
        Err(error) => {
            tracing::warn!(%error, "the CPU calibration failed; the speed is left to the coordinator's model");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_module_is_the_text_assembled() {
        assert_eq!(wat::parse_str(CALIBRATION_WAT).unwrap(), CALIBRATION_WASM);
    }

    #[test]
    fn calibrate_measures_a_speed_and_scales_it_to_the_mean_core() {
        let executor = WasmExecutor::new().unwrap();
        let alike = calibrate(&executor, &[], BUDGET).unwrap();
        eprintln!(
            "calibration: median run {:.6} s of {} runs, speed {:.3}, took {:?}",
            alike.median_run.as_secs_f64(),
            alike.runs,
            alike.speed,
            alike.took
        );
        assert!(alike.runs as usize >= MIN_RUNS);
        assert!(alike.speed > 0.0 && alike.speed.is_finite());
        // The budget, and at most a run past it (and a busy CI core's slack).
        assert!(
            alike.took < BUDGET + alike.median_run * 4 + Duration::from_secs(1),
            "{alike:?}"
        );
        // Half the cores at half capacity: three quarters of the speed
        // (the median run varies, so compare through it).
        let mixed = calibrate(&executor, &[0.5, 0.5, 1.0, 1.0], BUDGET).unwrap();
        let expected = REFERENCE_RUN_S / mixed.median_run.as_secs_f64() * 0.75;
        assert!(
            (f64::from(mixed.speed) - expected).abs() < expected * 1e-3,
            "{mixed:?}"
        );
    }
}

//! The decision path's timing: the scale benchmark (`sim::scale`: one
//! `decide` call over 1 000 pending tasks on busy random clusters of 100,
//! 1 000 and 10 000 nodes, every policy) run several times, keeping each
//! row's fastest run, since the fastest is the one least disturbed by
//! whatever else the machine was doing.
//!
//! `cargo bench -p starling-placement --bench decide -- [rounds] [nodes,...] [policy,...]`
//! (defaults: 5 rounds, 100,1000,10000, every policy).

use std::time::Instant;

use starling_placement::sim::{self, ScaleConfig, ScaleReport, Stopwatch};

struct Clock(Instant);

impl Stopwatch for Clock {
    fn now_ns(&mut self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; anything starting with `-` is not ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let rounds: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let mut config = ScaleConfig::default();
    if let Some(counts) = args.get(1) {
        config.node_counts = counts
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()?;
    }
    if let Some(policies) = args.get(2) {
        config.policies = policies.split(',').map(str::to_owned).collect();
    }
    let mut clock = Clock(Instant::now());
    let mut best: Option<ScaleReport> = None;
    for _ in 0..rounds.max(1) {
        let report = sim::scale(&config, &mut clock, &mut |_| {})?;
        best = Some(match best {
            None => report,
            Some(mut kept) => {
                for (kept_row, row) in kept.rows.iter_mut().zip(&report.rows) {
                    if row.ns_per_decision < kept_row.ns_per_decision {
                        *kept_row = row.clone();
                    }
                }
                kept
            }
        });
    }
    if let Some(report) = best {
        println!(
            "fastest of {} rounds, seed {}\n\n{}",
            rounds.max(1),
            report.seed,
            report.to_markdown()
        );
    }
    Ok(())
}

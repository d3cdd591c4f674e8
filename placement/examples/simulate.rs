//! Runs the simulator (or, with `scale`, the scale benchmark) and prints the
//! Markdown tables; for the placement crate's own measurements. Examples may read
//! the clock; the library may not.
//!
//! `cargo run -p starling-placement --example simulate -- [sim|scale] [seed] [duration_s] [nodes_per_profile] [policy,...]`

use std::time::Instant;

use starling_placement::sim::{self, ScaleConfig, SimConfig, Stopwatch};

struct Clock(Instant);

impl Stopwatch for Clock {
    fn now_ns(&mut self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("sim", String::as_str);
    let seed = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(42);
    let mut clock = Clock(Instant::now());
    let started = Instant::now();
    if mode == "scale" {
        let mut config = ScaleConfig {
            seed,
            ..ScaleConfig::default()
        };
        if let Some(counts) = args.get(2) {
            config.node_counts = counts
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()?;
        }
        if let Some(pending) = args.get(3) {
            config.pending = pending.parse()?;
        }
        if let Some(policies) = args.get(4) {
            config.policies = policies.split(',').map(str::to_owned).collect();
        }
        let report = sim::scale(&config, &mut clock, &mut |p| eprintln!("{p:?}"))?;
        println!("{}", report.to_markdown());
    } else {
        let mut config = SimConfig {
            seed,
            ..SimConfig::default()
        };
        if let Some(duration) = args.get(2) {
            config.duration_s = duration.parse()?;
        }
        if let Some(nodes) = args.get(3) {
            config.nodes_per_profile = nodes.parse()?;
        }
        if let Some(policies) = args.get(4) {
            config.policies = policies.split(',').map(str::to_owned).collect();
        }
        // HEURISTIC="margin_fraction=0.3,joules_per_second=1" overrides knobs.
        if let Ok(knobs) = std::env::var("HEURISTIC") {
            let mut json = serde_json::to_value(config.heuristic)?;
            for pair in knobs.split(',').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').ok_or("knob must be key=value")?;
                json[key] = serde_json::from_str(value)?;
            }
            config.heuristic = serde_json::from_value(json)?;
            eprintln!("{:?}", config.heuristic);
        }
        let report = sim::run(&config, &mut clock, &mut |p| {
            eprintln!(
                "{}/{} {} {}",
                p.finished_runs, p.total_runs, p.load, p.policy
            )
        })?;
        println!("{}", report.to_markdown());
        if let Ok(path) = std::env::var("SIM_SVG") {
            std::fs::write(path, report.to_svg()?)?;
        }
        if let Ok(path) = std::env::var("SIM_JSON") {
            std::fs::write(path, report.to_json())?;
        }
    }
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

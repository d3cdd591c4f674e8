//! Scenario files: every shipped one parses and runs, a malformed one is
//! refused naming its field and line, and the committed pinned tables
//! (`docs/bench/pinned/`, written by `scripts/bench-sim`) are what the
//! simulator gives today for the same seeds.

use std::path::Path;

use starling_placement::sim::scenario::{self, ScenarioError, SHIPPED};
use starling_placement::sim::{self, FakeStopwatch, SimConfig};

fn stopwatch() -> FakeStopwatch {
    FakeStopwatch {
        now_ns: 0,
        step_ns: 1_000,
    }
}

#[test]
fn every_shipped_scenario_parses_and_runs() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut on_disk: Vec<String> = std::fs::read_dir(&directory)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    on_disk.sort();
    let mut shipped: Vec<String> = SHIPPED
        .iter()
        .map(|(name, _)| format!("{name}.toml"))
        .collect();
    shipped.sort();
    assert_eq!(on_disk, shipped, "every file in scenarios/ is shipped");
    for (name, text) in SHIPPED {
        let parsed = scenario::parse(text).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(parsed.name, *name);
        assert!(!parsed.settings.seeds.is_empty(), "{name} names its seeds");
        assert!(parsed.settings.seeds.len() >= 5, "{name}: at least 5 seeds");
        let mut config = SimConfig::from_scenario(&parsed);
        config.duration_s = 4.0;
        config.warm_up_s = 0.0;
        config.drain_s = 10.0;
        config.policies = vec!["heuristic".into(), "round-robin".into()];
        config
            .policies
            .extend(parsed.settings.policies.iter().take(1).cloned());
        let report = sim::run(&config, &mut stopwatch(), &mut |_| {}).unwrap();
        assert_eq!(report.loads.len(), parsed.loads.len(), "{name}");
        for load in &report.loads {
            assert!(load.tasks > 0, "{name} {}: no arrivals", load.load.name);
            for row in &load.rows {
                assert_eq!(row.constraint_violations, 0, "{name}: {row:?}");
                assert!(row.completed > 0, "{name} {}: {row:?}", load.load.name);
            }
        }
    }
}

/// The built-in fleets are the shipped files: a fleet run and the same file
/// run as a scenario give the same table.
#[test]
fn built_in_fleets_are_their_files() {
    let base = SimConfig {
        duration_s: 5.0,
        nodes_per_profile: 2,
        drain_s: 10.0,
        policies: vec!["heuristic".into(), "earliest-finish".into()],
        ..SimConfig::default()
    };
    let mut file = scenario::shipped("standard").unwrap();
    for device in &mut file.devices {
        device.count = 2;
    }
    let from_file = SimConfig {
        scenario: Some(Box::new(file)),
        ..base.clone()
    };
    let built_in = sim::run(&base, &mut stopwatch(), &mut |_| {}).unwrap();
    let scenario = sim::run(&from_file, &mut stopwatch(), &mut |_| {}).unwrap();
    assert_eq!(built_in.loads, scenario.loads);
}

fn parse_error(text: &str) -> (usize, String, String) {
    match scenario::parse(text).unwrap_err() {
        ScenarioError::Parse {
            line,
            field,
            message,
        }
        | ScenarioError::Invalid {
            line,
            field,
            message,
        } => (line, field, message),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn a_malformed_scenario_names_its_field_and_line() {
    let good = scenario::SHIPPED[0].1;
    let lines: Vec<&str> = good.lines().collect();
    let line_of = |needle: &str| {
        lines
            .iter()
            .position(|line| line.starts_with(needle))
            .unwrap()
            + 1
    };

    // A value of the wrong type.
    let cores = line_of("cores = 4.0");
    let text = good.replacen("cores = 4.0", "cores = \"four\"", 1);
    let (line, field, _) = parse_error(&text);
    assert_eq!((line, field.as_str()), (cores, "cores"));

    // A misspelt key.
    let rtt = line_of("rtt_ms = 8.0");
    let text = good.replacen("rtt_ms = 8.0", "rtt_msec = 8.0", 1);
    let (line, field, message) = parse_error(&text);
    assert_eq!((line, field.as_str()), (rtt, "rtt_msec"), "{message}");

    // A value out of range, found after parsing: the second device's speed.
    let speed = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.starts_with("core_speed = "))
        .nth(1)
        .unwrap()
        .0
        + 1;
    let text: String = good
        .lines()
        .enumerate()
        .map(|(index, line)| {
            if index + 1 == speed {
                "core_speed = -0.3".to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let (line, field, message) = parse_error(&text);
    assert_eq!((line, field.as_str()), (speed, "device[1].core_speed"));
    assert!(message.contains("positive"), "{message}");

    // A reported seed that also tuned something.
    let text = good.replacen("tuning_seeds = [42]", "tuning_seeds = [42, 3]", 1);
    let (line, field, _) = parse_error(&text);
    assert_eq!(
        (line, field.as_str()),
        (line_of("tuning_seeds"), "settings.tuning_seeds")
    );

    // Not TOML at all.
    let (line, _, _) = parse_error("name = \"x\"\n[[device]\n");
    assert_eq!(line, 2);
    let error = scenario::parse("name = \"x\"\n").unwrap_err().to_string();
    assert!(
        error.contains("line 1") && error.contains("device"),
        "{error}"
    );
}

/// Drops the last column (the wall-clock decision time) of a table's rows.
fn without_decision_time(table: &str) -> String {
    table
        .lines()
        .map(|line| {
            if line.starts_with('|') && line.ends_with('|') {
                let cells: Vec<&str> = line.split('|').collect();
                // "", cells..., "" : keep all but the last real cell.
                let keep = cells.len().saturating_sub(2);
                format!("{}|", cells[..keep].join("|"))
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The committed pinned tables, re-run: every column but the wall-clock one
/// must match. `scripts/bench-sim` rewrites them after a deliberate change.
#[test]
fn committed_pinned_tables_are_reproduced() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench/pinned");
    for (name, text) in SHIPPED {
        let path = directory.join(format!("{name}.md"));
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{path:?}: {error}; run scripts/bench-sim"));
        let parsed = scenario::parse(text).unwrap();
        let config = sim::pinned(&SimConfig::from_scenario(&parsed));
        let seeds: Vec<u64> = parsed
            .settings
            .seeds
            .iter()
            .copied()
            .take(sim::PINNED_SEEDS)
            .collect();
        let report = sim::run_seeds(
            &config,
            &seeds,
            "static-optimisation",
            &mut stopwatch(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(
            without_decision_time(committed.trim_end()),
            without_decision_time(report.to_markdown(true).trim_end()),
            "{name}: the simulator no longer gives the committed pinned table; if the change is deliberate, run scripts/bench-sim"
        );
    }
}

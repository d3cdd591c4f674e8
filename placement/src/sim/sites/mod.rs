//! Several sites in one simulation, to measure federation with the same
//! tables as the single-site engine: S sites, each with its own fleet (the
//! configured profiles, as many nodes of each as a single-site run) and its
//! own Poisson arrivals. Site 0 is offered more than it can do; the others
//! little. Every site runs its own instance of the policy on its own nodes.
//! With federation on, sites publish digests every gossip interval and route
//! what they cannot finish in time to a peer ([`crate::federation`]); with it
//! off, the very same arrivals, failures and link changes run with no
//! forwarding.

pub(crate) mod gossip;
pub(crate) mod report;

use serde::{Deserialize, Serialize};

use crate::catalog::policy_with_tuning;
use crate::federation::InterSiteLink;
use crate::sim::engine::{self, Layout};
use crate::sim::workload::Environment;
use crate::sim::{LoadLevel, SimConfig, SimError, SimProgress, Stopwatch};

pub(crate) use gossip::Gossip;
pub use report::{SiteTally, SitesReport, SitesRow};

/// Offset of the sites' random streams from the single-site load levels'
/// streams, so that site k's world is not the single-site run's k-th load.
const SITE_STREAM_OFFSET: usize = 100;

/// What to simulate across sites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SitesConfig {
    /// Per-site settings (seed, duration, fleet, failures, policies, rounds);
    /// its load levels are not used: the loads below are.
    pub sim: SimConfig,
    /// Number of sites, at least 2.
    pub sites: usize,
    /// Load offered to site 0, as a fraction of its capacity.
    pub overflow_load: f64,
    /// Load offered to every other site.
    pub site_load: f64,
    /// The link between any two sites.
    pub link: InterSiteLink,
    /// Milliseconds between two digests of a site.
    pub gossip_interval_ms: u64,
}

impl Default for SitesConfig {
    fn default() -> Self {
        Self {
            sim: SimConfig {
                policies: vec![
                    "heuristic".to_owned(),
                    "least-loaded".to_owned(),
                    "earliest-finish".to_owned(),
                ],
                ..SimConfig::default()
            },
            sites: 3,
            overflow_load: 1.6,
            site_load: 0.3,
            link: InterSiteLink {
                rtt_ms: 20.0,
                bandwidth_mbps: 100.0,
            },
            gossip_interval_ms: 1_000,
        }
    }
}

impl SitesConfig {
    /// Checks the settings, naming the first one out of range.
    pub fn validate(&self) -> Result<(), SimError> {
        self.sim.validate()?;
        let invalid = |what: &str| Err(SimError::InvalidConfig(what.to_owned()));
        if !(2..=64).contains(&self.sites) {
            return invalid("sites must be in 2..=64");
        }
        for load in [self.overflow_load, self.site_load] {
            if !(load.is_finite() && load > 0.0 && load <= 5.0) {
                return invalid("site loads must be in (0, 5]");
            }
        }
        let link = self.link;
        if !(link.rtt_ms.is_finite() && link.rtt_ms >= 0.0 && link.rtt_ms <= 60_000.0) {
            return invalid("inter-site rtt_ms must be in [0, 60000]");
        }
        if !(link.bandwidth_mbps.is_finite() && link.bandwidth_mbps > 0.0) {
            return invalid("inter-site bandwidth_mbps must be positive");
        }
        if self.gossip_interval_ms == 0 {
            return invalid("gossip_interval_ms must be at least 1");
        }
        Ok(())
    }

    /// The load offered to a site.
    fn load(&self, site: usize) -> LoadLevel {
        if site == 0 {
            LoadLevel {
                name: "overflow".to_owned(),
                utilisation: self.overflow_load,
            }
        } else {
            LoadLevel {
                name: "site".to_owned(),
                utilisation: self.site_load,
            }
        }
    }
}

/// The sites' worlds, each generated as a single-site world is, joined into
/// one: nodes and tasks renumbered after the sites before them, node names
/// prefixed with their site.
struct World {
    env: Environment,
    layout: Layout,
    tasks_per_site: Vec<u64>,
    arrival_rate_per_site: Vec<f64>,
}

fn world(config: &SitesConfig) -> Result<World, SimError> {
    let mut joined: Option<Environment> = None;
    let mut layout = Layout {
        sites: Vec::with_capacity(config.sites),
        origin: Vec::new(),
    };
    let mut tasks_per_site = Vec::with_capacity(config.sites);
    let mut arrival_rate_per_site = Vec::with_capacity(config.sites);
    for site in 0..config.sites {
        let mut env =
            Environment::generate(&config.sim, SITE_STREAM_OFFSET + site, &config.load(site))?;
        tasks_per_site.push(env.tasks.len() as u64);
        arrival_rate_per_site.push(env.arrival_rate_per_s);
        for node in &mut env.nodes {
            let name = format!("{}-{}", gossip::site_name(site), node.id);
            if let Ok(id) = starling_proto::NodeId::new(&name) {
                node.id = id;
            }
        }
        let Some(all) = joined.as_mut() else {
            layout.sites.push(0..env.nodes.len());
            layout
                .origin
                .extend(core::iter::repeat_n(site, env.tasks.len()));
            joined = Some(env);
            continue;
        };
        let node_offset = all.nodes.len();
        let task_offset = all.tasks.len();
        layout
            .sites
            .push(node_offset..node_offset + env.nodes.len());
        layout
            .origin
            .extend(core::iter::repeat_n(site, env.tasks.len()));
        all.nodes.extend(env.nodes);
        for (index, mut task) in env.tasks.into_iter().enumerate() {
            // A task's key is its index in the joined world.
            task.key = (task_offset + index) as u64;
            all.tasks.push(task);
        }
        all.failures.extend(
            env.failures
                .into_iter()
                .map(|(at, node)| (at, node + node_offset)),
        );
        // Every site has the same duration and mobility period, so the same ticks.
        for (tick, links) in all.links.iter_mut().zip(env.links) {
            tick.extend(links);
        }
        all.arrival_rate_per_s += env.arrival_rate_per_s;
    }
    let env = match joined {
        Some(env) => env,
        None => Environment::generate(&config.sim, 0, &config.load(0))?,
    };
    Ok(World {
        env,
        layout,
        tasks_per_site,
        arrival_rate_per_site,
    })
}

/// A boxed policy as the engine takes it: the coercion happens here, one
/// reference at a time, since a collected `Vec` could not shorten the trait
/// object's lifetime.
fn policy_handle(policy: &mut Box<dyn crate::policy::Policy>) -> &mut dyn crate::policy::Policy {
    policy.as_mut()
}

/// Runs every policy across the sites with federation off, then on, over the
/// same world, and gathers the report.
pub fn run_sites(
    config: &SitesConfig,
    stopwatch: &mut dyn Stopwatch,
    progress: &mut dyn FnMut(SimProgress),
) -> Result<SitesReport, SimError> {
    config.validate()?;
    let sim = &config.sim;
    for name in &sim.policies {
        policy_with_tuning(name, sim.seed, &sim.heuristic, &sim.models)?;
    }
    let world = world(config)?;
    let total_runs = sim.policies.len() * 2;
    let mut rows = Vec::with_capacity(total_runs);
    for name in &sim.policies {
        for federation in [false, true] {
            // One instance per site, as one coordinator per site runs its own.
            let mut policies = (0..config.sites)
                .map(|site| {
                    policy_with_tuning(
                        name,
                        sim.seed.wrapping_add(site as u64),
                        &sim.heuristic,
                        &sim.models,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut handles: Vec<&mut dyn crate::policy::Policy> =
                policies.iter_mut().map(policy_handle).collect();
            let gossip = federation.then(|| {
                Gossip::new(
                    config.link,
                    config.gossip_interval_ms as f64,
                    world.env.tasks.len(),
                )
            });
            let run = engine::simulate_sites(
                sim,
                &world.env,
                &world.layout,
                &mut handles,
                gossip,
                stopwatch,
                &mut |_| {},
            );
            let forwarded = run.sites.iter().map(|site| site.forwarded_out).sum();
            rows.push(SitesRow {
                policy: name.clone(),
                federation,
                overall: run.row,
                sites: run.sites,
                forwarded,
            });
            progress(SimProgress {
                load: format!("federation {}", if federation { "on" } else { "off" }),
                policy: name.clone(),
                finished_runs: rows.len(),
                total_runs,
            });
        }
    }
    Ok(SitesReport {
        seed: sim.seed,
        config: config.clone(),
        tasks_per_site: world.tasks_per_site,
        arrival_rate_per_site: world.arrival_rate_per_site,
        rows,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::learned::Fate;
    use crate::sim::FakeStopwatch;

    fn small() -> SitesConfig {
        let mut config = SitesConfig::default();
        config.sim.duration_s = 20.0;
        config.sim.drain_s = 30.0;
        config.sim.nodes_per_profile = 2;
        config.sim.policies = vec!["heuristic".to_owned()];
        config
    }

    fn stopwatch() -> FakeStopwatch {
        FakeStopwatch {
            now_ns: 0,
            step_ns: 1_000,
        }
    }

    #[test]
    fn federation_completes_more_deadlines_under_overflow() {
        let report = run_sites(&small(), &mut stopwatch(), &mut |_| {}).unwrap();
        let off = &report.rows[0];
        let on = &report.rows[1];
        assert!(!off.federation && on.federation);
        assert_eq!(off.forwarded, 0);
        assert!(on.forwarded > 0, "nothing forwarded");
        assert!(
            on.overall.deadline_completion_rate > off.overall.deadline_completion_rate,
            "on {} against off {}",
            on.overall.deadline_completion_rate,
            off.overall.deadline_completion_rate
        );
        assert!(on.overflow_completion_rate() > off.overflow_completion_rate());
        // Only the overflowing site needs to forward much; peers receive it.
        assert!(on.sites[0].forwarded_out * 2 > on.forwarded);
        assert_eq!(
            on.sites.iter().map(|s| s.received).sum::<u64>(),
            on.forwarded
        );
        let markdown = report.to_markdown();
        assert!(markdown.contains("| heuristic | off |"), "{markdown}");
        assert!(markdown.contains("| heuristic | on |"), "{markdown}");
        assert!(
            markdown.contains("heuristic: federation raises"),
            "{markdown}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["rows"].as_array().unwrap().len(), 2);
        assert_eq!(json["config"]["sites"], 3);
    }

    #[test]
    fn the_same_seed_gives_the_same_report() {
        let first = run_sites(&small(), &mut stopwatch(), &mut |_| {}).unwrap();
        let second = run_sites(&small(), &mut stopwatch(), &mut |_| {}).unwrap();
        assert_eq!(first, second);
        let mut other = small();
        other.sim.seed = 7;
        let third = run_sites(&other, &mut stopwatch(), &mut |_| {}).unwrap();
        assert_ne!(first.tasks_per_site, third.tasks_per_site);
    }

    #[test]
    fn with_federation_every_arrival_ends_exactly_once() {
        let config = small();
        let world = world(&config).unwrap();
        let tasks = world.env.tasks.len();
        assert_eq!(
            world.tasks_per_site.iter().sum::<u64>(),
            tasks as u64,
            "sites' tasks joined"
        );
        let mut policies: Vec<_> = (0..config.sites)
            .map(|_| crate::catalog::policy_by_name("heuristic", 1).unwrap())
            .collect();
        let mut handles: Vec<&mut dyn crate::policy::Policy> =
            policies.iter_mut().map(policy_handle).collect();
        let mut ends = vec![0u32; tasks];
        let run = engine::simulate_sites(
            &config.sim,
            &world.env,
            &world.layout,
            &mut handles,
            Some(Gossip::new(config.link, 1_000.0, tasks)),
            &mut stopwatch(),
            &mut |outcome| {
                if outcome.fate != Fate::AttemptLost {
                    ends[outcome.task_key as usize] += 1;
                }
            },
        );
        assert!(
            ends.iter().all(|count| *count == 1),
            "a task ended twice or never"
        );
        let row = &run.row;
        assert_eq!(row.completed + row.failed + row.dropped, tasks as u64);
        assert_eq!(
            run.sites.iter().map(|s| s.arrivals).sum::<u64>(),
            tasks as u64
        );
        assert_eq!(
            run.sites.iter().map(|s| s.completed).sum::<u64>(),
            row.completed
        );
        assert!(run.sites.iter().map(|s| s.forwarded_out).sum::<u64>() > 0);
    }

    #[test]
    fn bad_site_settings_are_refused() {
        let mut config = small();
        config.sites = 1;
        let error = run_sites(&config, &mut stopwatch(), &mut |_| {}).unwrap_err();
        assert!(error.to_string().contains("sites"), "{error}");
        let mut config = small();
        config.link.bandwidth_mbps = 0.0;
        assert!(run_sites(&config, &mut stopwatch(), &mut |_| {}).is_err());
        let mut config = small();
        config.gossip_interval_ms = 0;
        assert!(run_sites(&config, &mut stopwatch(), &mut |_| {}).is_err());
    }
}

//! The multi-site report: one row per policy with federation off and on,
//! as Markdown (the single-site report's table style) and JSON.

use core::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::sim::report::{micros, percent, PolicyRow};
use crate::sim::sites::SitesConfig;

/// One site's tasks, counted where they arrived (a forwarded task counts at
/// its origin, which is where its result is due).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SiteTally {
    /// The site's index (site 0 is the overflowing one).
    pub site: usize,
    /// Tasks that arrived there.
    pub arrivals: u64,
    /// Of those, tasks whose output was delivered.
    pub completed: u64,
    /// Of those, tasks delivered by their deadline.
    pub on_time: u64,
    /// On-time tasks over arrived tasks.
    pub deadline_completion_rate: f64,
    /// Tasks it forwarded to a peer.
    pub forwarded_out: u64,
    /// Tasks peers forwarded to it.
    pub received: u64,
}

impl SiteTally {
    /// Computes the derived column.
    pub(crate) fn finish(&mut self) {
        if self.arrivals > 0 {
            self.deadline_completion_rate = self.on_time as f64 / self.arrivals as f64;
        }
    }
}

/// One policy's results with federation off or on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SitesRow {
    /// The policy every site ran.
    pub policy: String,
    /// Whether sites forwarded work to each other.
    pub federation: bool,
    /// Every site together, in the single-site report's terms.
    pub overall: PolicyRow,
    /// Per site, by origin.
    pub sites: Vec<SiteTally>,
    /// Tasks forwarded between sites.
    pub forwarded: u64,
}

impl SitesRow {
    /// Deadline completion of the tasks that arrived at the overflowing site.
    pub fn overflow_completion_rate(&self) -> f64 {
        self.sites
            .first()
            .map_or(0.0, |site| site.deadline_completion_rate)
    }
}

/// The whole multi-site comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SitesReport {
    /// The seed of every random stream.
    pub seed: u64,
    /// The settings it ran with.
    pub config: SitesConfig,
    /// Tasks that arrived at each site.
    pub tasks_per_site: Vec<u64>,
    /// Mean arrivals per second at each site.
    pub arrival_rate_per_site: Vec<f64>,
    /// Per policy, federation off then on.
    pub rows: Vec<SitesRow>,
}

impl SitesReport {
    /// The table as Markdown, with the settings above it and the
    /// definitions and checks below.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let config = &self.config;
        let sim = &config.sim;
        // Writing to a String cannot fail; the results are ignored.
        let _ = writeln!(
            out,
            "Seed {}, {} sites, each {} nodes of each of 4 profiles, {} s of arrivals, {} failures per node-hour, placement every {} ms. \
             Site 0 is offered {:.0}% of its capacity ({} tasks), the others {:.0}% ({} tasks in all). \
             Inter-site link {} ms RTT, {} Mbit/s; digests gossiped every {} ms.\n",
            self.seed,
            config.sites,
            sim.nodes_per_profile,
            sim.duration_s,
            sim.failure_rate_per_hour,
            sim.round_ms,
            config.overflow_load * 100.0,
            self.tasks_per_site.first().copied().unwrap_or(0),
            config.site_load * 100.0,
            self.tasks_per_site.iter().skip(1).sum::<u64>(),
            config.link.rtt_ms,
            config.link.bandwidth_mbps,
            config.gossip_interval_ms
        );
        out.push_str("| policy | federation | deadline completion | at site 0 (overflowing) | mean latency (ms) | p95 latency (ms) | forwarded | energy per task (J) | failed | dropped | decision time per task (µs) |\n");
        out.push_str(
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for row in &self.rows {
            let overall = &row.overall;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.2} | {} | {} | {} |",
                row.policy,
                if row.federation { "on" } else { "off" },
                percent(overall.deadline_completion_rate),
                percent(row.overflow_completion_rate()),
                overall.mean_latency_ms,
                overall.p95_latency_ms,
                row.forwarded,
                overall.energy_per_task_joules,
                overall.failed,
                overall.dropped,
                micros(overall.decision_ns_per_task)
            );
        }
        out.push('\n');
        out.push_str(
            "Deadline completion: tasks delivered by their deadline over tasks arrived, all sites \
             together and at the overflowing site (a forwarded task counts where it arrived). \
             Latency: submission to output back at the site it arrived at, inter-site transfers \
             included. Forwarded: tasks a site sent to a peer (each at most once). Energy, failed, \
             dropped and decision time as in the single-site table.\n\n",
        );
        crate::sim::report::push_claims(&mut out, "Checks:", &self.claims());
        out
    }

    /// Plain statements, per policy, of what federation changed: deadline
    /// completion overall and at the overflowing site, and latency.
    pub fn claims(&self) -> Vec<String> {
        let mut claims = Vec::new();
        for off in self.rows.iter().filter(|row| !row.federation) {
            let Some(on) = self
                .rows
                .iter()
                .find(|row| row.federation && row.policy == off.policy)
            else {
                continue;
            };
            let verdict =
                if on.overall.deadline_completion_rate > off.overall.deadline_completion_rate {
                    "raises"
                } else {
                    "does NOT raise"
                };
            claims.push(format!(
                "{}: federation {verdict} deadline completion: {} against {} overall, {} against {} at the overflowing site, with {} tasks forwarded; mean latency {:.0} ms against {:.0} ms.",
                off.policy,
                percent(on.overall.deadline_completion_rate),
                percent(off.overall.deadline_completion_rate),
                percent(on.overflow_completion_rate()),
                percent(off.overflow_completion_rate()),
                on.forwarded,
                on.overall.mean_latency_ms,
                off.overall.mean_latency_ms
            ));
        }
        claims
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and numbers always serialise.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

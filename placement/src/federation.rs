//! Federation: one coordinator serves one site, and sites gossip a bounded
//! [`SiteDigest`] about themselves. This module is the engine's side of it:
//! the figures a site puts in its own digest ([`site_capacity`]), what a peer's
//! digest says a forwarded task would cost ([`remote_finish_ms`]), where a task
//! should go once the local policy has decided ([`route`]), and the local
//! accounting of a forward ([`commit`]) so that one gossip interval does not
//! pour more work on a peer than its digest said it could take.
//!
//! Everything here reads only the view, the queue and the digests it is handed:
//! the coordinator and the simulator get the same answers from the same inputs.
//! A digest is coarse (a handful of numbers per class), so a remote estimate is
//! rougher than a local one; forwarding is reserved for tasks the local site
//! cannot finish in time, where a rough chance beats a certain miss.

use core::fmt::Write as _;

use heapless::Vec as BoundedVec;
use serde::{Deserialize, Serialize};
use starling_proto::site::{
    DIGEST_URL_LEN, MAX_DIGEST_ARTIFACTS, MAX_POWER_BANDS, MAX_SITE_CLASSES,
};
use starling_proto::{
    ClassCapacity, Digest, PowerBand, Runtime, SiteDigest, SiteId, WorkClass, PROTOCOL_VERSION,
};

use crate::estimate;
use crate::model::{ClusterView, Constraints, Demand, NodeView, PendingTask, TaskClass};
use crate::policy::{Decision, Outcome};

/// The power budgets a digest describes, watts, smallest first: a Raspberry
/// Pi or a Jetson in its 5 W mode fits the first, a mini PC's lowest level
/// the third or fourth. Fixed, so that every site's bands mean the same.
pub const POWER_BAND_WATTS: [f32; MAX_POWER_BANDS] = [5.0, 10.0, 20.0, 40.0];

/// Network cost between this site and a peer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InterSiteLink {
    /// Round-trip time, milliseconds.
    pub rtt_ms: f64,
    /// Usable bandwidth, Mbit/s.
    pub bandwidth_mbps: f64,
}

impl InterSiteLink {
    /// Seconds to push `bytes` through the link once it is open (the round
    /// trips are counted apart, half on the way out and half on the way back).
    pub fn transfer_s(&self, bytes: u64) -> f64 {
        bytes as f64 * 8.0 / (self.bandwidth_mbps.max(0.001) * 1e6)
    }

    /// Half the round trip, seconds: one way across the link.
    pub fn one_way_s(&self) -> f64 {
        self.rtt_ms.max(0.0) / 2000.0
    }
}

/// A peer site as the engine sees it: its latest digest and the link to it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSite {
    /// The newest digest received from the site, with this site's own
    /// forwards since then accounted in it (see [`commit`]).
    pub digest: SiteDigest,
    /// The link from this site to it.
    pub link: InterSiteLink,
}

/// The digest's task class for an engine task class.
pub fn work_class(class: TaskClass) -> WorkClass {
    match class {
        TaskClass::Cpu => WorkClass::Cpu,
        TaskClass::Gpu => WorkClass::Gpu,
        TaskClass::Io => WorkClass::Io,
    }
}

/// This site's capacity figures for its digest, from the same view the policy
/// sees. The coordinator fills `v`, `site`, `version`, `api_url` and
/// `artifacts` itself (or through [`SiteCapacity::into_digest`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SiteCapacity {
    /// Online nodes.
    pub nodes: u16,
    /// Free capacity per class, for each class some online node can run.
    pub classes: BoundedVec<ClassCapacity, MAX_SITE_CLASSES>,
    /// Free slots per power budget ([`POWER_BAND_WATTS`]), smallest first.
    pub power: BoundedVec<PowerBand, MAX_POWER_BANDS>,
    /// Tasks waiting in the queue.
    pub pending: u32,
    /// Tasks the view accounts as placed and not finished.
    pub running: u32,
    /// Smallest deadline slack among the queue, ms (`None`: nothing with a
    /// deadline waits).
    pub slack_ms: Option<i64>,
    /// Estimated power drawn by busy nodes, watts.
    pub watts: f32,
}

/// Why a digest could not be built from a site's capacity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The REST base URL does not fit the digest.
    #[error("api url is {len} bytes; a site digest carries at most {max}")]
    UrlTooLong {
        /// The URL's length, bytes.
        len: usize,
        /// The most a digest carries.
        max: usize,
    },
    /// Version 0 is reserved: peers drop it as unset.
    #[error("digest version 0; versions start at 1")]
    VersionZero,
}

impl SiteCapacity {
    /// The digest this site gossips: these figures plus its name, version,
    /// REST base URL and its most recently used artifacts (the first
    /// [`MAX_DIGEST_ARTIFACTS`] are kept; a digest is bounded by design).
    pub fn into_digest(
        self,
        site: SiteId,
        version: u64,
        api_url: &str,
        artifacts: &[Digest],
    ) -> Result<SiteDigest, DigestError> {
        if version == 0 {
            return Err(DigestError::VersionZero);
        }
        let api_url = heapless::String::<DIGEST_URL_LEN>::try_from(api_url).map_err(|_| {
            DigestError::UrlTooLong {
                len: api_url.len(),
                max: DIGEST_URL_LEN,
            }
        })?;
        let mut held = BoundedVec::new();
        for artifact in artifacts.iter().take(MAX_DIGEST_ARTIFACTS) {
            // Cannot fail: at most MAX_DIGEST_ARTIFACTS are taken.
            let _ = held.push(*artifact);
        }
        Ok(SiteDigest {
            v: PROTOCOL_VERSION,
            site,
            version,
            api_url,
            nodes: self.nodes,
            classes: self.classes,
            power: self.power,
            pending: self.pending,
            running: self.running,
            slack_ms: self.slack_ms,
            watts: self.watts,
            artifacts: held,
        })
    }
}

/// A reference task of one reference second for a class: what a "slot" of the
/// class means when the digest counts them. A GPU-class probe asks for an
/// OpenCL device of any kind, so the GPU entry describes the nodes that can run
/// kernels; a GPU-class task that needs no device can also use the CPU entry's
/// nodes, but the digest keeps to one meaning per class.
fn probe(class: TaskClass) -> PendingTask {
    let device = class == TaskClass::Gpu;
    PendingTask {
        key: 0,
        class,
        demand: Demand {
            cpu_cores: 1.0,
            memory_bytes: 0,
            gpu: device,
            io_mbps: 0.0,
            gpu_memory_bytes: 0,
        },
        work: 1.0,
        input_bytes: 0,
        output_bytes: 0,
        deadline_ms: None,
        priority: 0,
        submitted_ms: 0,
        constraints: Constraints {
            runtime: if device {
                Runtime::Opencl
            } else {
                Runtime::Wasm
            },
            arch: None,
            labels: Vec::new(),
            device_kind: None,
            fp64: false,
        },
        artifact: 0,
    }
}

/// Free slots of the probe's class on one node. Device lanes are not tracked
/// one by one in the load, only their backlog, so a device node counts its
/// devices as free only when no device work is placed on it: exact for the
/// single-GPU boards at the edge, cautious for larger ones.
fn free_slots(node: &NodeView, probe: &PendingTask) -> u32 {
    if estimate::runs_on_gpu(node, probe) {
        if node.load.backlog_gpu_s <= 1e-9 {
            node.gpu_devices()
        } else {
            0
        }
    } else {
        let lanes = f64::from(estimate::lanes(node, probe).max(1));
        // Whole lanes only; a fraction of a core is no slot.
        (node.load.free_cpu_cores.max(0.0) / lanes).floor() as u32
    }
}

fn saturate_u16(value: u64) -> u16 {
    u16::try_from(value).unwrap_or(u16::MAX)
}

fn saturate_u32(value: f64) -> u32 {
    if value.is_finite() {
        value.clamp(0.0, f64::from(u32::MAX)) as u32
    } else {
        u32::MAX
    }
}

/// One class's free capacity on the view, `None` when no online node can run
/// it. The wait is the shortest fluid backlog among the class's full nodes
/// (none full: 0), plus the work of the class already waiting in the queue
/// spread over the class's nodes, since queued tasks take free slots first.
fn class_capacity(
    view: &ClusterView,
    queue: &[PendingTask],
    class: TaskClass,
) -> Option<ClassCapacity> {
    let probe = probe(class);
    let mut capable = false;
    let mut free_total: u64 = 0;
    let mut speed: f64 = 0.0;
    // When every node is busy, the fastest one prices the work after the wait.
    let mut fastest: f64 = 0.0;
    let mut wait_s: Option<f64> = None;
    let mut rate_total: f64 = 0.0;
    for node in view.nodes.iter().filter(|node| node.online) {
        if estimate::check_static(node, &probe).is_err() {
            continue;
        }
        capable = true;
        let top = node.top_power_level();
        // Modelled, without what this site's nodes learned from what they
        // ran (`model::correction`): a peer that has not run the work yet
        // has nothing learned, and comparing its model with our learning
        // sent everything to the sites that ran it first and nothing, ever,
        // to one that joined later. Within a site, fleet priors settle
        // that; between sites, both sides of the comparison are the model.
        let node_speed = 1.0 / estimate::modelled_execution_s(node, &probe, top).max(1e-9);
        let lanes = if estimate::runs_on_gpu(node, &probe) {
            f64::from(node.gpu_devices().max(1))
        } else {
            node.cpu_cores.max(1.0) / f64::from(estimate::lanes(node, &probe).max(1))
        };
        rate_total += node_speed * lanes;
        fastest = fastest.max(node_speed);
        let free = free_slots(node, &probe);
        if free > 0 {
            free_total = free_total.saturating_add(u64::from(free));
            speed = speed.max(node_speed);
        } else {
            let wait = estimate::queue_wait_s(node, &node.load, &probe);
            wait_s = Some(wait_s.map_or(wait, |w: f64| w.min(wait)));
        }
    }
    if !capable {
        return None;
    }
    let queued_work: f64 = queue
        .iter()
        .filter(|task| task.class == class)
        .map(|task| task.work.max(0.0))
        .sum();
    let wait_s = wait_s.unwrap_or(0.0) + queued_work / rate_total.max(1e-9);
    Some(ClassCapacity {
        class: work_class(class),
        free_slots: saturate_u16(free_total),
        speed: if free_total > 0 { speed } else { fastest } as f32,
        wait_ms: saturate_u32(wait_s * 1000.0),
    })
}

/// This site's capacity figures for its digest, from the same view the policy
/// sees: free slots per class, the modelled speed of the fastest node with a
/// free slot (of the fastest node when none is free) at its top power level
/// (reference-core units), the estimated wait for a slot
/// when none is free, free slots per power band, the queue's length and
/// tightest slack, the tasks in flight and the watts busy nodes draw.
pub fn site_capacity(view: &ClusterView, queue: &[PendingTask]) -> SiteCapacity {
    let online = view.nodes.iter().filter(|node| node.online);
    let nodes = saturate_u16(online.clone().count() as u64);
    let mut classes = BoundedVec::new();
    for class in TaskClass::ALL {
        if let Some(capacity) = class_capacity(view, queue, class) {
            // Cannot fail: one entry per class, and there are MAX_SITE_CLASSES classes.
            let _ = classes.push(capacity);
        }
    }
    let cpu_probe = probe(TaskClass::Cpu);
    let gpu_probe = probe(TaskClass::Gpu);
    let mut power = BoundedVec::new();
    for max_watts in POWER_BAND_WATTS {
        let free: u64 = online
            .clone()
            .filter(|node| node.power_level(0).active_watts <= f64::from(max_watts))
            .map(|node| {
                let cores = if estimate::check_static(node, &cpu_probe).is_ok() {
                    free_slots(node, &cpu_probe)
                } else {
                    0
                };
                let devices = if estimate::check_static(node, &gpu_probe).is_ok()
                    && estimate::runs_on_gpu(node, &gpu_probe)
                {
                    free_slots(node, &gpu_probe)
                } else {
                    0
                };
                u64::from(cores) + u64::from(devices)
            })
            .sum();
        // Cannot fail: MAX_POWER_BANDS budgets.
        let _ = power.push(PowerBand {
            max_watts,
            free_slots: saturate_u16(free),
        });
    }
    let running = online
        .clone()
        .map(|node| u64::from(node.load.queued_tasks))
        .sum::<u64>();
    let slack_ms = queue
        .iter()
        .filter_map(|task| task.deadline_ms)
        .map(|deadline| {
            i64::try_from(deadline).unwrap_or(i64::MAX)
                - i64::try_from(view.now_ms).unwrap_or(i64::MAX)
        })
        .min();
    let watts: f64 = online
        .filter(|node| node.load.queued_tasks > 0)
        .map(|node| {
            let level = node.power_level(node.load.power_level);
            let busy = node.queue_state().utilisation;
            level.idle_watts + (level.active_watts - level.idle_watts).max(0.0) * busy
        })
        .sum();
    SiteCapacity {
        nodes,
        classes,
        power,
        pending: u32::try_from(queue.len()).unwrap_or(u32::MAX),
        running: u32::try_from(running).unwrap_or(u32::MAX),
        slack_ms,
        watts: watts as f32,
    }
}

/// Estimated finish (ms, on the view's clock `now_ms`) of `task` if forwarded
/// to `site`: half the RTT, the input over the link, the site's wait (none
/// with a free slot of the class), the work at the site's speed, the output
/// back over the link and the other half of the RTT. `None` when the site
/// cannot run the class as far as its digest tells: no entry for the class,
/// no speed and no free slot, or a task needing an OpenCL device at a site
/// without a GPU entry.
pub fn remote_finish_ms(task: &PendingTask, now_ms: u64, site: &RemoteSite) -> Option<f64> {
    let capacity = site.digest.class(work_class(task.class))?;
    if estimate::needs_device(task) && site.digest.class(WorkClass::Gpu).is_none() {
        return None;
    }
    // A speed of 0 is a site that reports no usable node for the class (or a
    // digest from a publisher that leaves it 0 when busy): the wait alone
    // cannot price the work.
    if capacity.speed <= 0.0 {
        return None;
    }
    let wait_s = if capacity.free_slots > 0 {
        0.0
    } else {
        f64::from(capacity.wait_ms) / 1000.0
    };
    let link = site.link;
    let total_s = link.one_way_s()
        + link.transfer_s(task.input_bytes)
        + wait_s
        + task.work.max(0.0) / f64::from(capacity.speed)
        + link.transfer_s(task.output_bytes)
        + link.one_way_s();
    Some(now_ms as f64 + total_s * 1000.0)
}

/// Where a task should go after the local policy decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Keep it here: dispatch (or hold) as the local policy decided.
    Local,
    /// Send it to a peer.
    Forward {
        /// Index into the `sites` handed to [`route`].
        site: usize,
        /// Its estimated finish there, ms on the view's clock.
        finish_ms: f64,
        /// One line for people: where, by when, and why not here.
        summary: String,
    },
}

/// Local when the local decision meets the deadline: its best alternative's
/// estimated finish (the chosen one when it placed) is by the deadline, or the
/// task has none. Otherwise (a late placement, or a hold with no alternative
/// in time) the peer with the earliest [`remote_finish_ms`] that meets the
/// deadline; ties go to more free slots of the class, then to the site's name.
/// Local when no peer meets it either: a late result at home costs the
/// network nothing.
pub fn route(task: &PendingTask, now_ms: u64, local: &Decision, sites: &[RemoteSite]) -> Route {
    route_with_artifact(task, now_ms, local, sites, None)
}

/// [`route`], with the task's artifact: between peers that finish at the same
/// time with the same free slots, one that already holds the artifact wins
/// (it need not fetch it).
pub fn route_with_artifact(
    task: &PendingTask,
    now_ms: u64,
    local: &Decision,
    sites: &[RemoteSite],
    artifact: Option<&Digest>,
) -> Route {
    let Some(deadline) = task.deadline_ms else {
        return Route::Local;
    };
    let deadline = deadline as f64;
    // A hold that still meets the deadline (late binding) is a choice, not a
    // failure: its best alternative says when it would finish.
    let local_finish = local
        .explanation
        .alternatives
        .first()
        .and_then(|alternative| alternative.finish_ms);
    let why_not_local = match (&local.outcome, local_finish) {
        (_, Some(finish)) if finish <= deadline => return Route::Local,
        (Outcome::Place { .. }, None) => return Route::Local,
        (_, Some(finish)) => format!(
            "local best finishes {:.1} s after the deadline",
            (finish - deadline) / 1000.0
        ),
        (Outcome::Hold { reason }, None) => format!("held locally ({reason})"),
    };
    let best = sites
        .iter()
        .enumerate()
        .filter_map(|(index, site)| {
            let finish = remote_finish_ms(task, now_ms, site)?;
            (finish <= deadline).then_some((index, site, finish))
        })
        .min_by(|(_, a_site, a), (_, b_site, b)| {
            let free = |site: &RemoteSite| {
                site.digest
                    .class(work_class(task.class))
                    .map_or(0, |capacity| capacity.free_slots)
            };
            let holds =
                |site: &RemoteSite| artifact.is_some_and(|digest| site.digest.holds(digest));
            a.total_cmp(b)
                .then_with(|| free(b_site).cmp(&free(a_site)))
                .then_with(|| holds(b_site).cmp(&holds(a_site)))
                .then_with(|| a_site.digest.site.as_str().cmp(b_site.digest.site.as_str()))
        });
    match best {
        Some((index, site, finish)) => {
            let mut summary = why_not_local;
            let _ = write!(
                summary,
                "; {}: {:.1} s to spare",
                site.digest.site,
                (deadline - finish) / 1000.0
            );
            Route::Forward {
                site: index,
                finish_ms: finish,
                summary,
            }
        }
        None => Route::Local,
    }
}

/// Accounts a forward in the local copy of the peer's digest, so one gossip
/// interval does not send a peer more work than its digest says it can take:
/// one free slot of the task's class is used, and one of the smallest power
/// band with a free slot (and of every larger band, which contains it), and
/// taking the last one makes the wait at least the task's run time; when no
/// slot of the class is free, the wait grows by the task's execution time there.
pub fn commit(site: &mut RemoteSite, task: &PendingTask) {
    let class = work_class(task.class);
    let Some(capacity) = site.digest.classes.iter_mut().find(|c| c.class == class) else {
        return;
    };
    let speed = f64::from(capacity.speed).max(1e-3);
    let run_ms = saturate_u32(task.work.max(0.0) / speed * 1000.0);
    if capacity.free_slots > 0 {
        capacity.free_slots -= 1;
        // The last free slot taken frees no sooner than this task ends: the
        // digest's wait (measured while slots were free) may be 0.
        if capacity.free_slots == 0 {
            capacity.wait_ms = capacity.wait_ms.max(run_ms);
        }
        site.digest.running = site.digest.running.saturating_add(1);
        if let Some(first) = site
            .digest
            .power
            .iter()
            .position(|band| band.free_slots > 0)
        {
            for band in site.digest.power.iter_mut().skip(first) {
                band.free_slots = band.free_slots.saturating_sub(1);
            }
        }
    } else {
        capacity.wait_ms = capacity.wait_ms.saturating_add(run_ms);
        site.digest.pending = site.digest.pending.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::policy::{Alternative, Explanation};
    use crate::testing::{gpu_capacity, node, task};
    use starling_proto::{decode, encode, site::MAX_DIGEST_BYTES};

    /// Two 4-core nodes (one at full speed, one at half with a busy core) and a
    /// Jetson-like board, at t = 10 s.
    fn view() -> ClusterView {
        let fast = node("fast", 4.0, 1.0);
        let mut slow = node("slow", 4.0, 0.5);
        slow.load.free_cpu_cores = 3.0;
        slow.load.queued_tasks = 1;
        slow.load.backlog_cpu_s = 2.0;
        let mut board = node("board", 4.0, 0.3);
        board.gpu = Some(gpu_capacity(15.0, 4 << 30));
        board.runtimes.push(Runtime::Opencl);
        board.power_levels[0].active_watts = 5.0;
        ClusterView {
            now_ms: 10_000,
            nodes: vec![fast, slow, board],
        }
    }

    fn digest(name: &str, capacity: SiteCapacity) -> SiteDigest {
        capacity
            .into_digest(
                SiteId::new(name).unwrap(),
                7,
                "https://peer.example:8443",
                &[],
            )
            .unwrap()
    }

    fn remote(name: &str, classes: &[(WorkClass, u16, f32, u32)]) -> RemoteSite {
        let mut capacity = site_capacity(&view(), &[]);
        capacity.classes.clear();
        for (class, free_slots, speed, wait_ms) in classes {
            capacity
                .classes
                .push(ClassCapacity {
                    class: *class,
                    free_slots: *free_slots,
                    speed: *speed,
                    wait_ms: *wait_ms,
                })
                .unwrap();
        }
        RemoteSite {
            digest: digest(name, capacity),
            link: InterSiteLink {
                rtt_ms: 20.0,
                bandwidth_mbps: 100.0,
            },
        }
    }

    fn decision(key: u64, outcome: Outcome, finish_ms: Option<f64>) -> Decision {
        Decision {
            task_key: key,
            outcome,
            explanation: Explanation {
                policy: "heuristic".into(),
                summary: String::new(),
                alternatives: finish_ms
                    .map(|finish| Alternative {
                        node_id: "fast".into(),
                        power_level: 1,
                        score: 0.0,
                        finish_ms: Some(finish),
                        energy_joules: None,
                        note: String::new(),
                    })
                    .into_iter()
                    .collect(),
                ..Explanation::default()
            },
        }
    }

    fn placed() -> Outcome {
        Outcome::Place {
            node: 0,
            power_level: 1,
        }
    }

    #[test]
    fn site_capacity_counts_free_slots_speed_bands_and_queue() {
        let mut waiting = task(1, TaskClass::Cpu);
        waiting.deadline_ms = Some(12_500);
        waiting.work = 3.0;
        let capacity = site_capacity(&view(), &[waiting]);
        assert_eq!(capacity.nodes, 3);
        let cpu = &capacity.classes[0];
        assert_eq!(cpu.class, WorkClass::Cpu);
        assert_eq!(cpu.free_slots, 4 + 3 + 4);
        assert_eq!(cpu.speed, 1.0, "the fastest node with a free core");
        // Nothing is full; the queued 3 s of CPU work over 4 + 2 + 1.2 core-speed.
        assert_eq!(cpu.wait_ms, (3.0 / 7.2 * 1000.0) as u32);
        let gpu = capacity
            .classes
            .iter()
            .find(|c| c.class == WorkClass::Gpu)
            .unwrap();
        assert_eq!((gpu.free_slots, gpu.speed), (1, 15.0));
        assert!(capacity.classes.iter().any(|c| c.class == WorkClass::Io));
        // Only the board's lowest level fits 5 W: 4 cores and its GPU.
        assert_eq!(capacity.power[0].max_watts, 5.0);
        assert_eq!(capacity.power[0].free_slots, 5);
        assert_eq!(capacity.power[1].free_slots, 5 + 4 + 3);
        assert_eq!(capacity.pending, 1);
        assert_eq!(capacity.running, 1);
        assert_eq!(capacity.slack_ms, Some(2_500));
        // The slow node is busy: idle 6 W plus a quarter of its 20 W dynamic range.
        assert!((capacity.watts - 11.0).abs() < 1e-4, "{}", capacity.watts);

        // Full nodes: no free slot, the shortest backlog as the wait.
        let mut full = view();
        for node in &mut full.nodes {
            node.load.free_cpu_cores = 0.0;
            node.load.backlog_cpu_s = 8.0;
            node.load.backlog_gpu_s = 1.0;
        }
        full.nodes[2].online = false;
        let capacity = site_capacity(&full, &[]);
        assert_eq!(capacity.nodes, 2);
        let cpu = &capacity.classes[0];
        // No free slot: the fastest node prices the work after the wait.
        assert_eq!((cpu.free_slots, cpu.speed, cpu.wait_ms), (0, 1.0, 2_000));
        assert!(
            capacity.classes.iter().all(|c| c.class != WorkClass::Gpu),
            "no online node runs kernels"
        );
    }

    #[test]
    fn remote_finish_adds_link_wait_and_work() {
        let site = remote("site-b", &[(WorkClass::Cpu, 2, 2.0, 3_000)]);
        let mut t = task(1, TaskClass::Cpu);
        t.work = 4.0;
        t.input_bytes = 1_250_000; // 0.1 s at 100 Mbit/s
        t.output_bytes = 125_000; // 0.01 s
                                  // 10 ms + 100 ms + 0 (free slot) + 2000 ms + 10 ms + 10 ms.
        let finish = remote_finish_ms(&t, 1_000, &site).unwrap();
        assert!((finish - 3_130.0).abs() < 1e-6, "{finish}");
        // No free slot: the wait counts.
        let busy = remote("site-b", &[(WorkClass::Cpu, 0, 2.0, 3_000)]);
        let finish = remote_finish_ms(&t, 1_000, &busy).unwrap();
        assert!((finish - 6_130.0).abs() < 1e-6, "{finish}");
        // No entry, or no speed: the site cannot be priced.
        assert_eq!(remote_finish_ms(&task(2, TaskClass::Io), 0, &site), None);
        let unknown = remote("site-b", &[(WorkClass::Cpu, 0, 0.0, 3_000)]);
        assert_eq!(remote_finish_ms(&t, 0, &unknown), None);
        // A kernel needs a GPU entry.
        let mut kernel = task(3, TaskClass::Gpu);
        kernel.demand.gpu = true;
        kernel.constraints.runtime = Runtime::Opencl;
        let cpu_and_gpu_class = remote("site-b", &[(WorkClass::Cpu, 1, 1.0, 0)]);
        assert_eq!(remote_finish_ms(&kernel, 0, &cpu_and_gpu_class), None);
        let gpu = remote("site-b", &[(WorkClass::Gpu, 1, 10.0, 0)]);
        assert!(remote_finish_ms(&kernel, 0, &gpu).is_some());
    }

    #[test]
    fn route_stays_local_when_local_meets_the_deadline() {
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(5_000);
        let sites = [remote("site-b", &[(WorkClass::Cpu, 8, 4.0, 0)])];
        let local = decision(1, placed(), Some(4_900.0));
        assert_eq!(route(&t, 1_000, &local, &sites), Route::Local);
        // No deadline: nothing to miss.
        t.deadline_ms = None;
        let late = decision(1, placed(), Some(90_000.0));
        assert_eq!(route(&t, 1_000, &late, &sites), Route::Local);
        // A hold whose best alternative is in time (late binding) stays too.
        t.deadline_ms = Some(5_000);
        let hold = Outcome::Hold {
            reason: "busy".into(),
        };
        assert_eq!(
            route(&t, 1_000, &decision(1, hold, Some(4_000.0)), &sites),
            Route::Local
        );
    }

    #[test]
    fn route_forwards_to_the_best_peer_when_local_is_late() {
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(5_000);
        t.work = 2.0;
        let sites = [
            remote("site-c", &[(WorkClass::Cpu, 1, 1.0, 0)]),
            remote("site-b", &[(WorkClass::Cpu, 4, 2.0, 0)]),
            remote("site-a", &[(WorkClass::Cpu, 0, 2.0, 60_000)]),
        ];
        let local = decision(1, placed(), Some(9_200.0));
        let Route::Forward {
            site,
            finish_ms,
            summary,
        } = route(&t, 1_000, &local, &sites)
        else {
            panic!("expected a forward");
        };
        assert_eq!(site, 1);
        assert!((finish_ms - 2_100.8).abs() < 1e-6, "{finish_ms}");
        assert_eq!(
            summary,
            "local best finishes 4.2 s after the deadline; site-b: 2.9 s to spare"
        );
        // A held task is forwarded too.
        let held = decision(
            1,
            Outcome::Hold {
                reason: "no compatible node".into(),
            },
            None,
        );
        let Route::Forward { site, summary, .. } = route(&t, 1_000, &held, &sites) else {
            panic!("expected a forward");
        };
        assert_eq!(site, 1);
        assert!(
            summary.starts_with("held locally (no compatible node); site-b"),
            "{summary}"
        );
        // Equal finishes: more free slots, then the name.
        let tied = [
            remote("site-z", &[(WorkClass::Cpu, 3, 2.0, 0)]),
            remote("site-y", &[(WorkClass::Cpu, 5, 2.0, 0)]),
            remote("site-x", &[(WorkClass::Cpu, 5, 2.0, 0)]),
        ];
        assert!(matches!(
            route(&t, 1_000, &local, &tied),
            Route::Forward { site: 2, .. }
        ));
        // Equal slots, one holds the artifact.
        let artifact = Digest([7; 32]);
        let mut holder = remote("site-y", &[(WorkClass::Cpu, 5, 2.0, 0)]);
        holder.digest.artifacts.push(artifact).unwrap();
        let tied = [remote("site-x", &[(WorkClass::Cpu, 5, 2.0, 0)]), holder];
        assert!(matches!(
            route_with_artifact(&t, 1_000, &local, &tied, Some(&artifact)),
            Route::Forward { site: 1, .. }
        ));
    }

    #[test]
    fn route_stays_local_when_no_peer_meets_the_deadline() {
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(5_000);
        t.work = 8.0;
        let sites = [
            remote("site-b", &[(WorkClass::Cpu, 4, 1.0, 0)]),
            remote("site-c", &[(WorkClass::Gpu, 4, 10.0, 0)]),
        ];
        let local = decision(1, placed(), Some(9_200.0));
        assert_eq!(route(&t, 1_000, &local, &sites), Route::Local);
        assert_eq!(route(&t, 1_000, &local, &[]), Route::Local);
    }

    #[test]
    fn commit_stops_a_second_forward_once_the_free_slots_are_used() {
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(5_000);
        t.work = 2.0;
        let mut sites = [remote("site-b", &[(WorkClass::Cpu, 1, 1.0, 0)])];
        let bands_before: Vec<u16> = sites[0].digest.power.iter().map(|b| b.free_slots).collect();
        let local = decision(1, placed(), Some(9_200.0));
        assert!(matches!(
            route(&t, 1_000, &local, &sites),
            Route::Forward { site: 0, .. }
        ));
        commit(&mut sites[0], &t);
        let cpu = sites[0].digest.class(WorkClass::Cpu).unwrap();
        // The slot is taken until this task's 2 s have run.
        assert_eq!((cpu.free_slots, cpu.wait_ms), (0, 2_000));
        let bands_after: Vec<u16> = sites[0].digest.power.iter().map(|b| b.free_slots).collect();
        // The smallest band with a free slot, and every band above it, lost one.
        let first = bands_before.iter().position(|free| *free > 0).unwrap();
        for (index, (before, after)) in bands_before.iter().zip(&bands_after).enumerate() {
            let used = u16::from(index >= first);
            assert_eq!(*after, before - used, "band {index}");
        }
        // Waiting 2 s there no longer meets the deadline: the next one stays.
        assert_eq!(route(&t, 1_000, &local, &sites), Route::Local);
        // Past the free slots, each forward adds its run time to the wait.
        commit(&mut sites[0], &t);
        assert_eq!(
            sites[0].digest.class(WorkClass::Cpu).unwrap().wait_ms,
            4_000
        );
    }

    #[test]
    fn a_digest_from_site_capacity_round_trips_within_its_bound() {
        let mut waiting = task(1, TaskClass::Gpu);
        waiting.deadline_ms = Some(3_000);
        let artifacts: Vec<Digest> = (0..12).map(|i| Digest([i; 32])).collect();
        let digest = site_capacity(&view(), &[waiting])
            .into_digest(
                SiteId::new("site-a").unwrap(),
                1_700_000_000_000,
                "https://site-a.example:8443",
                &artifacts,
            )
            .unwrap();
        assert_eq!(digest.artifacts.len(), MAX_DIGEST_ARTIFACTS);
        assert_eq!(digest.slack_ms, Some(-7_000), "already late");
        let bytes = encode(&digest).unwrap();
        assert!(bytes.len() <= MAX_DIGEST_BYTES, "{} bytes", bytes.len());
        assert_eq!(decode::<SiteDigest>(&bytes).unwrap(), digest);

        let long = "h".repeat(DIGEST_URL_LEN + 1);
        let error = site_capacity(&view(), &[])
            .into_digest(SiteId::new("site-a").unwrap(), 1, &long, &[])
            .unwrap_err();
        assert_eq!(
            error,
            DigestError::UrlTooLong {
                len: DIGEST_URL_LEN + 1,
                max: DIGEST_URL_LEN
            }
        );
        assert!(site_capacity(&view(), &[])
            .into_digest(SiteId::new("site-a").unwrap(), 0, "u", &[])
            .is_err());
    }
}

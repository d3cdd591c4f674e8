//! Federation gossip against HashiCorp Serf, on the same network namespaces
//! in the same run: how fast a site's new digest reaches every member, how
//! fast a member whose link is cut is declared down and, once the link is
//! back, alive again, and how many bytes a quiet cluster spends per member.
//!
//! Then false positives under CPU starvation: a few members held to a small
//! CPU share by a cgroup quota, with Lifeguard, without it (the code before
//! issue 20) and Serf, counting who is declared down though nobody failed.
//!
//! `cargo bench --profile dev -p starling-tests --bench gossip [-- --write]`
//! (needs root for the namespaces and the cgroup, and `serf` on the PATH for
//! the comparison; `--write` puts the tables into BENCHMARKS.md §8).
//! Settings come from the environment:
//! - `STARLING_GOSSIP_SIZES` (default `3,10,50,200`): the cluster sizes;
//! - `STARLING_GOSSIP_ROUNDS` (default 5): digest publications per size;
//! - `STARLING_GOSSIP_FAILURES` (default 3 up to 10 members, 2 beyond): link
//!   cuts per size;
//! - `STARLING_GOSSIP_QUIET` (default 10): seconds of the bandwidth window;
//! - `STARLING_GOSSIP_ONLY` (`starling` or `serf`): run one side only;
//! - `STARLING_GOSSIP_STARVE` (default `10:3`): members and how many of them
//!   to starve (`0` skips it); `_STARVE_SECONDS` (60) how long;
//!   `_STARVE_CPU_MS` (`3,1`) the CPU they get each second, a run each.
//!
//! One member per namespace, all joining through member 0, the only seed.
//! Starling runs `starling-coordinator gossip-member` (SWIM by foca, timed
//! like memberlist's LAN profile); Serf runs `serf agent -profile=lan`. Both
//! seal their datagrams with the same 32-byte key. Every instant is taken
//! the same way for both: when a line of a member's output reaches this
//! process (a reader thread per stream).
//!
//! Prints Markdown tables for BENCHMARKS.md on stdout, progress on stderr.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use starling_tests::fabric::Fabric;

/// The UDP (and, for Serf, TCP) port every member gossips on, in its own namespace.
const PORT: u16 = 7946;
/// Serf's RPC address, on each namespace's own loopback.
const SERF_RPC: &str = "-rpc-addr=127.0.0.1:7373";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Starling,
    /// Starling's gossip without Lifeguard (`--no-lifeguard`): SWIM as foca
    /// runs it, the code before issue 20; measured under starvation only.
    StarlingClassic,
    Serf,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Starling => "Starling",
            Kind::StarlingClassic => "Starling without Lifeguard",
            Kind::Serf => "Serf",
        }
    }

    fn is_starling(self) -> bool {
        matches!(self, Kind::Starling | Kind::StarlingClassic)
    }
}

/// What a member reported, with the site (`mK`) as its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// Bound and listening.
    Ready,
    /// Member K is alive (joined or rejoined).
    Up(usize),
    /// Member K was declared down (failed or left).
    Down(usize),
    /// Member K is suspected (Starling: this member learnt of a suspicion;
    /// Serf: this member's own probe of K failed).
    Suspect(usize),
    /// A newer digest of member K arrived (Serf: K's tags changed; no version).
    Digest(usize, u64),
    /// This member published its own digest (Serf: applied its own new tags).
    Published(u64),
}

/// One line of interest from member `member`, and when it arrived.
struct Seen {
    member: usize,
    at: Instant,
    event: Event,
}

fn site_index(site: &str) -> Option<usize> {
    site.strip_prefix('m')?.parse().ok()
}

/// `{"event":"up","site":"m3"}` and the rest of the gossip member's lines.
fn parse_starling(line: &str) -> Option<Event> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let site = || value["site"].as_str().and_then(site_index);
    match value["event"].as_str()? {
        "ready" => Some(Event::Ready),
        "up" => Some(Event::Up(site()?)),
        "down" => Some(Event::Down(site()?)),
        "suspect" => Some(Event::Suspect(site()?)),
        "digest" => Some(Event::Digest(site()?, value["version"].as_u64()?)),
        "published" => Some(Event::Published(value["version"].as_u64()?)),
        _ => None,
    }
}

/// Serf's log lines, e.g. `2026/12/03 12:48:36 [INFO] serf: EventMemberJoin: m2 10.250.9.4`.
/// An agent logs its own join first, once its listeners are up: that is
/// its `Ready`.
fn parse_serf(line: &str, me: usize) -> Option<Event> {
    // memberlist: `[INFO] memberlist: Suspect m3 has failed, no acks received`.
    if let Some((_, rest)) = line.split_once("memberlist: Suspect ") {
        return Some(Event::Suspect(site_index(rest.split_whitespace().next()?)?));
    }
    let (_, rest) = line.split_once("serf: EventMember")?;
    let (what, rest) = rest.split_once(": ")?;
    let site = site_index(rest.split_whitespace().next()?)?;
    match what {
        "Join" if site == me => Some(Event::Ready),
        "Join" => Some(Event::Up(site)),
        "Failed" | "Leave" => Some(Event::Down(site)),
        "Update" if site == me => Some(Event::Published(0)),
        "Update" => Some(Event::Digest(site, 0)),
        _ => None,
    }
}

/// Reads `stream` line by line, stamps the lines of interest and keeps them
/// all in `log` for a post-mortem.
fn read_lines(
    stream: impl Read + Send + 'static,
    member: usize,
    kind: Kind,
    log: PathBuf,
    tx: mpsc::Sender<Seen>,
) {
    std::thread::spawn(move || {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .ok();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let at = Instant::now();
            let event = match kind {
                Kind::Starling | Kind::StarlingClassic => parse_starling(&line),
                Kind::Serf => parse_serf(&line, member),
            };
            if let Some(event) = event {
                if tx.send(Seen { member, at, event }).is_err() {
                    break;
                }
            }
            if let Some(file) = &mut file {
                let _ = writeln!(file, "{line}");
            }
        }
    });
}

/// The members of one implementation, one per namespace of the fabric,
/// killed on drop.
struct Cluster<'f> {
    kind: Kind,
    fabric: &'f Fabric,
    program: PathBuf,
    key: String,
    dir: tempfile::TempDir,
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    tx: mpsc::Sender<Seen>,
    rx: mpsc::Receiver<Seen>,
    /// Every event so far, per member.
    events: Vec<Vec<(Instant, Event)>>,
}

impl<'f> Cluster<'f> {
    fn new(kind: Kind, fabric: &'f Fabric, program: PathBuf, key: &str) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            kind,
            fabric,
            program,
            key: key.to_string(),
            dir: tempfile::tempdir().unwrap(),
            children: Vec::new(),
            stdins: Vec::new(),
            tx,
            rx,
            events: vec![Vec::new(); fabric.len()],
        }
    }

    fn addr(&self, i: usize) -> String {
        format!("{}:{PORT}", self.fabric.ip(i))
    }

    /// Starts member `i` (members start in order, 0 first).
    fn spawn(&mut self, i: usize) {
        let mut command = self.fabric.command(i, &self.program);
        let log = self.dir.path().join(format!("m{i}.log"));
        match self.kind {
            Kind::Starling | Kind::StarlingClassic => {
                command
                    .args(["gossip-member", "--site", &format!("m{i}")])
                    .args(["--bind", &self.addr(i), "--cluster-key", &self.key])
                    .env(
                        "RUST_LOG",
                        std::env::var("STARLING_GOSSIP_LOG").unwrap_or_else(|_| "info".into()),
                    );
                if self.kind == Kind::StarlingClassic {
                    command.arg("--no-lifeguard");
                }
                if i > 0 {
                    command.args(["--seed", &self.addr(0)]);
                }
            }
            Kind::Serf => {
                command
                    .arg("agent")
                    .arg(format!("-node=m{i}"))
                    .arg(format!("-bind={}", self.addr(i)))
                    .args([SERF_RPC, "-profile=lan", "-log-level=debug"])
                    .arg(format!("-encrypt={}", self.key))
                    .args(["-tag", "version=0"]);
                if i > 0 {
                    command.arg(format!("-join={}", self.addr(0)));
                }
            }
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?} member {i}: {e}", self.kind));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        read_lines(stdout, i, self.kind, log.clone(), self.tx.clone());
        // Serf logs to stdout and stderr alike; the gossip member's stderr
        // is its tracing log, kept for a post-mortem only.
        read_lines(stderr, i, self.kind, log, self.tx.clone());
        self.stdins.push(child.stdin.take());
        self.children.push(child);
    }

    fn drain(&mut self) {
        while let Ok(seen) = self.rx.try_recv() {
            self.events[seen.member].push((seen.at, seen.event));
        }
    }

    /// Waits until `check` finds what it looks for in the events, and
    /// returns what it found; `None` after `timeout`.
    fn wait_for<T>(&mut self, timeout: Duration, check: impl Fn(&Self) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain();
            if let Some(found) = check(self) {
                return Some(found);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.rx.recv_timeout(left) {
                Ok(seen) => self.events[seen.member].push((seen.at, seen.event)),
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
                Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("self holds a sender"),
            }
        }
    }

    /// When member `i` first reported an event that `matches`, at or after `since`.
    fn first(&self, i: usize, since: Instant, matches: impl Fn(&Event) -> bool) -> Option<Instant> {
        self.events[i]
            .iter()
            .find(|(at, event)| *at >= since && matches(event))
            .map(|(at, _)| *at)
    }

    /// When the last of `observers` first reported a matching event at or
    /// after `since`; `None` while one has not.
    fn all_saw(
        &self,
        observers: impl IntoIterator<Item = usize>,
        since: Instant,
        matches: impl Fn(&Event) -> bool + Copy,
    ) -> Option<Instant> {
        observers
            .into_iter()
            .map(|i| self.first(i, since, matches))
            .try_fold(since, |latest, at| Some(latest.max(at?)))
    }

    /// Member `i`'s view of member `j` now: alive after its last up, not after its last down.
    fn sees_alive(&self, i: usize, j: usize) -> bool {
        self.events[i]
            .iter()
            .rev()
            .find_map(|(_, event)| match event {
                Event::Up(k) if *k == j => Some(true),
                Event::Down(k) if *k == j => Some(false),
                _ => None,
            })
            .unwrap_or(false)
    }

    fn everyone_sees_everyone(&self) -> bool {
        let n = self.fabric.len();
        (0..n).all(|i| (0..n).all(|j| i == j || self.sees_alive(i, j)))
    }

    /// Starts member 0, waits until it listens, then starts the others and
    /// returns the time until every member saw every other one alive.
    fn start(&mut self) -> Option<Duration> {
        let n = self.fabric.len();
        self.spawn(0);
        let seed_ready = self.wait_for(Duration::from_secs(30), |c| {
            c.events[0]
                .iter()
                .any(|(_, e)| *e == Event::Ready)
                .then_some(())
        });
        assert!(
            seed_ready.is_some(),
            "{} member 0 did not start; see {}",
            self.kind.name(),
            self.keep_logs().display()
        );
        let t0 = Instant::now();
        for i in 1..n {
            self.spawn(i);
        }
        let converged = self.wait_for(Duration::from_secs(60), |c| {
            if !c.everyone_sees_everyone() {
                return None;
            }
            // The pair that took longest, to tell a slow member from a slow cluster.
            (0..n)
                .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
                .map(|(i, j)| Some((c.first(i, t0, |e| *e == Event::Up(j))?, i, j)))
                .try_fold((t0, 0, 0), |latest, seen| Some(latest.max(seen?)))
        });
        let (at, i, j) = converged?;
        if n > 2 {
            eprintln!(
                "gossip:   {} join: the last to see everyone was m{i}, which saw m{j} after {}",
                self.kind.name(),
                show(Some(at - t0))
            );
        }
        Some(at - t0)
    }

    /// Member 0 publishes a new digest (`round` names it for Serf); returns
    /// the time until every other member has seen it.
    fn publish(&mut self, round: u64) -> Option<Duration> {
        let n = self.fabric.len();
        let others = move || 1..n;
        match self.kind {
            Kind::Starling | Kind::StarlingClassic => {
                let before = Instant::now();
                let stdin = self.stdins[0].as_mut().unwrap();
                stdin.write_all(b"bump\n").unwrap();
                stdin.flush().unwrap();
                let t0 = Instant::now();
                let reached = self.wait_for(Duration::from_secs(30), |c| {
                    let (published, version) =
                        c.events[0].iter().rev().find_map(|(at, e)| match e {
                            Event::Published(v) if *at >= before => Some((*at, *v)),
                            _ => None,
                        })?;
                    let reached = c.all_saw(
                        others(),
                        before,
                        |e| matches!(e, Event::Digest(0, v) if *v >= version),
                    )?;
                    Some((published, reached))
                });
                if reached.is_none() {
                    let published = self.events[0].iter().find_map(|(at, e)| match e {
                        Event::Published(v) if *at >= before => Some(*v),
                        _ => None,
                    });
                    match published {
                        Some(version) => self.report_missing(
                            &format!("m0's digest {version}"),
                            others(),
                            before,
                            |e| matches!(e, Event::Digest(0, v) if *v >= version),
                        ),
                        None => eprintln!("gossip: m0 never said it published"),
                    }
                }
                reached.map(|(published, reached)| {
                    eprintln!(
                        "gossip:   Starling digest: published by m0 {:.1} ms after `bump`; \
                         all others had it {:.1} ms after",
                        ms(published.saturating_duration_since(t0)),
                        ms(reached.saturating_duration_since(t0))
                    );
                    reached.saturating_duration_since(t0)
                })
            }
            Kind::Serf => {
                let asked = Instant::now();
                let out = self
                    .fabric
                    .command(0, "serf")
                    .args(["tags", SERF_RPC, "-set", &format!("version={round}")])
                    .output()
                    .unwrap();
                // An agent too busy to answer its RPC (200 of them on two
                // cores) is a sample that timed out, not the end of the run.
                if !out.status.success() {
                    eprintln!(
                        "gossip:   Serf digest: `serf tags` failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    return None;
                }
                let returned = Instant::now();
                let reached = self.wait_for(Duration::from_secs(30), |c| {
                    let applied = c.first(0, asked, |e| *e == Event::Published(0))?;
                    let reached = c.all_saw(others(), asked, |e| *e == Event::Digest(0, 0))?;
                    Some((applied, reached))
                });
                // `serf tags` returns only once memberlist has sent the
                // change out (`UpdateNode` waits for its broadcast), so by
                // then it may have reached everyone: the clock starts when
                // member 0 applied the new tags (its own `EventMemberUpdate`
                // line), or when `serf tags` returned if that came first.
                // Starting it before `serf tags` ran would charge Serf the
                // start of a Go CLI, tens of milliseconds.
                if reached.is_none() {
                    self.report_missing("m0's new tags", others(), asked, |e| {
                        *e == Event::Digest(0, 0)
                    });
                }
                reached.map(|(applied, reached)| {
                    let t0 = applied.min(returned);
                    eprintln!(
                        "gossip:   Serf digest: tags applied by m0 {:.1} ms after `serf tags` \
                         started, which returned after {:.1} ms; all others had it {:.1} ms \
                         after it started",
                        ms(applied - asked),
                        ms(returned - asked),
                        ms(reached - asked)
                    );
                    reached.saturating_duration_since(t0)
                })
            }
        }
    }

    /// Cuts member `k`'s link; returns the time until every other member
    /// declared it down, then restores the link and returns the time until
    /// every other member saw it alive again.
    fn cut_and_restore(&mut self, k: usize) -> (Option<Duration>, Option<Duration>) {
        let n = self.fabric.len();
        let others = move || (0..n).filter(move |&i| i != k);
        let t0 = Instant::now();
        self.fabric.cut(k);
        let down = self.wait_for(Duration::from_secs(30), |c| {
            c.all_saw(others(), t0, |e| *e == Event::Down(k))
        });
        if down.is_none() {
            self.report_missing(&format!("m{k} down"), others(), t0, |e| {
                *e == Event::Down(k)
            });
        }
        // Events are taken from before the link comes back (a fast rejoin
        // may beat `restore`'s return) and timed from the return, when the
        // bridge forwards again.
        let restoring = Instant::now();
        self.fabric.restore(k);
        let t1 = Instant::now();
        // Serf's reconnect of failed members runs every 30 s, hence the wait.
        let up = self.wait_for(Duration::from_secs(75), |c| {
            c.all_saw(others(), restoring, |e| *e == Event::Up(k))
        });
        if up.is_none() {
            self.report_missing(&format!("m{k} alive again"), others(), restoring, |e| {
                *e == Event::Up(k)
            });
        }
        (
            down.map(|at| at - t0),
            up.map(|at| at.saturating_duration_since(t1)),
        )
    }

    /// Says on stderr which of `observers` reported no event that `matches`
    /// at or after `since`, and keeps the logs.
    fn report_missing(
        &self,
        what: &str,
        observers: impl IntoIterator<Item = usize>,
        since: Instant,
        matches: impl Fn(&Event) -> bool + Copy,
    ) {
        let observers: Vec<usize> = observers.into_iter().collect();
        let missing: Vec<String> = observers
            .iter()
            .filter(|&&i| self.first(i, since, matches).is_none())
            .map(|i| format!("m{i}"))
            .collect();
        eprintln!(
            "gossip: {} of {} {} members never reported {what}: {}; logs kept in {}",
            missing.len(),
            observers.len(),
            self.kind.name(),
            missing.join(", "),
            self.keep_logs().display()
        );
    }

    /// Keeps the members' logs past the run, for a post-mortem.
    fn keep_logs(&self) -> PathBuf {
        let kept = std::env::temp_dir().join(format!(
            "starling-gossip-bench-{}-{}",
            std::process::id(),
            self.kind.name()
        ));
        let _ = copy_dir(self.dir.path(), &kept);
        kept
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// A cgroup that holds processes to a share of one CPU (cgroup v1's `cpu`
/// controller, or v2's `cpu.max`): CPU starvation of a few members, the same
/// for every implementation. Its processes go back to the root group, and
/// the group is removed, on drop.
struct Starver {
    dir: PathBuf,
    root: PathBuf,
}

impl Starver {
    fn new(tag: &str, quota: Duration, period: Duration) -> Result<Self, String> {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let v2 = Path::new("/sys/fs/cgroup");
        let write = |path: PathBuf, value: String| {
            std::fs::write(&path, &value).map_err(|e| format!("{}: {e}", path.display()))
        };
        let (root, settings) = if v1.join("cpu.cfs_quota_us").exists() {
            (
                v1.to_path_buf(),
                vec![
                    ("cpu.cfs_period_us", period.as_micros().to_string()),
                    ("cpu.cfs_quota_us", quota.as_micros().to_string()),
                ],
            )
        } else if v2.join("cgroup.controllers").exists() {
            (
                v2.to_path_buf(),
                vec![(
                    "cpu.max",
                    format!("{} {}", quota.as_micros(), period.as_micros()),
                )],
            )
        } else {
            return Err("no cgroup cpu controller under /sys/fs/cgroup".into());
        };
        let dir = root.join(tag);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let starver = Starver { dir, root };
        for (file, value) in settings {
            write(starver.dir.join(file), value)?;
        }
        Ok(starver)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("starve process {pid}: {e}"));
    }
}

impl Drop for Starver {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// What members declared down while some were starved (none had failed).
#[derive(Default)]
struct Starved {
    /// Whether everyone saw everyone before the starvation.
    settled: bool,
    /// Healthy (not starved) members declared down by someone.
    healthy_down: usize,
    /// Starved members declared down by someone.
    starved_down: usize,
    /// Down declarations, observer by member.
    declarations: usize,
    /// Healthy members suspected by someone (refuted in time or not).
    healthy_suspected: usize,
    /// Starved members suspected by someone.
    starved_suspected: usize,
    /// Why there are no figures.
    skipped: Option<String>,
}

/// Starts `fabric.len()` members, starves members 1..=`starved` of CPU
/// (`quota` of every `period`) for `window`, and counts who was declared down.
fn starvation(
    kind: Kind,
    fabric: &Fabric,
    program: PathBuf,
    key: &str,
    starved: usize,
    window: Duration,
    quota: Duration,
) -> Starved {
    let n = fabric.len();
    let step = |what: &str| eprintln!("gossip: starvation, {n} members, {}: {what}", kind.name());
    let mut cluster = Cluster::new(kind, fabric, program, key);
    let join = cluster.start();
    step(&format!("joined in {}", show(join)));
    std::thread::sleep(Duration::from_secs(5));
    let settled = cluster
        .wait_for(Duration::from_secs(30), |c| {
            c.everyone_sees_everyone().then_some(())
        })
        .is_some();
    let tag = format!("starling-bench-{}-{kind:?}", std::process::id());
    let starver = match Starver::new(&tag, quota, Duration::from_secs(1)) {
        Ok(starver) => starver,
        Err(why) => {
            return Starved {
                skipped: Some(why),
                ..Starved::default()
            }
        }
    };
    for i in 1..=starved {
        starver.add(cluster.children[i].id());
    }
    let t0 = Instant::now();
    step(&format!(
        "members 1..={starved} held to {:.0} ms of CPU a second for {} s",
        ms(quota),
        window.as_secs()
    ));
    let _ = cluster.wait_for(window, |_| None::<()>);
    let t1 = Instant::now();
    drop(starver);
    cluster.drain();
    let mut declared = vec![false; n];
    let mut suspected = vec![false; n];
    let mut declarations = 0;
    for events in &cluster.events {
        for (at, event) in events {
            if *at < t0 || *at > t1 {
                continue;
            }
            match event {
                Event::Down(j) => {
                    declared[*j] = true;
                    declarations += 1;
                }
                Event::Suspect(j) => suspected[*j] = true,
                _ => {}
            }
        }
    }
    let split = |marks: &[bool]| {
        let starved = (1..=starved).filter(|&j| marks[j]).count();
        (marks.iter().filter(|&&m| m).count() - starved, starved)
    };
    let (healthy_down, starved_down) = split(&declared);
    let (healthy_suspected, starved_suspected) = split(&suspected);
    step(&format!(
        "{healthy_down} healthy and {starved_down} starved members declared down \
         ({declarations} declarations); {healthy_suspected} healthy and \
         {starved_suspected} starved suspected"
    ));
    if declarations > 0 {
        eprintln!("gossip: logs kept in {}", cluster.keep_logs().display());
    }
    Starved {
        settled,
        healthy_down,
        starved_down,
        declarations,
        healthy_suspected,
        starved_suspected,
        skipped: None,
    }
}

/// One implementation's figures at one size.
#[derive(Default)]
struct Figures {
    join: Option<Duration>,
    digest: Vec<Option<Duration>>,
    down: Vec<Option<Duration>>,
    rejoin: Vec<Option<Duration>>,
    bytes_per_member_second: Option<f64>,
    /// Why there are no figures.
    skipped: Option<String>,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn measure(
    kind: Kind,
    fabric: &Fabric,
    program: PathBuf,
    key: &str,
    rounds: usize,
    failures: usize,
    quiet: Duration,
) -> Figures {
    let n = fabric.len();
    let step = |what: &str| eprintln!("gossip: {n} members, {}: {what}", kind.name());
    let mut cluster = Cluster::new(kind, fabric, program, key);
    let mut figures = Figures {
        join: cluster.start(),
        ..Figures::default()
    };
    step(&format!("joined in {}", show(figures.join)));
    if figures.join.is_none() {
        // Go on: later steps wait for what they need, and the table says what was missed.
        eprintln!("gossip: logs kept in {}", cluster.keep_logs().display());
    }
    // Let the join's gossip die down before the first publication.
    std::thread::sleep(Duration::from_secs(2));

    for round in 1..=rounds {
        let sample = cluster.publish(round as u64);
        step(&format!(
            "digest {round}/{rounds} reached all in {}",
            show(sample)
        ));
        figures.digest.push(sample);
        // Spaced, so one publication's gossip does not carry the next.
        std::thread::sleep(Duration::from_millis(1500));
    }

    let before: Vec<(u64, u64)> = (0..n).map(|i| fabric.bytes(i)).collect();
    let started = Instant::now();
    std::thread::sleep(quiet);
    let sent: u64 = (0..n)
        .map(|i| fabric.bytes(i).0.saturating_sub(before[i].0))
        .sum();
    let seconds = started.elapsed().as_secs_f64();
    let rate = sent as f64 / n as f64 / seconds;
    figures.bytes_per_member_second = Some(rate);
    step(&format!(
        "quiet: {rate:.0} bytes/member/s over {seconds:.1} s"
    ));

    let k = n - 1;
    for cut in 1..=failures {
        let (down, up) = cluster.cut_and_restore(k);
        step(&format!(
            "cut {cut}/{failures}: m{k} down for all in {}, alive again in {}",
            show(down),
            show(up)
        ));
        figures.down.push(down);
        figures.rejoin.push(up);
        // Back to a cluster where everyone sees everyone (the cut member
        // too), so the next cut starts from the same state.
        let settled = cluster.wait_for(Duration::from_secs(30), |c| {
            c.everyone_sees_everyone().then_some(())
        });
        if settled.is_none() {
            step("did not settle after the rejoin");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    figures
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn show(d: Option<Duration>) -> String {
    match d {
        Some(d) if d < Duration::from_secs(1) => format!("{:.0} ms", ms(d)),
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
        None => "timeout".into(),
    }
}

/// `median / max` of the samples that did not time out (the median of two
/// is their mean), with the count of timeouts when any.
fn summary(samples: &[Option<Duration>]) -> String {
    let mut got: Vec<Duration> = samples.iter().flatten().copied().collect();
    if got.is_empty() {
        return if samples.is_empty() {
            "–".into()
        } else {
            "timeout".into()
        };
    }
    got.sort();
    let middle = got.len() / 2;
    let median = if got.len().is_multiple_of(2) {
        (got[middle - 1] + got[middle]) / 2
    } else {
        got[middle]
    };
    let max = got[got.len() - 1];
    let missed = samples.len() - got.len();
    let mut text = if max < Duration::from_secs(1) {
        format!("{:.0} / {:.0} ms", ms(median), ms(max))
    } else {
        format!("{:.2} / {:.2} s", median.as_secs_f64(), max.as_secs_f64())
    };
    if missed > 0 {
        text.push_str(&format!(" ({missed} timed out)"));
    }
    text
}

/// The gossip member's binary, when the coordinator has the subcommand.
/// `STARLING_GOSSIP_PROGRAM` names another build of it (an optimised one:
/// the dev build's members need several times the CPU).
fn starling_program() -> Result<PathBuf, String> {
    let program = match std::env::var_os("STARLING_GOSSIP_PROGRAM") {
        Some(program) => PathBuf::from(program),
        None => std::panic::catch_unwind(|| starling_tests::binary("starling-coordinator"))
            .map_err(|_| "the workspace did not build".to_string())?,
    };
    eprintln!("gossip: Starling's members run {}", program.display());
    let help = Command::new(&program)
        .args(["gossip-member", "--help"])
        .output()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if help.status.success() {
        Ok(program)
    } else {
        Err("starling-coordinator has no gossip-member subcommand".into())
    }
}

fn serf_program() -> Result<PathBuf, String> {
    let out = Command::new("serf")
        .arg("version")
        .output()
        .map_err(|e| format!("serf is not installed ({e})"))?;
    let version = String::from_utf8_lossy(&out.stdout);
    eprintln!("gossip: {}", version.lines().next().unwrap_or("serf"));
    Ok(PathBuf::from("serf"))
}

fn main() {
    assert!(Fabric::available(), "needs root and iproute2");
    let write = std::env::args().any(|a| a == "--write");
    let sizes: Vec<usize> = std::env::var("STARLING_GOSSIP_SIZES")
        .unwrap_or_else(|_| "3,10,50,200".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&n| n >= 2)
        .collect();
    let rounds = env_usize("STARLING_GOSSIP_ROUNDS", 5);
    let quiet = Duration::from_secs(env_usize("STARLING_GOSSIP_QUIET", 10) as u64);
    let only = std::env::var("STARLING_GOSSIP_ONLY").unwrap_or_default();
    // `members:starved`; empty or 0 skips the starvation run.
    let starve = std::env::var("STARLING_GOSSIP_STARVE").unwrap_or_else(|_| "10:3".into());
    let starve: Option<(usize, usize)> = starve
        .split_once(':')
        .and_then(|(n, k)| Some((n.trim().parse().ok()?, k.trim().parse().ok()?)))
        .filter(|&(n, k)| n >= 2 && k >= 1 && k < n);
    let starve_window = Duration::from_secs(env_usize("STARLING_GOSSIP_STARVE_SECONDS", 60) as u64);
    // The CPU each starved member gets per second, one run per level.
    let starve_cpu: Vec<Duration> = std::env::var("STARLING_GOSSIP_STARVE_CPU_MS")
        .unwrap_or_else(|_| "3,1".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .collect();
    let mut kinds = vec![Kind::Starling, Kind::StarlingClassic, Kind::Serf];
    kinds.retain(|k| {
        only.is_empty()
            || k.name().eq_ignore_ascii_case(&only)
            || (k.is_starling() && only.eq_ignore_ascii_case("starling"))
    });

    // One key for both: 32 random bytes in standard base64, as `serf keygen` makes.
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .unwrap();
    let key = base64::engine::general_purpose::STANDARD.encode(bytes);

    let programs: Vec<(Kind, Result<PathBuf, String>)> = kinds
        .iter()
        .map(|&kind| {
            let program = match kind {
                Kind::Starling | Kind::StarlingClassic => starling_program(),
                Kind::Serf => serf_program(),
            };
            if let Err(why) = &program {
                eprintln!("gossip: skipping {}: {why}", kind.name());
            }
            (kind, program)
        })
        .collect();

    let started = Instant::now();
    let mut rows = Vec::new();
    for &n in &sizes {
        let failures = env_usize("STARLING_GOSSIP_FAILURES", if n <= 10 { 3 } else { 2 });
        let fabric = Fabric::create(n).unwrap();
        eprintln!(
            "gossip: fabric of {n} namespaces on {}/{}",
            fabric.host_ip(),
            if n > 250 { 16 } else { 24 }
        );
        let mut by_kind = Vec::new();
        for (kind, program) in &programs {
            if *kind == Kind::StarlingClassic {
                continue;
            }
            let figures = match program {
                Ok(program) => measure(
                    *kind,
                    &fabric,
                    program.clone(),
                    &key,
                    rounds,
                    failures,
                    quiet,
                ),
                Err(why) => Figures {
                    skipped: Some(why.clone()),
                    ..Figures::default()
                },
            };
            by_kind.push((*kind, figures));
        }
        rows.push((n, by_kind));
    }

    let mut starved_rows = Vec::new();
    if let Some((n, starved)) = starve {
        let fabric = Fabric::create(n).unwrap();
        for &cpu in &starve_cpu {
            for (kind, program) in &programs {
                let figures = match program {
                    Ok(program) => starvation(
                        *kind,
                        &fabric,
                        program.clone(),
                        &key,
                        starved,
                        starve_window,
                        cpu,
                    ),
                    Err(why) => Starved {
                        skipped: Some(why.clone()),
                        ..Starved::default()
                    },
                };
                starved_rows.push((cpu, *kind, figures));
            }
        }
    }

    let cell = |figures: Option<&Figures>, f: &dyn Fn(&Figures) -> String| match figures {
        Some(figures) if figures.skipped.is_none() => f(figures),
        _ => "n/a".into(),
    };
    let mut table = String::from(
        "| members | digest to all, Starling (median / max) | Serf | down for all, Starling | Serf \
         | alive again for all, Starling | Serf | bytes/member/s, Starling | Serf \
         | join, Starling | Serf |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (n, by_kind) in &rows {
        let of = |kind: Kind| by_kind.iter().find(|(k, _)| *k == kind).map(|(_, f)| f);
        let (starling, serf) = (of(Kind::Starling), of(Kind::Serf));
        let digest = |f: &Figures| summary(&f.digest);
        let down = |f: &Figures| summary(&f.down);
        let rejoin = |f: &Figures| summary(&f.rejoin);
        let bytes = |f: &Figures| {
            f.bytes_per_member_second
                .map(|b| format!("{b:.0}"))
                .unwrap_or_else(|| "–".into())
        };
        let join = |f: &Figures| show(f.join);
        table.push_str(&format!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(starling, &digest),
            cell(serf, &digest),
            cell(starling, &down),
            cell(serf, &down),
            cell(starling, &rejoin),
            cell(serf, &rejoin),
            cell(starling, &bytes),
            cell(serf, &bytes),
            cell(starling, &join),
            cell(serf, &join),
        ));
    }
    table.push_str(&format!(
        "\n{rounds} digest publications per size (member 0 to all others); the last member's \
         link cut {} times per size (`STARLING_GOSSIP_FAILURES`); a {} s quiet window for the \
         bytes (Ethernet frames sent by the members, over the number of members and seconds); \
         {:.0} s in all.",
        std::env::var("STARLING_GOSSIP_FAILURES")
            .unwrap_or_else(|_| "3 (2 above 10 members)".into()),
        quiet.as_secs(),
        started.elapsed().as_secs_f64()
    ));
    for (kind, program) in &programs {
        if let Err(why) = program {
            table.push_str(&format!("\n{} not measured: {why}.", kind.name()));
        }
    }
    println!("{table}");

    let mut starved_table = String::new();
    if let Some((n, starved)) = starve {
        starved_table.push_str(
            "| CPU a second | implementation | healthy members declared down \
             | starved members declared down | down declarations (observer × member) \
             | healthy members suspected | starved members suspected \
             | all saw all before |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for (cpu, kind, figures) in &starved_rows {
            let cpu = format!("{} ms", cpu.as_millis());
            match &figures.skipped {
                Some(why) => starved_table.push_str(&format!(
                    "| {cpu} | {} | n/a | n/a | n/a | n/a | n/a | not measured: {why} |\n",
                    kind.name()
                )),
                None => starved_table.push_str(&format!(
                    "| {cpu} | {} | {} of {} | {} of {starved} | {} | {} of {} | {} of {starved} | {} |\n",
                    kind.name(),
                    figures.healthy_down,
                    n - starved,
                    figures.starved_down,
                    figures.declarations,
                    figures.healthy_suspected,
                    n - starved,
                    figures.starved_suspected,
                    if figures.settled { "yes" } else { "no" },
                )),
            }
        }
        starved_table.push_str(&format!(
            "\n{n} members; members 1 to {starved} held by a cgroup quota to the CPU \
             shown each second for {} s; nobody failed, so every member declared down is a \
             false positive, and every healthy member suspected a near miss (Starling: \
             some member learnt of a suspicion; Serf: some member's own probe failed, \
             memberlist's `Suspect mK has failed`).",
            starve_window.as_secs()
        ));
        println!("\n{starved_table}");
    }
    if write {
        starling_tests::write_bench_table("gossip", &table);
        if !starved_table.is_empty() {
            starling_tests::write_bench_table("gossip-starvation", &starved_table);
        }
    }
}

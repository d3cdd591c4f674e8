//! What a coordinator tells the other sites of its federation about its own:
//! the site digest it gossips. One coordinator serves one site (its broker,
//! its agents); peers read each other's digests to decide where work that
//! cannot meet its deadline at home should go.
//!
//! A digest travels inside one gossip datagram, so it is small and bounded:
//! [`MAX_DIGEST_BYTES`] encoded, a handful of classes and power bands, and at
//! most [`MAX_DIGEST_ARTIFACTS`] artifact digests. Decoding goes through the
//! same checked codec as every other message.

use heapless::{String, Vec};
use serde::{Deserialize, Serialize};

use crate::ids::{Digest, NodeId};

/// A site's name: the same alphabet and length as a node id.
pub type SiteId = NodeId;

/// Most bytes an encoded digest may take. One gossip broadcast carries at
/// most 1170 bytes beside the largest gossip header in a 1400-byte sealed
/// datagram; a digest travels signed by its site, with the site's
/// certificate (at most 245 bytes more: the coordinator's
/// `federation::identity::digest`), so the digest itself gets 925.
pub const MAX_DIGEST_BYTES: usize = 925;
/// Longest REST base URL a digest carries.
pub const DIGEST_URL_LEN: usize = 128;
/// Most task classes a digest describes.
pub const MAX_SITE_CLASSES: usize = 3;
/// Most power bands a digest describes.
pub const MAX_POWER_BANDS: usize = 4;
/// Most artifact digests a site advertises (its most recently used): five
/// hex digests, so that the largest digest fits [`MAX_DIGEST_BYTES`].
pub const MAX_DIGEST_ARTIFACTS: usize = 5;

/// The kind of work a capacity figure is for; mirrors the placement engine's
/// task classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkClass {
    /// CPU-bound work.
    Cpu,
    /// Work that wants an OpenCL device.
    Gpu,
    /// I/O-bound work.
    Io,
}

/// Free capacity of one task class at a site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassCapacity {
    /// The class.
    pub class: WorkClass,
    /// Task slots free now on online nodes that can run the class.
    pub free_slots: u16,
    /// Speed of the fastest such node with a free slot (of the fastest such
    /// node when none is free: it runs the work after the wait), at its top
    /// power level, in reference-core units (work seconds per second).
    pub speed: f32,
    /// Estimated wait for a slot when none is free, milliseconds.
    pub wait_ms: u32,
}

/// Free capacity within a power budget: slots on nodes whose lowest power
/// level draws at most `max_watts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerBand {
    /// The budget, watts.
    pub max_watts: f32,
    /// Free slots on nodes that can run within it.
    pub free_slots: u16,
}

/// A site's state as its coordinator gossips it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteDigest {
    /// Protocol version.
    pub v: u16,
    /// The site's name.
    pub site: SiteId,
    /// Increases with every digest the site publishes, across restarts (the
    /// publisher's wall clock in milliseconds, bumped past the previous one),
    /// so a peer keeps the newest and drops stale copies still in flight.
    pub version: u64,
    /// Base URL of the site coordinator's REST API, where peers forward work.
    pub api_url: String<DIGEST_URL_LEN>,
    /// Nodes online.
    pub nodes: u16,
    /// Free capacity per task class.
    pub classes: Vec<ClassCapacity, MAX_SITE_CLASSES>,
    /// Free capacity per power budget, smallest budget first.
    pub power: Vec<PowerBand, MAX_POWER_BANDS>,
    /// Tasks waiting in its queue.
    pub pending: u32,
    /// Tasks out on its nodes.
    pub running: u32,
    /// Smallest deadline slack among its waiting tasks, milliseconds
    /// (negative: already late); `None` when nothing waits.
    pub slack_ms: Option<i64>,
    /// Power its busy nodes draw now, estimated, watts.
    pub watts: f32,
    /// Artifacts it holds, most recently used first.
    pub artifacts: Vec<Digest, MAX_DIGEST_ARTIFACTS>,
}

impl SiteDigest {
    /// Free capacity of `class`, when the digest describes it.
    pub fn class(&self, class: WorkClass) -> Option<&ClassCapacity> {
        self.classes.iter().find(|c| c.class == class)
    }

    /// Whether the site says it holds `artifact`.
    pub fn holds(&self, artifact: &Digest) -> bool {
        self.artifacts.contains(artifact)
    }

    /// What is wrong with the figures, if anything (non-finite or negative
    /// numbers, a version of 0).
    pub fn problems(&self) -> Option<alloc::string::String> {
        if self.version == 0 {
            return Some("digest version 0; versions start at 1".into());
        }
        let finite = |x: f32| x.is_finite() && x >= 0.0;
        if !finite(self.watts) {
            return Some(alloc::format!(
                "watts {} is not a finite, non-negative number",
                self.watts
            ));
        }
        for class in &self.classes {
            if !finite(class.speed) {
                return Some(alloc::format!(
                    "speed {} of class {:?} is not a finite, non-negative number",
                    class.speed,
                    class.class
                ));
            }
        }
        for band in &self.power {
            if !finite(band.max_watts) {
                return Some(alloc::format!(
                    "power band {} W is not a finite, non-negative number",
                    band.max_watts
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::{decode, encode, DecodeError, PROTOCOL_VERSION};

    /// A digest with every bounded field full and the longest values.
    fn largest() -> SiteDigest {
        let name = "s".repeat(crate::limits::NODE_ID_LEN);
        let url = "h".repeat(DIGEST_URL_LEN);
        let mut classes = Vec::new();
        for class in [WorkClass::Cpu, WorkClass::Gpu, WorkClass::Io] {
            classes
                .push(ClassCapacity {
                    class,
                    free_slots: u16::MAX,
                    speed: f32::MAX,
                    wait_ms: u32::MAX,
                })
                .unwrap();
        }
        let mut power = Vec::new();
        for _ in 0..MAX_POWER_BANDS {
            power
                .push(PowerBand {
                    max_watts: f32::MAX,
                    free_slots: u16::MAX,
                })
                .unwrap();
        }
        let mut artifacts = Vec::new();
        for i in 0..MAX_DIGEST_ARTIFACTS {
            artifacts.push(Digest([i as u8 | 0x80; 32])).unwrap();
        }
        SiteDigest {
            v: PROTOCOL_VERSION,
            site: SiteId::new(&name).unwrap(),
            version: u64::MAX,
            api_url: String::try_from(url.as_str()).unwrap(),
            nodes: u16::MAX,
            classes,
            power,
            pending: u32::MAX,
            running: u32::MAX,
            slack_ms: Some(i64::MIN),
            watts: f32::MAX,
            artifacts,
        }
    }

    #[test]
    fn the_largest_digest_fits_its_bound_and_round_trips() {
        let digest = largest();
        let bytes = encode(&digest).unwrap();
        assert!(
            bytes.len() <= MAX_DIGEST_BYTES,
            "{} bytes > {MAX_DIGEST_BYTES}",
            bytes.len()
        );
        assert_eq!(decode::<SiteDigest>(&bytes).unwrap(), digest);
        assert!(digest.holds(&Digest([0x80; 32])));
        assert_eq!(digest.class(WorkClass::Gpu).unwrap().wait_ms, u32::MAX);
    }

    #[test]
    fn non_finite_figures_and_version_zero_are_refused() {
        let mut digest = largest();
        digest.watts = f32::NAN;
        assert!(encode(&digest).is_err());
        let mut digest = largest();
        digest.classes[0].speed = -1.0;
        let bytes = serde_cbor::to_vec(&digest).unwrap();
        assert!(matches!(
            decode::<SiteDigest>(&bytes),
            Err(DecodeError::Invalid { .. })
        ));
        let mut digest = largest();
        digest.version = 0;
        assert!(encode(&digest).is_err());
    }
}

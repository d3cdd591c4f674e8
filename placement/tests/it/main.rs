//! The placement crate's integration tests, one binary: each module was its own
//! test binary before, and every binary links the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod properties;
mod purity;
mod scenarios;

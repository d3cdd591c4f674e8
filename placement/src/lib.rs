//! Starling placement engine.

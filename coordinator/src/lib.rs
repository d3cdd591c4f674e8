//! Starling coordinator.

//! Starling agent.

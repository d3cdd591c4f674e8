//! The console's pages, one file per resource: each handler reads through
//! the same functions as the REST handler for that resource and renders
//! HTML with maud (which escapes every value it interpolates).

pub(crate) mod access;
pub(crate) mod catalog;
pub(crate) mod fleet;
pub(crate) mod login;
pub(crate) mod node;
pub(crate) mod task;
pub(crate) mod tasks;

//! `snapdrain report PLAN`: what happened to a plan, for a change record or an incident review.
//!
//! - [`model`]: the report's inputs (the plan, its Events, its Velero Backups, the simulator's audit log).
//! - [`timeline`]: pure: the inputs as bars and marks on one time axis.
//! - [`html`]: pure: one self-contained HTML page (inline CSS and SVG, nothing fetched).
//! - [`markdown`]: pure: the same for pasting into a change record.
//! - [`tables`]: pure: the rows both renderers show.
//! - [`gather`]: the only I/O: reading the inputs from a cluster.

pub mod gather;
pub mod html;
pub mod markdown;
pub mod model;
pub mod summary;
pub mod tables;
pub mod timeline;

pub use gather::{GatherError, gather};
pub use html::render_html;
pub use markdown::render_markdown;
pub use model::ReportData;

//! Logs and metrics.

mod logging;
pub mod metrics;

pub use logging::{init_logging, init_logging_with_default};
pub use metrics::Metrics;

//! Logs and metrics.

mod logging;
pub mod metrics;

pub use logging::init_logging;
pub use metrics::Metrics;

//! Logs, metrics and notifications.

mod logging;
pub mod metrics;
pub mod notify;

pub use logging::{init_logging, init_logging_with_default};
pub use metrics::Metrics;
pub use notify::{Notification, Notifier};

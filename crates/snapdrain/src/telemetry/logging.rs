//! JSON logs through tracing, filtered by `RUST_LOG` (default `info`), on stderr so stdout stays free for
//! command output.

use tracing_subscriber::EnvFilter;

pub fn init_logging() {
    init_logging_with_default("info");
}

/// Like [`init_logging`], with another filter when `RUST_LOG` is unset (the demo keeps stderr quiet so its
/// own output reads well).
pub fn init_logging_with_default(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

//! JSON logs through tracing, filtered by `RUST_LOG` (default `info`), on stderr so stdout stays free for
//! command output.

use tracing::{Level, Metadata};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Crates whose DEBUG and TRACE events carry secrets: aws-sigv4 logs the request it signs with its
/// header values (`http_request/sign.rs`, `trace!(request = ?request)`), among them an SSE-C key, and
/// aws-smithy-runtime logs requests and responses. They stay at INFO whatever `RUST_LOG` asks.
const SECRET_BEARING: &[&str] = &["aws_sigv4", "aws_smithy_runtime"];

pub fn init_logging() {
    init_logging_with_default("info");
}

/// Like [`init_logging`], with another filter when `RUST_LOG` is unset (the demo keeps stderr quiet so its
/// own output reads well).
pub fn init_logging_with_default(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let layer = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(std::io::stderr)
        .with_filter(filter)
        .with_filter(filter_fn(|meta: &Metadata<'_>| {
            allowed(meta.target(), *meta.level())
        }));
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// False for DEBUG and TRACE events of [`SECRET_BEARING`] crates and their modules.
fn allowed(target: &str, level: Level) -> bool {
    let secret_bearing = SECRET_BEARING.iter().any(|c| {
        target == *c
            || target
                .strip_prefix(c)
                .is_some_and(|rest| rest.starts_with("::"))
    });
    !secret_bearing || level <= Level::INFO
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_signing_and_request_logs_stop_at_info() {
        for target in [
            "aws_sigv4",
            "aws_sigv4::http_request::sign",
            "aws_smithy_runtime::client",
        ] {
            assert!(!allowed(target, Level::TRACE), "{target}");
            assert!(!allowed(target, Level::DEBUG), "{target}");
            assert!(allowed(target, Level::INFO), "{target}");
            assert!(allowed(target, Level::WARN), "{target}");
        }
        for target in ["snapdrain::backup", "aws_sigv4x", "aws_smithy_runtime_api"] {
            assert!(allowed(target, Level::TRACE), "{target}");
        }
    }
}

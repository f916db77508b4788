//! How the binary was called: as `snapdrain`, or by kubectl as the plugin `kubectl-snapdrain` (kubectl
//! runs `kubectl-<name>` found on PATH with the path as argv[0]), so help and hints say `kubectl snapdrain`.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::OnceLock;

static PROGRAM: OnceLock<String> = OnceLock::new();

/// The name to show for an argv[0].
pub fn program_name(argv0: &OsStr) -> &'static str {
    let file = Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("snapdrain");
    // kubectl-snapdrain, and kubectl_snapdrain (kubectl maps `-` in a plugin command to `_` too).
    if file.starts_with("kubectl-") || file.starts_with("kubectl_") {
        "kubectl snapdrain"
    } else {
        "snapdrain"
    }
}

/// Remembers the program name for hints ("follow it with `kubectl snapdrain status x`").
pub fn set_program(name: &str) {
    // Set once at start-up; a second call (tests) keeps the first name.
    let _ = PROGRAM.set(name.to_string());
}

pub fn program() -> String {
    PROGRAM
        .get()
        .cloned()
        .unwrap_or_else(|| "snapdrain".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_plugin_names_are_recognised() {
        assert_eq!(
            program_name(OsStr::new("/usr/local/bin/kubectl-snapdrain")),
            "kubectl snapdrain"
        );
        assert_eq!(
            program_name(OsStr::new("kubectl_snapdrain")),
            "kubectl snapdrain"
        );
        assert_eq!(
            program_name(OsStr::new("./target/debug/snapdrain")),
            "snapdrain"
        );
        assert_eq!(program_name(OsStr::new("")), "snapdrain");
    }
}

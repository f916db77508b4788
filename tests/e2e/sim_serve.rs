//! `snapdrain sim serve` as a user starts it: one JSON line names every endpoint, and the AWS config
//! file it writes lets an AWS SDK reach the simulated S3 and EC2 with nothing else configured.

use std::process::Stdio;

use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use serde_json::Value;
use snapdrain_testkit::WAIT;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sim_serve_prints_every_endpoint_and_writes_a_working_aws_profile() {
    let dir = tempfile::tempdir().expect("temp dir");
    let aws_file = dir.path().join("aws-config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_snapdrain"))
        .args(["sim", "serve", "--scenario", "quickstart", "--kubeconfig"])
        .arg(dir.path().join("kubeconfig"))
        .arg("--aws-config")
        .arg(&aws_file)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("snapdrain runs");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("sim serve prints its endpoints")
        .expect("stdout reads")
        .expect("a line");
    let endpoints: Value = serde_json::from_str(&line).expect("one JSON line");
    for key in [
        "apiserver",
        "kubeconfig",
        "ca",
        "audit",
        "faults",
        "awsConfig",
    ] {
        assert!(endpoints[key].is_string(), "{key} missing: {line}");
    }
    // The control surface is HTTPS with the CA written beside the kubeconfig, which names it too.
    let ca = std::fs::read_to_string(endpoints["ca"].as_str().expect("the CA's path"))
        .expect("the CA file");
    let kubeconfig = std::fs::read_to_string(endpoints["kubeconfig"].as_str().expect("a path"))
        .expect("the kubeconfig");
    assert!(
        kubeconfig.contains("certificate-authority-data: "),
        "{kubeconfig}"
    );
    assert!(
        !kubeconfig.contains("insecure-skip-tls-verify"),
        "{kubeconfig}"
    );
    let audit = snapdrain_testkit::trusting(&ca)
        .timeout(WAIT)
        .build()
        .expect("an HTTPS client")
        .get(endpoints["audit"].as_str().expect("the audit URL"))
        .send()
        .await
        .expect("the audit log over HTTPS, trusting the written CA");
    assert!(audit.status().is_success(), "{}", audit.status());
    assert_eq!(
        endpoints["s3"]["buckets"],
        serde_json::json!(["velero"]),
        "{line}"
    );
    assert!(endpoints["s3"]["endpoint"].is_string(), "{line}");
    assert!(endpoints["ec2"]["endpoint"].is_string(), "{line}");

    // Only the written profile: no keys, region or endpoint from the environment or the test.
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .profile_files(
            EnvConfigFiles::builder()
                .with_file(EnvConfigFileKind::Config, &aws_file)
                .build(),
        )
        .profile_name(endpoints["awsProfile"].as_str().expect("profile name"))
        .load()
        .await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    );
    let listed = s3
        .list_objects_v2()
        .bucket("velero")
        .send()
        .await
        .expect("the simulated S3 answers with the profile's endpoint and keys");
    assert!(listed.contents().iter().all(|o| o.key().is_some()));
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let described = ec2
        .describe_instances()
        .send()
        .await
        .expect("the simulated EC2 answers with the profile's endpoint");
    let instances: usize = described
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    assert_eq!(instances, 6, "the quickstart scenario's six nodes");
    child.kill().await.expect("stop sim serve");
}

/// The README's path for a new user: `snapdrain sim serve`, then `kubectl apply -k` the kustomize base
/// (and the default policy) with the kubeconfig it wrote; the Deployment rolls out on the simulated
/// nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_kustomize_base_installs_on_sim_serve_with_kubectl_apply_k() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_snapdrain"))
        .args(["sim", "serve", "--scenario", "quickstart", "--kubeconfig"])
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("snapdrain runs");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("sim serve prints its endpoints")
        .expect("stdout reads")
        .expect("a line");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let kubectl = |args: Vec<String>| {
        let kubeconfig = kubeconfig.clone();
        let home = dir.path().to_path_buf();
        async move {
            let out = Command::new("kubectl")
                .args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env("HOME", &home)
                .stdin(Stdio::null())
                .output();
            let out = tokio::time::timeout(WAIT, out)
                .await
                .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in {WAIT:?}"))
                .expect("kubectl runs");
            assert!(
                out.status.success(),
                "kubectl {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).to_string()
        }
    };
    for dir in ["deploy/kustomize/base", "deploy/kustomize/policy"] {
        let path = root.join(dir).display().to_string();
        kubectl(vec!["apply".into(), "-k".into(), path]).await;
    }
    let rolled = kubectl(
        [
            "rollout",
            "status",
            "deployment/snapdrain",
            "-n",
            "snapdrain",
            "--timeout=60s",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(rolled.contains("successfully rolled out"), "{rolled}");
    let policy = kubectl(
        ["get", "disruptionpolicy", "default", "-o", "name"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert_eq!(policy.trim(), "disruptionpolicy.snapdrain.io/default");
    child.kill().await.expect("stop sim serve");
}

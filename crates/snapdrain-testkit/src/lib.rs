//! What the tests share: an in-process simulated cluster with the controller beside it ([`harness`]),
//! kubectl pointed at it ([`kubectl`]), eviction and admission fixtures ([`eviction`], [`webhook`]), the
//! safety oracle ([`safety`]) and waiting on a condition with a deadline ([`eventually`]).
//!
//! Helpers panic with a message on failure: they run inside tests, where a panic is the failure report.

pub mod chaos;
pub mod eviction;
pub mod gate;
pub mod harness;
pub mod karpenter;
pub mod kubectl;
pub mod safety;
pub mod volumes;
pub mod webhook;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use snapdrain_sim::world::Timings;
use snapdrain_sim::{SimCluster, SimConfig};

pub use harness::{Harness, fast_timings};
pub use kubectl::{Kubectl, Running};

/// How long any single wait in the tests may take before it counts as a failure.
pub const WAIT: Duration = Duration::from_secs(20);

/// A file under the shared test data (real upstream CRDs and examples).
pub fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(path)
}

/// A simulated API server with no world controllers.
pub async fn start_cluster() -> SimCluster {
    SimCluster::start(SimConfig::default())
        .await
        .expect("simulated cluster starts")
}

/// A kube-rs client for a simulated cluster.
pub fn client(cluster: &SimCluster) -> kube::Client {
    kube::Client::try_from(cluster.kube_config()).expect("a client for the simulator")
}

/// A built-in scenario with its world running at `timings`, and a client for it.
pub async fn start_scenario(name: &str, timings: Timings) -> (SimCluster, kube::Client) {
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(snapdrain_sim::ScenarioSource::Named(name.into())),
        timings: Some(timings),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("scenario {name} loads: {e}"));
    let client = client(&cluster);
    (cluster, client)
}

/// Logs of the code under test go to libtest's captured output: shown when a test fails, or always with
/// `--nocapture`; `RUST_LOG` sets the filter (default `info`).
pub fn capture_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second call (another test in the same binary) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Controller settings for a simulated cluster: its EC2 endpoint and region, static credentials, and the
/// cluster settings a Bottlerocket replacement needs to join. `None` when the cluster runs no world (and
/// so no EC2 endpoint). The simulator answers quickly, so waits are short.
pub fn controller_settings(
    cluster: &SimCluster,
    identity: &str,
) -> Option<snapdrain::controller::Settings> {
    let ec2 = cluster.ec2.as_ref()?;
    let join = snapdrain_sim::cluster::cluster_join(&cluster.url(), cluster.ca_pem());
    // The estimate against a deadline uses the simulated Velero's own rate, as a deployment sets its
    // measured one.
    let timings = cluster
        .context
        .as_ref()
        .map(|c| c.timings.clone())
        .unwrap_or_default();
    Some(snapdrain::controller::Settings {
        identity: identity.into(),
        ec2_endpoint: Some(ec2.endpoint()),
        region: Some(ec2.config().region.clone()),
        ec2_credentials: Some(("sim".into(), "sim".into())),
        cluster_name: Some(join.cluster_name),
        api_server: Some(join.api_server),
        cluster_certificate: Some(join.cluster_certificate),
        wait_slice: Duration::from_secs(5),
        backup_retry_cap: Duration::from_millis(300),
        capacity_retry_base: Duration::from_millis(200),
        notification_retry_base: Duration::from_millis(100),
        notification_url_recheck: Duration::from_millis(500),
        namespace: "snapdrain".into(),
        aws: Some(own_aws_config(cluster)),
        velero_credentials_secret: None,
        status_budget: snapdrain::planning::status_size::DEFAULT_BUDGET,
        velero_mib_per_second: timings.backup_mib_per_second,
        velero_overhead: timings.backup_overhead,
    })
}

/// snapdrain's own IAM role in the simulated account (what IRSA would give its service account).
pub const SNAPDRAIN_ROLE_ARN: &str = "arn:aws:iam::111122223333:role/snapdrain";

/// snapdrain's own AWS configuration in the simulated cluster: the keys STS would hand its IAM role
/// ([`SNAPDRAIN_ROLE_ARN`]), region us-east-1, and the simulated S3 endpoint standing for AWS S3 (as
/// `AWS_ENDPOINT_URL_S3` would). The role may use the bucket only once a test grants it.
pub fn own_aws_config(cluster: &SimCluster) -> aws_config::SdkConfig {
    let (ak, sk) = snapdrain_sim::sts::role_credentials(SNAPDRAIN_ROLE_ARN);
    let creds = aws_credential_types::Credentials::new(ak, sk, None, None, "snapdrain-irsa");
    let mut b = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(creds),
        );
    if let Some(s3) = &cluster.s3 {
        b = b.endpoint_url(s3.endpoint());
    }
    b.build()
}

/// Polls `check` until it returns Some, failing the test after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, check).await
}

/// Polls `check` every 50 ms until it returns Some, failing the test after `limit` (for the slow worlds:
/// a whole scenario coming up, a 400-pod job).
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every node runs its Velero node-agent pod (`velero install` labels them
/// `name: node-agent` in `velero`). A file-system backup that starts before then fails that node's
/// volumes with "daemonset pod not found in running state in node" (velero `pkg/podvolume/backupper.go`),
/// as the simulated Velero does: a test that backs up right after a scenario starts waits here first.
pub async fn node_agents_running(client: &kube::Client) {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};
    let nodes: Api<Node> = Api::all(client.clone());
    let agents: Api<Pod> = Api::namespaced(client.clone(), "velero");
    eventually_within(
        "a running node-agent on every node",
        Duration::from_secs(30),
        || async {
            let nodes = nodes.list(&ListParams::default()).await.ok()?;
            let agents = agents
                .list(&ListParams::default().labels("name=node-agent"))
                .await
                .ok()?;
            let running: std::collections::BTreeSet<&str> = agents
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
                .collect();
            nodes
                .items
                .iter()
                .all(|n| {
                    n.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| running.contains(n))
                })
                .then_some(())
        },
    )
    .await
}

/// Raw HTTPS against the simulated API server whose CA is `ca_pem` (`SimCluster::ca_pem`), as its
/// admin (the kubeconfig's bearer token), each request bounded by [`WAIT`].
pub fn raw_client(ca_pem: &str) -> reqwest::Client {
    trusting(ca_pem)
        .default_headers(admin_headers())
        .timeout(WAIT)
        .build()
        .expect("HTTP client")
}

/// The admin's `Authorization` header (the kubeconfig's bearer token).
pub fn admin_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", snapdrain_sim::apiserver::auth::ADMIN_TOKEN)
            .parse()
            .expect("a token of ASCII letters is a valid header value"),
    );
    headers
}

/// An HTTPS client builder that trusts only `ca_pem` (the simulated API server's CA), with no
/// credentials of its own.
pub fn trusting(ca_pem: &str) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(ca_pem.as_bytes())
                .expect("the simulator's CA is one PEM certificate"),
        )
}

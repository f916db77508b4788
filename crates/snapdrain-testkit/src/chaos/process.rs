//! A controller replica as its own process: `snapdrain controller` against the simulated cluster, as a
//! Deployment's pod runs it (kubeconfig, `--ec2-endpoint`, AWS keys in the environment), so that a kill
//! is a real SIGKILL: no destructor, no flush, sockets cut by the kernel. Its stderr (JSON logs) is read
//! all along, so the pipe never fills and blocks it; the last lines are kept for a failed run's report.
//! The process dies with its handle (`kill_on_drop`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use snapdrain_sim::SimCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How many of its last log lines a replica keeps for the report.
const TAIL: usize = 30;

/// How long a replica may take to start (its caches synced, the gate listening).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The waits the in-process replicas get, so that both kinds pace a plan alike.
fn waits(s: &snapdrain::controller::Settings) -> [(&'static str, String); 3] {
    [
        ("--wait-slice-ms", s.wait_slice.as_millis().to_string()),
        (
            "--backup-retry-cap-ms",
            s.backup_retry_cap.as_millis().to_string(),
        ),
        (
            "--capacity-retry-base-ms",
            s.capacity_retry_base.as_millis().to_string(),
        ),
    ]
}

/// Why a replica process did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the simulated world runs no EC2 endpoint for the controller")]
    NoEc2,
    #[error("writing the controller's kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("finding a free port for the gate: {0}")]
    Port(std::io::Error),
    #[error("starting {bin}: {source} (build it, or pass the path of the `snapdrain` binary)")]
    Spawn { bin: String, source: std::io::Error },
    #[error("`snapdrain controller` did not start within {START_TIMEOUT:?}; its last lines:\n{0}")]
    NotStarted(String),
}

pub struct ProcessReplica {
    /// Where its gate listens.
    pub webhook_addr: SocketAddr,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Holds the kubeconfig for as long as the process runs.
    _dir: tempfile::TempDir,
}

impl ProcessReplica {
    /// Starts `bin controller` as replica `identity`, with leader election on a Lease of
    /// `lease_seconds` in `default` and the gate served, and waits until it says it started.
    pub async fn start(
        bin: &Path,
        cluster: &SimCluster,
        identity: &str,
        lease_seconds: u64,
    ) -> Result<Self, StartError> {
        let ec2 = cluster.ec2.as_ref().ok_or(StartError::NoEc2)?;
        let settings = crate::controller_settings(cluster, identity).ok_or(StartError::NoEc2)?;
        let dir = tempfile::tempdir().map_err(|e| StartError::Kubeconfig(e.to_string()))?;
        let kubeconfig = cluster
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .map_err(|e| StartError::Kubeconfig(e.to_string()))?;
        let join = snapdrain_sim::cluster::cluster_join(&cluster.url(), cluster.ca_pem());
        let webhook_addr = free_port().map_err(StartError::Port)?;
        let mut command = Command::new(bin);
        command
            .arg("controller")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--identity", identity, "--lease-namespace", "default"])
            .args(["--lease-seconds", &lease_seconds.to_string()])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(["--webhook-addr", &webhook_addr.to_string()])
            .args(["--ec2-endpoint", &ec2.endpoint()])
            .args(["--region", &ec2.config().region])
            .args(["--cluster-name", &join.cluster_name])
            .args(["--api-server", &join.api_server])
            .args(["--cluster-certificate", &join.cluster_certificate]);
        for (flag, value) in waits(&settings) {
            command.args([flag, &value]);
        }
        let mut child = command
            // The environment a Deployment gives it, nothing from the test's own.
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .env_remove("AWS_REGION")
            .env("RUST_LOG", "snapdrain=info")
            .env("AWS_ACCESS_KEY_ID", "sim")
            .env("AWS_SECRET_ACCESS_KEY", "sim")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its JSON logs go to stderr (telemetry/logging.rs).
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| StartError::Spawn {
                bin: bin.display().to_string(),
                source,
            })?;
        let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        // Spawned with piped stderr just above: it is there.
        let stderr = child.stderr.take().expect("stderr is piped");
        let kept = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut started = Some(started_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if message(&line).as_deref() == Some("snapdrain controller started")
                    && let Some(tx) = started.take()
                {
                    let _ = tx.send(());
                }
                let mut t = kept.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        let replica = Self {
            webhook_addr,
            child,
            tail,
            _dir: dir,
        };
        match tokio::time::timeout(START_TIMEOUT, started_rx).await {
            Ok(Ok(())) => Ok(replica),
            // The stream ended (the process exited) or the time is up.
            _ => Err(StartError::NotStarted(replica.logs().join("\n"))),
        }
    }

    /// SIGKILL, and the process reaped.
    pub async fn kill(mut self) {
        // tokio's start_kill sends SIGKILL on Unix.
        if let Err(e) = self.child.start_kill() {
            tracing::warn!(error = %e, "chaos: the replica process was already gone");
        }
        let _ = self.child.wait().await;
    }

    /// Its last log lines.
    pub fn logs(&self) -> Vec<String> {
        self.tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// The message of one JSON log line.
fn message(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    v.pointer("/fields/message")?.as_str().map(str::to_string)
}

/// A loopback port free now; the process binds it a moment later. Should anything take it in between,
/// the process fails to bind and [`ProcessReplica::start`] says so with its last lines.
fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

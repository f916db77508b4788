//! kubectl against a simulated cluster, with private kubeconfig/HOME/cache directories.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::Value;
use snapdrain_sim::SimCluster;
use snapdrain_sim::apiserver::KubeconfigUser;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::WAIT;

/// kubectl against one simulated cluster, with a kubeconfig, HOME and discovery cache of its own so that
/// tests running in parallel never share cached discovery or OpenAPI documents.
pub struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl as the cluster's admin (the kubeconfig `SimCluster::write_kubeconfig` writes).
    pub fn new(cluster: &SimCluster) -> Self {
        assert_kubectl_installed();
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = cluster
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig written");
        Self { dir, kubeconfig }
    }

    /// kubectl as `user`: the same cluster and CA as [`Kubectl::new`], another user.
    pub fn as_user(cluster: &SimCluster, user: KubeconfigUser<'_>) -> Self {
        assert_kubectl_installed();
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, cluster.kubeconfig_for(user)).expect("kubeconfig written");
        Self { dir, kubeconfig }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `text` to a file in the private directory and returns its path (for `-f`).
    pub fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("manifest written");
        p.display().to_string()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.args(args)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .env_remove("KUBECTL_EXTERNAL_DIFF")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        let fut = self.command(args).output();
        tokio::time::timeout(WAIT, fut)
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within {WAIT:?}"))
            .expect("kubectl runs")
    }

    /// Runs kubectl, fails the test unless it succeeds, and returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
            out.status
        );
        stdout
    }

    /// Runs kubectl, fails the test unless it fails, and returns its stderr.
    pub async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.status.success(),
            "kubectl {args:?} was expected to fail but succeeded:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// `kubectl ... -o json`, parsed.
    pub async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.ok(&all).await;
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: bad JSON {e}: {out}"))
    }

    /// Starts a long-running kubectl (e.g. `get -w`, `drain`) whose stdout is read line by line.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        Running {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }
}

pub struct Running {
    pub child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    pub seen: Vec<String>,
}

impl Running {
    /// Reads stdout until a line satisfies `pred`; fails the test after `WAIT` or at end of output.
    pub async fn line_matching(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let next = tokio::time::timeout_at(deadline, self.lines.next_line()).await;
            match next {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Ok(_) => panic!("kubectl output ended before {what}; saw {:?}", self.seen),
                Err(_) => panic!("timed out waiting for {what}; saw {:?}", self.seen),
            }
        }
    }

    /// Waits for the process to exit and returns (success, stdout rest, stderr).
    pub async fn finish(mut self) -> (bool, String, String) {
        let mut rest = self.seen.join("\n");
        let deadline = tokio::time::Instant::now() + WAIT;
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout_at(deadline, self.lines.next_line()).await
        {
            rest.push('\n');
            rest.push_str(&line);
        }
        let out = tokio::time::timeout_at(deadline, self.child.wait_with_output())
            .await
            .expect("kubectl exits in time")
            .expect("kubectl output");
        (
            out.status.success(),
            rest,
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }
}

fn assert_kubectl_installed() {
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("kubectl").is_file())
    });
    assert!(
        found,
        "kubectl is not installed or not on PATH: these tests run the real kubectl (v1.32) against the \
         simulated API server; install it (e.g. https://dl.k8s.io/release/v1.32.4/bin/linux/amd64/kubectl)"
    );
}

//! The `snapdrain` binary's manual pre-drain commands (`drain`, `status`, `abort`, `report`) against the
//! simulated cluster over HTTP, with the controller running in this process: as plain output, as JSON
//! lines, inside a pseudo-terminal, as a kubectl plugin found by real kubectl, and the HTML report
//! rendered by headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BIN: &str = env!("CARGO_BIN_EXE_snapdrain");

/// The binary pointed at one simulated cluster, with a private HOME and kubeconfig.
struct Cli {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

impl Cli {
    fn new(h: &Harness) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = h
            .cluster
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig written");
        Self { dir, kubeconfig }
    }

    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Finished {
        let out = tokio::time::timeout(TIMEOUT, self.command(Path::new(BIN), args).output())
            .await
            .unwrap_or_else(|_| panic!("snapdrain {args:?} did not finish within {TIMEOUT:?}"))
            .expect("snapdrain runs");
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self
            .command(Path::new(BIN), args)
            .spawn()
            .expect("snapdrain starts");
        let stdout = child.stdout.take().expect("piped stdout");
        Running {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }
}

/// A running `snapdrain drain` whose stdout is read line by line.
struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    seen: Vec<String>,
}

impl Running {
    async fn line_matching(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Ok(_) => panic!("output ended before {what}; saw {:#?}", self.seen),
                Err(_) => panic!("timed out waiting for {what}; saw {:#?}", self.seen),
            }
        }
    }

    async fn finish(mut self) -> Finished {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout_at(deadline, self.lines.next_line()).await
        {
            self.seen.push(line);
        }
        let out = tokio::time::timeout_at(deadline, self.child.wait_with_output())
            .await
            .expect("snapdrain exits in time")
            .expect("snapdrain output");
        Finished {
            code: out.status.code(),
            stdout: self.seen.join("\n"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Index of the first line containing `needle`, failing with the whole output.
fn position(lines: &[&str], needle: &str) -> usize {
    lines
        .iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?}:\n{}", lines.join("\n")))
}

async fn plan(h: &Harness, name: &str) -> DisruptionPlan {
    Api::<DisruptionPlan>::all(h.client.clone())
        .get(name)
        .await
        .expect("plan exists")
}

fn kubeconfig_arg(cli: &Cli) -> String {
    cli.kubeconfig.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_follows_the_plan_to_completed_in_plain_lines_and_exits_0() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let out = cli
        .run(&["drain", &node, "--name", "cli-ok", "--kubeconfig", &kc])
        .await;
    assert_eq!(
        out.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    let lines = out.lines();
    assert!(
        lines.iter().all(|l| l.starts_with("[+")),
        "every line carries the elapsed time:\n{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains('\u{1b}'),
        "no terminal escapes when stdout is a pipe:\n{}",
        out.stdout
    );
    let created = position(&lines, "disruptionplan.snapdrain.io/cli-ok created");
    let backing_up = position(&lines, "step BackingUp");
    let verified = position(&lines, "verified in the bucket");
    let draining = position(&lines, "step Draining");
    let evicted = position(&lines, "pods evicted");
    let completed = position(&lines, "step Completed");
    let last = position(&lines, "plan cli-ok Completed in");
    assert!(
        created < backing_up
            && backing_up < verified
            && verified < draining
            && draining < evicted
            && evicted < completed
            && completed < last,
        "steps in lifecycle order:\n{}",
        out.stdout
    );
    let p = plan(&h, "cli-ok").await;
    assert_eq!(p.spec.source, snapdrain::api::PlanSource::Manual);
    let status = p.status.as_ref().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed);
    for b in &status.backups {
        assert!(
            out.stdout.contains(&b.name),
            "backup {} told:\n{}",
            b.name,
            out.stdout
        );
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &p);
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_json_lines_tell_each_step_and_the_ending() {
    let h = Harness::start().await;
    // `--grace-period 0` needs the policy's allowance (refused by default, security review C-1).
    h.set_policy(serde_json::json!({"planSettings": {"allowZeroGracePeriod": true}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let out = cli
        .run(&[
            "drain",
            &node,
            "-o",
            "json",
            "--grace-period",
            "0",
            "--kubeconfig",
            &kc,
        ])
        .await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let events: Vec<Value> = out
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let name = events[0]["plan"].as_str().expect("plan name").to_string();
    assert!(
        name.starts_with(&format!("drain-{node}-")),
        "generated name {name}"
    );
    assert_eq!(events[0]["event"], "created");
    assert!(events.iter().all(|e| e["plan"] == name.as_str()
        && e["time"].is_string()
        && e["elapsedSeconds"].is_number()));
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "phase")
        .filter_map(|e| e["to"].as_str())
        .collect();
    let order: Vec<&str> = PlanPhase::ALL.iter().map(|p| p.as_str()).collect();
    let idx: Vec<usize> = steps
        .iter()
        .map(|s| order.iter().position(|o| o == s).expect("a known phase"))
        .collect();
    assert!(
        idx.windows(2).all(|w| w[0] < w[1]),
        "steps in order: {steps:?}"
    );
    assert_eq!(steps.last(), Some(&"Completed"), "{steps:?}");
    assert!(
        steps.contains(&"BackingUp") && steps.contains(&"Draining"),
        "{steps:?}"
    );
    let verified: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "backupVerified")
        .collect();
    assert!(!verified.is_empty() && verified.iter().all(|v| v["bytes"].as_u64() > Some(0)));
    let last = events.last().expect("events");
    assert_eq!(last["event"], "finished");
    assert_eq!(last["exitCode"], 0);
    assert_eq!(last["outcome"], "completed");
    let p = plan(&h, &name).await;
    assert_eq!(
        p.spec.drain.grace_period_seconds,
        Some(0),
        "--grace-period reached the spec"
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_backup_exits_3_and_leaves_the_node_in_service() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    h.cluster
        .velero
        .as_ref()
        .expect("velero")
        .inject(VeleroFault::FailAllBackups {
            reason: "injected: node-agent crashed".into(),
        });
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let out = cli
        .run(&[
            "drain",
            &node,
            "--name",
            "cli-fail",
            "--backup-attempts",
            "1",
            "--kubeconfig",
            &kc,
        ])
        .await;
    assert_eq!(out.code, Some(3), "{}\n{}", out.stdout, out.stderr);
    let lines = out.lines();
    let failed_phase = position(&lines, "Velero phase Failed");
    let failed = position(&lines, "plan cli-fail FAILED");
    assert!(failed_phase < failed, "{}", out.stdout);
    assert!(
        lines[failed].contains("node left in service") && lines[failed].contains("report cli-fail"),
        "the last line says why and where to look: {}",
        lines[failed]
    );
    assert!(h.accepted_evictions().is_empty(), "nothing evicted");
    let n = h.node(&node).await.expect("node still there");
    assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true));
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_from_another_snapdrain_stops_a_blocked_drain_which_exits_4() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let mut drain = cli.spawn(&["drain", &node, "--name", "cli-abort", "--kubeconfig", &kc]);
    let blocked = drain
        .line_matching("a blocked eviction", |l| l.contains("blocked:"))
        .await;
    assert!(blocked.contains("disruption budget"), "{blocked}");

    let status = cli.run(&["status", "cli-abort", "--kubeconfig", &kc]).await;
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    assert!(
        status.stdout.contains("Phase:    Draining"),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("blocked ("), "{}", status.stdout);

    let abort = cli.run(&["abort", "cli-abort", "--kubeconfig", &kc]).await;
    assert_eq!(abort.code, Some(0), "{}", abort.stderr);
    assert!(
        abort.stdout.contains("abort requested for plan cli-abort"),
        "{}",
        abort.stdout
    );
    let out = drain.finish().await;
    assert_eq!(out.code, Some(4), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("plan cli-abort Aborted"),
        "{}",
        out.stdout
    );
    let n = h.node(&node).await.expect("node kept");
    assert_ne!(
        n.spec.and_then(|s| s.unschedulable),
        Some(true),
        "rolled back: uncordoned"
    );

    let again = cli.run(&["abort", "cli-abort", "--kubeconfig", &kc]).await;
    assert_eq!(again.code, Some(0));
    assert!(again.stdout.contains("already Aborted"), "{}", again.stdout);
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn detach_returns_at_once_and_status_shows_the_plan() {
    let h = Harness::start().await;
    // No controller yet: a detached drain must not wait for anything.
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let out = cli
        .run(&[
            "drain",
            &node,
            "--name",
            "cli-detach",
            "--detach",
            "--kubeconfig",
            &kc,
        ])
        .await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("disruptionplan.snapdrain.io/cli-detach created")
    );
    assert!(
        out.stdout.contains("snapdrain status cli-detach"),
        "{}",
        out.stdout
    );
    let p = plan(&h, "cli-detach").await;
    assert!(
        p.status.is_none(),
        "no controller has touched it: {:?}",
        p.status
    );

    let controller = h.controller().await;
    h.wait_phase("cli-detach", PlanPhase::Completed).await;
    let table = cli.run(&["status", "--kubeconfig", &kc]).await;
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with("cli-detach "))
        .unwrap_or_else(|| panic!("no row for the plan:\n{}", table.stdout));
    assert!(
        row.contains("Completed") && row.contains("verified"),
        "{row}"
    );
    let json = cli
        .run(&["status", "cli-detach", "-o", "json", "--kubeconfig", &kc])
        .await;
    let v: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(v["status"]["phase"], "Completed");
    let yaml = cli
        .run(&["status", "-o", "yaml", "--kubeconfig", &kc])
        .await;
    assert!(
        yaml.stdout.contains("kind: List") && yaml.stdout.contains("name: cli-detach"),
        "{}",
        yaml.stdout
    );
    let missing = cli
        .run(&["status", "no-such-plan", "--kubeconfig", &kc])
        .await;
    assert_eq!(missing.code, Some(1));
    assert!(
        missing.stderr.contains("plan no-such-plan not found"),
        "{}",
        missing.stderr
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_without_a_terminal_leaves_the_plan_running_and_says_how_to_abort() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let mut drain = cli.spawn(&["drain", &node, "--name", "cli-int", "--kubeconfig", &kc]);
    drain
        .line_matching("a blocked eviction", |l| l.contains("blocked:"))
        .await;
    let pid = drain.child.id().expect("running");
    let kill = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await
        .expect("kill runs");
    assert!(kill.success());
    let out = drain.finish().await;
    assert_eq!(out.code, Some(130), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("snapdrain abort cli-int") && out.stdout.contains("keeps running"),
        "{}",
        out.stdout
    );
    let p = plan(&h, "cli-int").await;
    assert_eq!(
        p.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Draining),
        "still running"
    );
    assert!(
        !p.annotations().contains_key("snapdrain.io/abort"),
        "nobody asked to abort"
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_nodes_and_bad_flags_are_refused_before_a_plan_exists() {
    let h = Harness::start().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let out = cli
        .run(&["drain", "no-such-node", "--kubeconfig", &kc])
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("node no-such-node not found"),
        "{}",
        out.stderr
    );
    let out = cli
        .run(&[
            "drain",
            "-l",
            "example.com/pool=nothing",
            "--kubeconfig",
            &kc,
        ])
        .await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("no node matches the selector"),
        "{}",
        out.stderr
    );
    let out = cli
        .run(&["drain", "n1", "--timeout", "soon", "--kubeconfig", &kc])
        .await;
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("is not a duration"), "{}", out.stderr);
    let out = cli.run(&["drain", "--no-such-flag"]).await;
    assert_eq!(out.code, Some(2), "clap's usage error");
    let plans = Api::<DisruptionPlan>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list");
    assert!(plans.items.is_empty(), "no plan was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeconfig_list_in_the_environment_is_merged_as_kubectl_does() {
    let h = Harness::start().await;
    let cli = Cli::new(&h);
    // kubectl merges every file in $KUBECONFIG; the first current-context set wins. Here the first file
    // only adds another cluster, so the simulated cluster's context (second file) is the current one.
    let extra = cli.dir.path().join("extra");
    std::fs::write(
        &extra,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: elsewhere\n  cluster: {server: 'http://127.0.0.1:9'}\nusers:\n- name: nobody\n  user: {}\ncontexts:\n- name: elsewhere\n  context: {cluster: elsewhere, user: nobody}\n",
    )
    .expect("write the extra kubeconfig");
    let list = std::env::join_paths([&extra, &cli.kubeconfig]).expect("paths without ':'");
    let node = h.node_with_statefulset_pods().await;
    for args in [vec!["plan", node.as_str()], vec!["status"]] {
        let mut command = cli.command(Path::new(BIN), &args);
        command.env("KUBECONFIG", &list);
        let out = tokio::time::timeout(TIMEOUT, command.output())
            .await
            .expect("finishes")
            .expect("snapdrain runs");
        assert!(
            out.status.success(),
            "snapdrain {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs `snapdrain drain` in a pseudo-terminal: progress bars are drawn, Ctrl-C asks, and the answer
/// "abort" rolls the plan back (exit 4).
type LoggedSession = expectrl::Session<
    expectrl::process::unix::UnixProcess,
    expectrl::stream::log::LogStream<expectrl::process::unix::PtyStream, std::fs::File>,
>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_terminal_bars_are_drawn_and_ctrl_c_asks_then_aborts() {
    use expectrl::process::unix::WaitStatus;
    use expectrl::{Expect, Regex, Session};

    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let home = cli.dir.path().to_path_buf();
    let node2 = node.clone();
    let transcript = tokio::task::spawn_blocking(move || -> (Option<i32>, String) {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["drain", &node2, "--name", "cli-tty", "--kubeconfig", &kc])
            .env("HOME", &home)
            .env("TERM", "xterm-256color")
            .env_remove("RUST_LOG");
        let mut s = Session::spawn(cmd).expect("spawn in a pty");
        s.get_process_mut()
            .set_window_size(160, 40)
            .expect("window size");
        // Everything the terminal showed is kept as a test artifact.
        let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
        std::fs::create_dir_all(&artifacts).expect("artifact dir");
        let log = std::fs::File::create(artifacts.join("drain-tty.log")).expect("log file");
        let mut s = expectrl::session::log(s, log).expect("logged session");
        s.set_expect_timeout(Some(TIMEOUT));
        let mut seen = String::new();
        let mut expect = |s: &mut LoggedSession, pat: &str| {
            let m = s
                .expect(Regex(pat))
                .unwrap_or_else(|e| panic!("expected {pat:?} ({e}); saw:\n{seen}"));
            seen.push_str(&String::from_utf8_lossy(m.before()));
            seen.push_str(&String::from_utf8_lossy(m.get(0).unwrap_or_default()));
        };
        // The eviction bar: pods evicted of total, with who is blocked and why.
        expect(
            &mut s,
            r"\] \d+/\d+ pods evicted (?:\x1b\[[0-9;]*m)*\d+ blocked",
        );
        s.send("\x03").expect("Ctrl-C");
        expect(&mut s, r"choice \[a/l/c\]: ");
        s.send_line("a").expect("answer");
        expect(&mut s, r"plan cli-tty Aborted");
        let status = s.get_process().wait().expect("exit status");
        let code = match status {
            WaitStatus::Exited(_, code) => Some(code),
            _ => None,
        };
        (code, seen)
    });
    let (code, seen) = tokio::time::timeout(TIMEOUT * 2, transcript)
        .await
        .expect("the terminal session ends in time")
        .expect("the terminal session does not panic");
    assert_eq!(code, Some(4), "{seen}");
    assert!(
        seen.contains("step Draining"),
        "lines are printed above the bars:\n{seen}"
    );
    assert!(seen.contains("verified"), "{seen}");
    let p = plan(&h, "cli-tty").await;
    assert_eq!(p.status.as_ref().map(|s| s.phase), Some(PlanPhase::Aborted));
    assert_eq!(
        p.annotations()
            .get("snapdrain.io/abort")
            .map(String::as_str),
        Some("true")
    );
    controller.shutdown().await;
}

/// Real kubectl finds the binary as the plugin `kubectl-snapdrain` on PATH and runs `drain` with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_snapdrain_drain_works_through_kubectls_plugin_lookup() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let bin_dir = cli.dir.path().join("bin");
    std::fs::create_dir(&bin_dir).expect("bin dir");
    std::os::unix::fs::symlink(BIN, bin_dir.join("kubectl-snapdrain")).expect("symlink");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        let mut c = cli.command(Path::new("kubectl"), args);
        c.env("PATH", &path);
        c
    };
    let list = kubectl(&["plugin", "list"])
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("kubectl-snapdrain"),
        "kubectl lists the plugin: {}",
        String::from_utf8_lossy(&list.stdout)
    );
    let help = kubectl(&["snapdrain", "drain", "--help"])
        .output()
        .await
        .expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Usage: kubectl snapdrain drain"), "{help}");

    let out = tokio::time::timeout(
        TIMEOUT,
        kubectl(&["snapdrain", "drain", &node, "--name", "via-kubectl"]).output(),
    )
    .await
    .expect("in time")
    .expect("kubectl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("plan via-kubectl Completed"), "{stdout}");
    assert_eq!(
        plan(&h, "via-kubectl").await.status.map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    controller.shutdown().await;
}

/// Headless Chromium with a profile of its own and nothing that reaches the network.
async fn chromium(profile: &Path, args: &[&str]) -> std::process::Output {
    let chromium = Path::new("/usr/bin/chromium");
    assert!(
        chromium.exists(),
        "headless Chromium is needed to render the report: apt-get install -y chromium (.ci/run does)"
    );
    let mut c = Command::new(chromium);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .stdin(Stdio::null())
    .kill_on_drop(true);
    tokio::time::timeout(TIMEOUT, c.output())
        .await
        .expect("chromium finishes in time")
        .expect("chromium runs")
}

/// Strips tags, leaving the text a person reads (in document order).
fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A plan whose postgres eviction is refused by its PDB until the budget allows it, then the report in
/// HTML (rendered by headless Chromium: steps in order, backups and their bucket objects, pods with
/// their refused attempts) and in Markdown; the screenshot is kept under target/test-artifacts/.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_renders_in_headless_chromium_with_steps_backups_and_pods_in_order() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let cli = Cli::new(&h);
    let kc = kubeconfig_arg(&cli);
    let mut drain = cli.spawn(&["drain", &node, "--name", "cli-report", "--kubeconfig", &kc]);
    drain
        .line_matching("a blocked eviction", |l| l.contains("blocked:"))
        .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), "shop");
    for pdb in pdbs.list(&Default::default()).await.expect("PDBs").items {
        pdbs.patch(
            &pdb.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 1}})),
        )
        .await
        .expect("PDB relaxed");
    }
    let out = drain.finish().await;
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);

    let html_path = cli.dir.path().join("report.html");
    let html_arg = html_path.display().to_string();
    let r = cli
        .run(&["report", "cli-report", "-o", &html_arg, "--kubeconfig", &kc])
        .await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("written to"), "{}", r.stdout);

    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("file://{}", html_path.display());
    let dom = chromium(profile.path(), &["--dump-dom", &url]).await;
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(dom.contains("<svg"), "the timeline is drawn");

    let p = plan(&h, "cli-report").await;
    let status = p.status.clone().expect("status");
    let text = text_of(&dom);
    // Steps in the order they happened, in the rendered steps table.
    let steps_at = text.find("Step Started Took").expect("steps table");
    let steps = &text[steps_at..];
    let order: Vec<usize> = [
        "Pending",
        "Cordoning",
        "BackingUp",
        "Verifying",
        "Draining",
        "Terminating",
        "Completed",
    ]
    .iter()
    .map(|s| {
        steps
            .find(&format!(" {s} "))
            .unwrap_or_else(|| panic!("step {s} shown:\n{steps}"))
    })
    .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "steps in order: {order:?}"
    );
    // Each backup with its verified objects and sizes, before the evictions.
    let evictions_at = text
        .find("Pod Attempts Refused")
        .expect("per-pod evictions from the audit log");
    for b in &status.backups {
        let at = text
            .find(&b.name)
            .unwrap_or_else(|| panic!("backup {} shown", b.name));
        assert!(at < evictions_at);
        for o in &b.verified_objects {
            assert!(text.contains(&o.key), "object {} shown", o.key);
        }
    }
    // The protected pods (those the backups cover) are listed; the postgres ones, whose PDB allowed no
    // disruption until the test relaxed it, with at least one refusal. (Other protected pods on the node,
    // such as redis, have no blocking PDB and may be evicted on the first try.)
    let protected: Vec<String> = status
        .backups
        .iter()
        .flat_map(|b| b.pods.iter().map(move |p| format!("{}/{p}", b.namespace)))
        .collect();
    assert!(!protected.is_empty());
    for pod in &protected {
        assert!(
            text[evictions_at..].contains(pod.as_str()),
            "pod {pod} shown in the evictions"
        );
    }
    let blocked: Vec<&String> = protected
        .iter()
        .filter(|p| p.contains("/postgres-"))
        .collect();
    assert!(
        !blocked.is_empty(),
        "the node runs a postgres pod: {protected:?}"
    );
    for pod in blocked {
        let row = text[evictions_at..]
            .find(pod.as_str())
            .map(|i| &text[evictions_at + i..])
            .unwrap_or_else(|| panic!("pod {pod} shown in the evictions"));
        let cells: Vec<&str> = row.split_whitespace().take(3).collect();
        let refused: u32 = cells[2].parse().expect("a count");
        assert!(
            refused >= 1,
            "{pod} was refused by its PDB first: {cells:?}"
        );
    }

    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact dir");
    let png = artifacts.join("report.png");
    let _ = std::fs::remove_file(&png);
    let shot = chromium(
        profile.path(),
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1200,1600",
            &url,
        ],
    )
    .await;
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "a real PNG"
    );
    std::fs::copy(&html_path, artifacts.join("report.html")).expect("report kept");

    let md = cli
        .run(&[
            "report",
            "cli-report",
            "--format",
            "markdown",
            "--kubeconfig",
            &kc,
        ])
        .await;
    assert_eq!(md.code, Some(0), "{}", md.stderr);
    assert!(
        md.stdout
            .starts_with("## DisruptionPlan `cli-report`: Completed"),
        "{}",
        md.stdout
    );
    for b in &status.backups {
        assert!(md.stdout.contains(&b.name));
    }
    controller.shutdown().await;
}

/// The krew manifest installs this binary under the plugin name kubectl looks for.
#[test]
fn the_krew_manifest_names_the_plugin_and_the_binary() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/krew/snapdrain.yaml");
    let text = std::fs::read_to_string(&path).expect("manifest in the repo");
    let v: Value = serde_saphyr::from_str(&text).expect("valid YAML");
    assert_eq!(v["kind"], "Plugin");
    assert_eq!(
        v["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    // krew links `kubectl-<metadata.name>` to `bin`; program_name() recognises that name.
    assert_eq!(v["metadata"]["name"], "snapdrain");
    let platforms = v["spec"]["platforms"].as_array().expect("platforms");
    assert!(!platforms.is_empty());
    for p in platforms {
        assert_eq!(p["bin"], "snapdrain");
        assert_eq!(p["selector"]["matchLabels"]["os"], "linux");
    }
}

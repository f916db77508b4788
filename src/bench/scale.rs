//! The controller at `scale-5k` (5,000 nodes, 150,000 pods), run as its own process as in a cluster: how
//! long its caches take to sync, its memory once synced and after a plan (with 1,000 finished plans
//! stored, as after some weeks), and how soon a plan on one node drains it once its backups are verified.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::report::Report;
use super::sim::{PodsGone, on_node, owned_by, seed_finished_plans, start_scenario, wait_store};
use snapdrain_sim::apiserver::resources::ResKey;

const SECTION: &str = "scale";
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);
/// The kinds whose first list the controller waits for (NodeClaims too: scale-5k runs Karpenter).
const KINDS: usize = 8;
/// Finished plans stored before the controller starts (the "after 1,000 finished plans").
const FINISHED_PLANS: usize = 1_000;

/// A controller log line that marks a plan's progress: a phase change (`-> Draining`) or accepted
/// evictions (`evicted 12`).
fn step_mark(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    let f = &v["fields"];
    match f["message"].as_str()? {
        "plan phase changed" => Some(format!("-> {}", f["to"].as_str()?)),
        "evictions accepted" => Some(format!("evicted {}", f["evicted"])),
        _ => None,
    }
}

/// The environment variable naming a program (and its arguments) to run the controller under.
const WRAPPER_ENV: &str = "SNAPDRAIN_BENCH_WRAPPER";
/// The environment variable naming the `snapdrain` binary to run as the controller: by default this
/// one, which carries the simulator and the benches; the shipped build (`--no-default-features`, the
/// container image's) is smaller, and its code pages count in its RSS.
const CONTROLLER_ENV: &str = "SNAPDRAIN_BENCH_CONTROLLER";

/// `snapdrain controller` as the scale and soak benches start it: the binary of
/// `SNAPDRAIN_BENCH_CONTROLLER` (else this one), under `SNAPDRAIN_BENCH_WRAPPER` if set.
pub(super) fn controller_command() -> anyhow::Result<tokio::process::Command> {
    let binary = match std::env::var_os(CONTROLLER_ENV) {
        Some(path) => std::path::PathBuf::from(path),
        None => std::env::current_exe().context("finding this binary to run as the controller")?,
    };
    let wrapper = std::env::var(WRAPPER_ENV).unwrap_or_default();
    let mut wrapper = wrapper.split_whitespace();
    let mut command = match wrapper.next() {
        Some(program) => {
            let mut c = tokio::process::Command::new(program);
            c.args(wrapper).arg(binary);
            c
        }
        None => tokio::process::Command::new(binary),
    };
    command.arg("controller");
    Ok(command)
}

/// Which binary ran as the controller, for a figure's note.
pub(super) fn controller_binary_note() -> String {
    match std::env::var(CONTROLLER_ENV) {
        Ok(path) => format!("controller binary {path} ({CONTROLLER_ENV})"),
        Err(_) => "controller binary: this one, simulator included".into(),
    }
}

/// Ends a controller started by [`controller_command`]. Under a wrapper, a SIGTERM to the controller
/// and every other process the wrapper started first, so the profiler writes out what it recorded, then
/// a SIGKILL to whatever is left: killing the wrapper alone would leave the controller running on its
/// own (a heaptrack run left one that way).
pub(super) async fn stop_controller(child: &mut tokio::process::Child, pid: u32) {
    if std::env::var_os(WRAPPER_ENV).is_some() {
        let mut tree = child.id().map(descendants).unwrap_or_default();
        tree.push(pid);
        signal(&tree, "TERM");
        let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
        signal(&tree, "KILL");
    }
    child.kill().await.ok();
}

/// The processes `pid` started, from Linux's `/proc/PID/task/PID/children` (none once it has ended).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .collect()
}

/// Every process under `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let children = children(p);
        found.extend(&children);
        next.extend(children);
    }
    found
}

/// `kill -SIG` to each of `pids` (a process that already ended is no error here).
fn signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// The controller's own process when a wrapper started it: the last of the first-child chain under
/// `pid` (Linux `/proc/PID/task/PID/children`), read until it stops changing for a moment, since a
/// wrapper script starts it a little later; `pid` itself without a wrapper.
pub(super) fn innermost(pid: u32) -> u32 {
    if std::env::var_os(WRAPPER_ENV).is_none() {
        return pid;
    }
    let child_of = |p: u32| children(p).first().copied();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = pid;
    while Instant::now() < deadline {
        let mut p = pid;
        while let Some(c) = child_of(p) {
            p = c;
        }
        if p != pid && p == last {
            return p;
        }
        last = p;
        // Polling the process table: a wrapper gives no signal when it has started its child.
        std::thread::sleep(Duration::from_millis(200));
    }
    last
}

/// Resident and peak memory of process `pid`, MiB (Linux `/proc/PID/status`).
pub(super) fn rss_of(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse::<f64>()
            .ok()
    };
    Some((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
}

pub async fn controller(report: &mut Report) -> anyhow::Result<()> {
    let scenario = snapdrain_sim::scenario::builtin::scale_5k();
    let timings = scenario.timings.clone().unwrap_or_default();
    let b = start_scenario(scenario, "built-in scale-5k", timings).await?;
    let store = &b.cluster.store;
    let pods = store.snapshot(&ResKey::core("pods")).0;
    let node = pods
        .iter()
        .find(|p| owned_by(p, "StatefulSet"))
        .and_then(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("scale-5k has no StatefulSet pod on a node"))?;
    let on = pods.iter().filter(|p| on_node(p, &node)).count();
    drop(pods);
    // The plans of past weeks, kept by the default history: the controller holds them in memory too.
    let nodes: Vec<String> = store
        .snapshot(&ResKey::core("nodes"))
        .0
        .iter()
        .filter_map(|n| {
            n.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    seed_finished_plans(store, &nodes, FINISHED_PLANS)?;
    let ec2 = b
        .cluster
        .ec2
        .as_ref()
        .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = b.cluster.write_kubeconfig(&dir.path().join("kubeconfig"))?;
    let started = Instant::now();
    // A profiler in front of the controller (e.g. `heaptrack`, which writes its file to the working directory), from
    // the environment: the figures are then the wrapped controller's, profiler included.
    let mut child = controller_command()?
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--no-leader-election", "--metrics-addr", "127.0.0.1:0"])
        .arg("--ec2-endpoint")
        .arg(ec2.endpoint())
        .arg("--region")
        .arg(&ec2.config().region)
        .env("RUST_LOG", "snapdrain=info")
        .env("AWS_ACCESS_KEY_ID", "sim")
        .env("AWS_SECRET_ACCESS_KEY", "sim")
        // Its JSON logs go to stderr (telemetry/logging.rs).
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting `snapdrain controller`")?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the controller exited at once"))?;
    let pid = innermost(pid);
    let logs = child.stderr.take().context("the controller's stderr")?;
    let mut lines = BufReader::new(logs).lines();
    let mut synced = std::collections::BTreeSet::new();
    let sync = async {
        while let Some(line) = lines.next_line().await? {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["fields"]["message"] == "cache synced"
                && let Some(kind) = v["fields"]["kind"].as_str()
            {
                synced.insert(kind.to_owned());
                if synced.len() == KINDS {
                    return Ok(started.elapsed());
                }
            }
        }
        bail!("the controller exited before its caches synced ({synced:?} did)")
    };
    let sync_time = match tokio::time::timeout(SYNC_TIMEOUT, sync).await {
        Ok(r) => r?,
        Err(_) => {
            let rss = rss_of(pid).map_or("unknown".into(), |(r, _)| format!("{r:.0} MiB"));
            bail!(
                "caches not synced within {SYNC_TIMEOUT:?}: synced {synced:?} of {KINDS} kinds; controller RSS {rss}"
            )
        }
    };
    // Keep reading its output so the pipe never fills and blocks it, and note when the plan's steps
    // happened, to say where the drain's time goes.
    let marks: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let marks_in = marks.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(mark) = step_mark(&line) {
                let mut m = marks_in.lock().unwrap_or_else(|e| e.into_inner());
                m.push((Instant::now(), mark));
            }
        }
    });
    let f = report.add(
        SECTION,
        "controller process start -> every cache synced (scale-5k)",
        sync_time.as_secs_f64(),
        "s",
    );
    f.target = Some("< 30 s".into());
    f.note = Some(format!("{KINDS} kinds; 150,000 pods"));
    if let Some((rss, _)) = rss_of(pid) {
        let f = report.add(
            SECTION,
            "controller RSS, caches synced, 1,000 finished plans stored (scale-5k)",
            rss,
            "MiB",
        );
        // Issue 23: steady under 200 MiB at scale-5k.
        f.target = Some("< 200 MiB".into());
        f.note = Some(controller_binary_note());
    }

    let gone = tokio::spawn(PodsGone::subscribe(store, &node).wait());
    let plans = ResKey::new("snapdrain.io", "disruptionplans");
    let plan: snapdrain::api::DisruptionPlan = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": "scale-plan"}, "spec": {"nodes": [node]}
    }))?;
    let created = Instant::now();
    kube::Api::<snapdrain::api::DisruptionPlan>::all(b.client.clone())
        .create(&Default::default(), &plan)
        .await
        .context("creating the plan")?;
    let verified = wait_store(
        store,
        &plans,
        "the plan's backups verified",
        SYNC_TIMEOUT,
        |ps| {
            // This plan's: the stored finished plans' backups are verified from the start.
            ps.iter()
                .filter(|p| {
                    p.pointer("/metadata/name").and_then(Value::as_str) == Some("scale-plan")
                })
                .any(|p| {
                    p.pointer("/status/backups")
                        .and_then(Value::as_array)
                        .is_some_and(|bs| {
                            !bs.is_empty() && bs.iter().all(|b| b["verified"] == true)
                        })
                })
        },
    )
    .await?;
    let (drained, count) = tokio::time::timeout(SYNC_TIMEOUT, gone)
        .await
        .map_err(|_| anyhow!("node {node} not drained within {SYNC_TIMEOUT:?}"))???;
    let f = report.add(
        SECTION,
        "plan on one node: backups verified -> pods gone (scale-5k)",
        drained.saturating_duration_since(verified).as_secs_f64() * 1000.0,
        "ms",
    );
    f.target = Some("< 2000 ms".into());
    let steps: Vec<String> = marks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(at, _)| *at >= created)
        .map(|(at, mark)| {
            // Relative to verification as the bench saw it (the status write that carried it).
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let offset = ms(at.saturating_duration_since(verified))
                - ms(verified.saturating_duration_since(*at));
            format!("{mark} {offset:+.0} ms")
        })
        .collect();
    f.note = Some(format!(
        "{on} pods on the node, {count} evicted; plan created -> verified {:.1} s; steps from verification: {}",
        verified.saturating_duration_since(created).as_secs_f64(),
        if steps.is_empty() {
            "no step logged".to_string()
        } else {
            steps.join(", ")
        }
    ));
    if let Some((rss, peak)) = rss_of(pid) {
        let f = report.add(
            SECTION,
            "controller RSS after the plan, 1,000 finished plans stored (scale-5k)",
            rss,
            "MiB",
        );
        // Issue 23: under 256 MiB after plan churn.
        f.target = Some("< 256 MiB".into());
        f.note = Some(format!("peak {peak:.0} MiB; {}", controller_binary_note()));
    }
    stop_controller(&mut child, pid).await;
    Ok(())
}

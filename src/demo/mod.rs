//! `snapdrain demo`: the simulated cluster and the controller in one process, and a DisruptionPlan
//! followed from submission to the end, told as it happens.
//!
//! - [`setup`]: cluster, CRD, controller.
//! - [`preview`]: which node and what will happen to its pods.
//! - [`plan`]: the plan submitted (with a Bottlerocket replacement).
//! - [`follow`]: the live story, from the plan's status and the audit log.
//! - [`summary`]: the closing report and the safety check.
//! - [`printer`]: plain lines, with a spinner on a terminal.
//! - [`rollout`]: `--rollout`, a Karpenter drift rollout of 20 nodes guarded by snapdrain.
//!
//! [`run`] writes to any writer and returns the [`Demo`] (cluster still running), so the CLI can keep it
//! up for kubectl and tests can read the [`summary::Report`].

pub mod follow;
pub mod plan;
pub mod preview;
pub mod printer;
pub mod rollout;
pub mod setup;
pub mod summary;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, PostParams};

use follow::{Ending, Narrator};
use printer::Printer;
use snapdrain::api::DisruptionPlan;
use snapdrain::controller::ControllerHandle;
use snapdrain_sim::SimCluster;
use snapdrain_sim::world::Timings;
use summary::Report;

#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// A built-in scenario name or a scenario file.
    pub scenario: String,
    /// The node to disrupt (default: the one running the most protected pods).
    pub node: Option<String>,
    /// Launch a Bottlerocket replacement after the drain.
    pub replacement: bool,
    /// Overrides the scenario's timings (tests make everything faster).
    pub timings: Option<Timings>,
    /// How long the plan may take before the demo gives up.
    pub timeout: Duration,
    /// Draw a spinner (stdout and stderr are a terminal).
    pub live: bool,
    /// Write `snapdrain report`'s HTML page of the plan here at the end, and print its path.
    pub report_path: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            scenario: "quickstart".into(),
            node: None,
            replacement: true,
            timings: None,
            timeout: Duration::from_secs(120),
            live: false,
            report_path: None,
        }
    }
}

/// A finished demo whose cluster and controller are still running.
pub struct Demo {
    pub cluster: SimCluster,
    pub report: Report,
    controller: ControllerHandle,
}

impl Demo {
    /// Why the demo failed, or None when the plan Completed and the safety check passed.
    pub fn failure(&self) -> Option<String> {
        self.report.failure()
    }

    /// Writes a kubeconfig for the simulated cluster and returns its absolute path.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<PathBuf> {
        let written = self
            .cluster
            .write_kubeconfig(path)
            .with_context(|| format!("cannot write the kubeconfig to {}", path.display()))?;
        Ok(std::fs::canonicalize(&written).unwrap_or(written))
    }

    /// Stops the controller (in-flight reconciles finish), then the cluster.
    pub async fn shutdown(self) {
        self.controller.shutdown().await;
        drop(self.cluster);
    }
}

/// Runs the demo, telling it on `out`.
pub async fn run(opts: &DemoOptions, out: &mut (dyn Write + Send)) -> anyhow::Result<Demo> {
    let mut p = Printer::new(out, opts.live);
    let started = Instant::now();
    p.status(format!(
        "starting the simulated cluster ({})",
        opts.scenario
    ));
    let (cluster, client) = setup::start_cluster(
        &opts.scenario,
        opts.timings.clone(),
        Duration::from_secs(60),
    )
    .await?;
    p.line(format!(
        "Simulated cluster ({} scenario) up at {} in {:.2}s: Kubernetes API, Velero with an S3 bucket, Karpenter, EC2.",
        opts.scenario,
        cluster.url(),
        started.elapsed().as_secs_f64()
    ))?;
    let controller = setup::start_controller(&cluster).await?;
    p.line("snapdrain controller running in this process (one replica, no leader election).")?;

    let view = preview::ClusterView::load(&client).await?;
    let node_name = preview::pick_node(&view, opts.node.as_deref())?;
    let node = preview::node_view(&view, &node_name);
    let protected = view.protected();
    let replacement = if opts.replacement {
        Some(plan::choose_replacement(&node, &cluster)?)
    } else {
        None
    };
    p.line("")?;
    for line in preview::describe(&node) {
        p.line(line)?;
    }
    p.line("")?;
    for line in plan::describe_steps(&node, replacement.as_ref()) {
        p.line(line)?;
    }

    let name = plan::plan_name(&node_name);
    let body: DisruptionPlan = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapdrain.io/v1alpha1",
        "kind": "DisruptionPlan",
        "metadata": {"name": name},
        "spec": plan::plan_spec(&node_name, replacement.as_ref()),
    }))
    .context("the demo's DisruptionPlan does not match the CRD types (a bug in the demo)")?;
    // Subscribe before submitting, so the story misses nothing.
    let mut audit = cluster.audit.follow();
    Api::<DisruptionPlan>::all(client.clone())
        .create(&PostParams::default(), &body)
        .await
        .with_context(|| format!("cannot create DisruptionPlan {name}"))?;
    p.restart_clock();
    p.line("")?;
    p.line(format!("DisruptionPlan {name} submitted; following it:"))?;
    let mut narrator = Narrator::new(protected.keys().cloned().collect());
    let ending = follow::follow(
        &client,
        &name,
        &mut audit,
        &mut narrator,
        opts.timeout,
        &mut p,
    )
    .await?;
    let elapsed = p.elapsed();
    let (last, timed_out) = match ending {
        Ending::Finished(plan) => (Some(plan), false),
        Ending::TimedOut(plan) => (plan, true),
    };
    p.status("checking the audit log and the bucket");
    let report = summary::gather(summary::Inputs {
        cluster: &cluster,
        client: &client,
        plan_name: &name,
        node: &node,
        protected: &protected,
        plan: last.as_deref(),
        timed_out,
        elapsed,
        transitions: &narrator.transitions,
    })
    .await;
    // The instance's termination may arrive while the report is gathered: tell it before the summary.
    follow::drain_audit(&mut audit, &mut narrator, &mut p)?;
    p.stop_spinner();
    for line in report.lines() {
        p.line(line)?;
    }
    if let Some(path) = &opts.report_path {
        let data = crate::report::gather(&client, &name).await?;
        std::fs::write(path, crate::report::render_html(&data))
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
        let shown = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        p.line(format!(
            "Report (timeline, backups, evictions, Events): {}",
            shown.display()
        ))?;
    }
    p.flush()?;
    drop(p);
    Ok(Demo {
        cluster,
        report,
        controller,
    })
}

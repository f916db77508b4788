//! `snapdrain sim serve`: run the simulated cluster until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig, manifests};

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Start the simulated cluster, write a kubeconfig, print one JSON line with the endpoints, and run
    /// until SIGINT/SIGTERM.
    Serve {
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// Where to write the kubeconfig (default: ./snapdrain-sim.kubeconfig).
        #[arg(long, default_value = "snapdrain-sim.kubeconfig")]
        kubeconfig: PathBuf,
        /// A scenario: a built-in name (quickstart, batch-burst, drift-rollout, scale-5k) or a scenario
        /// file. A file that is a plain list of manifests is loaded as objects, without the world.
        #[arg(long, value_name = "NAME|FILE")]
        scenario: Option<String>,
        /// Run the world controllers (kubelet, scheduler, workload controllers) even without a scenario.
        #[arg(long)]
        world: bool,
        /// Fault rules to apply from the start: a JSON list as `PUT /sim/faults` takes, e.g.
        /// `[{"verb":"create","resource":"pods/eviction","errorRate":0.2,"errorCode":429}]`.
        #[arg(long, value_name = "FILE")]
        faults: Option<std::path::PathBuf>,
    },
}

pub async fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd {
        SimCommand::Serve {
            addr,
            kubeconfig,
            scenario,
            world,
            faults,
        } => {
            let rules = match &faults {
                None => Vec::new(),
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read fault rules {}", path.display()))?;
                    let rules: Vec<snapdrain_sim::apiserver::faults::FaultRule> = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not a JSON list of fault rules (verb, resource, errorRate, errorCode, latencyMs, times)", path.display()))?;
                    for r in &rules {
                        r.validate()
                            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    }
                    rules
                }
            };
            let (objects, scenario) = match scenario {
                Some(file) if is_manifest_list(&file) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("cannot read scenario file {file}"))?;
                    (manifests::parse_objects(&text, &file)?, None)
                }
                other => (Vec::new(), other.map(ScenarioSource::Named)),
            };
            let cluster = SimCluster::start(SimConfig {
                addr,
                objects,
                scenario,
                world,
                ..Default::default()
            })
            .await?;
            cluster.faults.set(rules);
            let path = cluster.write_kubeconfig(&kubeconfig)?;
            let abs = std::fs::canonicalize(&path).unwrap_or(path);
            println!(
                "{}",
                json!({"apiserver": cluster.url(), "kubeconfig": abs, "audit": format!("{}/sim/audit", cluster.url()), "faults": format!("{}/sim/faults", cluster.url())})
            );
            super::signal::shutdown_signal().await;
            Ok(())
        }
    }
}

/// Whether `path` is a file of plain manifests (a list, or documents with apiVersion and kind) rather
/// than a scenario.
fn is_manifest_list(path: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(docs) = serde_saphyr::from_multiple::<serde_json::Value>(&text) else {
        return false;
    };
    docs.iter()
        .find(|d| !d.is_null())
        .is_some_and(|d| d.is_array() || (d.get("apiVersion").is_some() && d.get("kind").is_some()))
}

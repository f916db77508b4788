//! The controller replicas of a chaos run: two, leader-elected on one Lease, each serving the eviction
//! gate. With a `snapdrain` binary one of them is a `snapdrain controller` process ([`super::process`]),
//! the other runs in the test's own process; a killed replica is replaced by a new one of its kind, so
//! both kinds lead and die during a run. The gate's Service points at the oldest live replica.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::leader::LEASE_NAME;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::apiserver::resources::ResKey;

use super::process::ProcessReplica;
use crate::gate;
use crate::harness::Harness;

enum Replica {
    // Both boxed: the two handles differ in size by hundreds of bytes.
    InProcess(Box<ControllerHandle>),
    Process(Box<ProcessReplica>),
}

impl Replica {
    fn webhook_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::InProcess(c) => c.webhook_addr,
            Self::Process(p) => Some(p.webhook_addr),
        }
    }
}

pub struct Replicas<'a> {
    h: &'a Harness,
    /// `(identity, replica)`, oldest first.
    live: Vec<(String, Replica)>,
    started: u32,
    pub kills: u64,
    /// Kills that were a process's SIGKILL.
    pub process_kills: u64,
    lease_seconds: u64,
    bin: Option<PathBuf>,
    /// The last lines of every replica process that ran, by identity.
    pub process_logs: Vec<(String, Vec<String>)>,
}

impl<'a> Replicas<'a> {
    /// Two replicas: one in-process, the other a process when `bin` is given.
    pub async fn start(h: &'a Harness, lease_seconds: u64, bin: Option<PathBuf>) -> Self {
        let mut r = Self {
            h,
            live: Vec::new(),
            started: 0,
            kills: 0,
            process_kills: 0,
            lease_seconds,
            bin,
            process_logs: Vec::new(),
        };
        r.add(false).await;
        let process = r.bin.is_some();
        r.add(process).await;
        r
    }

    async fn add(&mut self, process: bool) {
        self.started += 1;
        let identity = format!("replica-{}", self.started);
        let replica = match (&self.bin, process) {
            (Some(bin), true) => Replica::Process(Box::new(
                ProcessReplica::start(bin, &self.h.cluster, &identity, self.lease_seconds)
                    .await
                    .unwrap_or_else(|e| panic!("starting replica {identity}: {e}")),
            )),
            _ => {
                let opts = RunOptions {
                    lease_namespace: Some("default".into()),
                    lease_seconds: self.lease_seconds,
                    webhook: Some(gate::webhook_config(
                        snapdrain::webhook::Lifetimes::default(),
                        Duration::from_secs(30),
                    )),
                    ..RunOptions::default()
                };
                Replica::InProcess(Box::new(self.h.controller_with(opts, &identity).await))
            }
        };
        self.live.push((identity, replica));
    }

    /// The identity of the live replica the Lease names as its holder (the simulator's store, not a
    /// replica's own word), if one does.
    pub fn leader(&self) -> Option<String> {
        let lease = self.h.cluster.store.get(
            &ResKey::new("coordination.k8s.io", "leases"),
            Some("default"),
            LEASE_NAME,
        )?;
        let holder = lease
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str)?;
        self.live
            .iter()
            .find(|(id, _)| id == holder)
            .map(|(id, _)| id.clone())
    }

    /// Kills the leading replica (the oldest when none leads) as a crash would, starts a new one of
    /// its kind, and points the gate's Service at a replica alive.
    pub async fn kill_leader(&mut self) {
        let leader = self.leader();
        let at = self
            .live
            .iter()
            .position(|(id, _)| Some(id) == leader.as_ref())
            .unwrap_or(0);
        let process = if at < self.live.len() {
            let (identity, replica) = self.live.remove(at);
            tracing::info!(%identity, "chaos: killing a controller replica");
            self.kills += 1;
            match replica {
                Replica::InProcess(handle) => {
                    handle.kill();
                    false
                }
                Replica::Process(p) => {
                    self.process_kills += 1;
                    self.process_logs.push((identity, p.logs()));
                    p.kill().await;
                    true
                }
            }
        } else {
            false
        };
        self.point_gate().await;
        self.add(process).await;
    }

    /// Points the gate's Service at the oldest live replica's gate, as the endpoints controller takes
    /// a dead pod out of the Service (the simulator dials one address per Service).
    pub async fn point_gate(&self) {
        let Some(addr) = self.live.iter().find_map(|(_, r)| r.webhook_addr()) else {
            return;
        };
        let services = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(
            self.h.client.clone(),
            gate::NS,
        );
        let patch = json!({"metadata": {"annotations": {
            snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION: addr.to_string()}}});
        match services.get_opt(gate::SERVICE).await {
            Ok(Some(_)) => {
                // The API's own faults may refuse it: retried, as the endpoints controller would.
                let deadline = Instant::now() + Duration::from_secs(30);
                while let Err(e) = services
                    .patch(
                        gate::SERVICE,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                {
                    assert!(
                        Instant::now() < deadline,
                        "pointing the gate's Service at {addr}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            _ => gate::service(&self.h.client, addr).await,
        }
    }

    /// Stops every replica: in-process ones gracefully, processes killed (their last lines kept).
    pub async fn shutdown(mut self) -> Vec<(String, Vec<String>)> {
        for (identity, r) in self.live.drain(..) {
            match r {
                Replica::InProcess(c) => c.shutdown().await,
                Replica::Process(p) => {
                    self.process_logs.push((identity, p.logs()));
                    p.kill().await;
                }
            }
        }
        self.process_logs
    }
}

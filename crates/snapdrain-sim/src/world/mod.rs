//! The world around the API server: what kubelets, the scheduler, the built-in controllers, Velero,
//! Karpenter, Cluster Autoscaler, aws-node-termination-handler and EC2 do in a real cluster. Every controller here reads and writes through the same
//! [`Store`] as API clients, so clients see their effects exactly as they would see a real cluster's.
//!
//! Each controller is a task started by [`World::start`]; they share a [`WorldContext`]. Controllers read
//! through [`feed::Feed`] (a subscription that survives falling behind) and keep their own indexes, so no
//! event costs a scan of all pods.

pub mod feed;
pub mod gc;
pub mod kubelet;
pub mod objects;
pub mod scheduler;
pub mod statefulset;
pub mod volumes;
pub mod workloads;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use serde::{Deserialize, Serialize};

use super::apiserver::audit::Audit;
use super::apiserver::faults::Faults;
use super::apiserver::store::Store;

/// How fast the simulated world moves. Scenarios set these; tests shorten them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Timings {
    /// From binding to Running and Ready.
    #[serde(with = "millis")]
    pub pod_start: Duration,
    /// Upper bound of how long a terminating pod takes to stop (never more than its grace period).
    #[serde(with = "millis")]
    pub pod_stop: Duration,
    /// From launch to a Ready Node.
    #[serde(with = "millis")]
    pub instance_boot: Duration,
    /// From the last pod using a volume leaving a node to its VolumeAttachment being removed.
    #[serde(with = "millis")]
    pub volume_detach: Duration,
    /// Velero file-system backup throughput, MiB/s (0 means instant).
    pub backup_mib_per_second: f64,
    /// Fixed overhead of every Velero backup (queueing, tarball, upload).
    #[serde(with = "millis")]
    pub backup_overhead: Duration,
    /// How fast EC2 copies an EBS volume into a snapshot, MiB/s: a snapshot stays `pending` for size /
    /// rate (0 means completed at once). A stand-in: real snapshot time depends on the blocks written.
    pub ebs_snapshot_mib_per_second: f64,
    /// How long after a snapshot of a volume starts EC2 refuses another with
    /// `SnapshotCreationPerVolumeRateExceeded` (EC2: 15 s). Zero lets a test see every second cut.
    #[serde(with = "millis")]
    pub ebs_snapshot_per_volume_interval: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            pod_start: Duration::from_millis(500),
            pod_stop: Duration::from_millis(300),
            instance_boot: Duration::from_secs(2),
            volume_detach: Duration::from_millis(300),
            backup_mib_per_second: 2048.0,
            backup_overhead: Duration::from_millis(300),
            ebs_snapshot_mib_per_second: 10_240.0,
            ebs_snapshot_per_volume_interval: crate::ec2::PER_VOLUME_INTERVAL,
        }
    }
}

impl Timings {
    /// Everything immediate: for benchmarks of orchestration overhead.
    pub fn instant() -> Self {
        Self {
            pod_start: Duration::ZERO,
            pod_stop: Duration::ZERO,
            instance_boot: Duration::ZERO,
            volume_detach: Duration::ZERO,
            backup_mib_per_second: 0.0,
            backup_overhead: Duration::ZERO,
            ebs_snapshot_mib_per_second: 0.0,
            ebs_snapshot_per_volume_interval: crate::ec2::PER_VOLUME_INTERVAL,
        }
    }
}

/// Durations in scenario files are milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// What every world controller can reach.
pub struct WorldContext {
    pub store: Store,
    pub audit: Arc<Audit>,
    pub faults: Arc<Faults>,
    pub timings: Timings,
    /// The simulated S3 endpoint when one runs beside the cluster (`sim::s3::S3Sim::endpoint()`): Velero
    /// writes there. The EC2 simulator's handle belongs here too, once it is part of the build.
    pub s3_endpoint: Option<String>,
    /// The private CA that signed that endpoint's certificate, when it serves TLS.
    pub s3_ca_pem: Option<String>,
    /// CA certificates (PEM) in the Velero pod's system trust store beyond the public roots, which
    /// velero-plugin-for-aws `config.go` `WithTLSSettings` extends with the BSL's `caCert`.
    pub velero_system_cas: Vec<String>,
}

impl WorldContext {
    pub fn new(store: Store, audit: Arc<Audit>, faults: Arc<Faults>, timings: Timings) -> Self {
        Self {
            store,
            audit,
            faults,
            timings,
            s3_endpoint: None,
            s3_ca_pem: None,
            velero_system_cas: Vec::new(),
        }
    }
}

/// The running controllers of the simulated world. Dropping it stops them.
pub struct World {
    tasks: Vec<JoinHandle<()>>,
}

impl World {
    /// Starts kubelet, scheduler, StatefulSet, Deployment, ReplicaSet, DaemonSet, Job, volume and
    /// garbage-collection controllers. From now on the kubelet, not a timer in the store, finishes pod
    /// deletions.
    pub fn start(ctx: Arc<WorldContext>) -> World {
        ctx.store.set_kubelet_managed(true);
        let tasks = vec![
            tokio::spawn(kubelet::run(ctx.clone())),
            tokio::spawn(scheduler::run(ctx.clone())),
            tokio::spawn(statefulset::run(ctx.clone())),
            tokio::spawn(workloads::deployments_run(ctx.clone())),
            tokio::spawn(workloads::replicasets_run(ctx.clone())),
            tokio::spawn(workloads::daemonsets_run(ctx.clone())),
            tokio::spawn(workloads::jobs_run(ctx.clone())),
            tokio::spawn(volumes::run(ctx.clone())),
            tokio::spawn(gc::run(ctx)),
        ];
        World { tasks }
    }

    /// Adds another task (Velero, Karpenter, EC2 nodes) to be stopped with the world.
    pub fn adopt(&mut self, task: JoinHandle<()>) {
        self.tasks.push(task);
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub mod autoscaler;
pub mod ca_scale_down;
pub mod ca_unneeded;
pub mod ec2_nodes;
pub mod eviction;
pub mod karpenter;
pub mod node_taints;
pub mod nth;
pub mod spot;
pub mod velero;

/// Go duration strings (`720h`, `1h30m0s`, `30s`) as Karpenter and Velero specs use them.
pub(crate) fn go_duration(s: &str) -> Option<Duration> {
    velero::parse_go_duration(s)
}

//! The contract between the plan driver ([`super::reconcile`]) and the steps ([`super::steps`]).
//!
//! A step reads a [`PlanView`]: the plan, its status exactly as last written, and one clock reading. It
//! does at most its phase's I/O through [`Io`], acts only on intents already in the written status, and
//! returns an [`Outcome`]: the new status, what comes next and what to announce. It cannot write the
//! status, publish an Event, send a notification, count a plan metric, read the clock or wait: [`Io`]
//! carries none of those. The driver does them, and announces only after the write that carries the news
//! has landed, so a refused write repeats nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::controller::cache::CachedVolumeAttachment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};

use super::cache::Caches;
use super::context::{Cloud, Settings};
use super::error::ControllerError;
use crate::api::status::DisruptionPlanStatus;
use crate::api::{DisruptionPlan, ValidSpec};
use crate::planning::Clock;
use crate::telemetry::Metrics;

pub use super::report::{Note, What};

/// What a step decides from: the plan, its status as last written, and one clock reading for the call.
pub struct PlanView<'a> {
    pub plan: &'a DisruptionPlan,
    pub valid: &'a ValidSpec,
    /// The checkpoint: exactly what the last write stored.
    pub status: &'a DisruptionPlanStatus,
    pub now: Timestamp,
}

impl PlanView<'_> {
    pub fn name(&self) -> String {
        self.plan.name_any()
    }

    pub fn uid(&self) -> String {
        self.plan.uid().unwrap_or_default()
    }

    /// When the plan was decided (now, before Pending recorded it) and now.
    pub fn clock(&self) -> Clock {
        Clock {
            decided_at: self.status.decided_at.as_ref().map_or(self.now, |t| t.0),
            now: self.now,
        }
    }

    /// An outcome that starts from the written status, with nothing done yet.
    pub fn outcome(&self) -> Outcome {
        Outcome::decide(self.status.clone())
    }
}

/// The world a step may read and act on. No status writer, recorder, notifier or plan metric is here.
pub struct Io<'a> {
    pub client: &'a Client,
    /// Does not retry 429s itself, so eviction answers reach the drain's own backoff.
    pub eviction_client: &'a Client,
    /// Synced before the step runs.
    pub caches: &'a Caches,
    /// EC2, Auto Scaling and snapdrain's own AWS configuration, built on first use.
    pub cloud: &'a Cloud,
    pub settings: &'a Settings,
    /// Request-level counters only (evictions by answer code): plan-level news is a [`Note`].
    pub requests: &'a Metrics,
    /// The DisruptionPolicy in force, once read (a launch is judged by it again right before it).
    pub policy: Option<crate::api::DisruptionPolicySpec>,
}

/// What one call of a step did. The driver writes `status` (when it changed), then publishes `notes`.
#[must_use]
#[derive(Debug)]
pub struct Outcome {
    pub status: DisruptionPlanStatus,
    pub next: Next,
    pub notes: Vec<Note>,
}

impl Outcome {
    pub fn decide(status: DisruptionPlanStatus) -> Self {
        Self {
            status,
            next: Next::Decide,
            notes: Vec::new(),
        }
    }

    /// Sets what comes next, keeping the status and notes.
    pub fn then(mut self, next: Next) -> Self {
        self.next = next;
        self
    }

    pub fn note(&mut self, what: What, text: impl Into<String>) {
        self.notes.push(Note {
            what,
            text: text.into(),
        });
    }
}

/// What the driver does after writing the outcome's status.
#[derive(Debug)]
pub enum Next {
    /// The phase machine decides from the written status.
    Decide,
    /// An intent is in the status and nothing was done on it yet (a ClientToken, an instance record, an
    /// abandon mark, the cordon's pre-state): write it, then call the same step again at once.
    Checkpoint,
    /// Decide; if the phase stays, wait up to `recheck` (at most one wait slice) for `wake` on the
    /// caches and call the step again when it fires; otherwise look again after `recheck` (sooner, once
    /// the slice is spent, when `wake` is a cache condition).
    Wait { wake: Wake, recheck: Duration },
    /// What was done is in the status; the error is retried with the error policy's backoff (or fails
    /// the plan when no retry can fix it).
    Retry(ControllerError),
    /// No retry can fix this: the plan fails (and rolls back) with the message.
    Fail(String),
}

/// A condition on the shared caches the driver waits for. Pure data: [`Wake::fired`] decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Nothing in the caches ends this wait: only time (or a watch event on the plan).
    Never,
    /// None of these pod uids is bound to `node` any more.
    PodsLeft {
        node: String,
        uids: BTreeSet<String>,
    },
    /// No VolumeAttachment on `node` except those of `keep_pvs` (volumes of pods that stay).
    AttachmentsGone {
        node: String,
        keep_pvs: BTreeSet<String>,
    },
    /// None of these Nodes (name, and the uid the plan drained) is there any more; a Node of that name
    /// with another uid is another node and does not count.
    NodesGone(Vec<(String, Option<String>)>),
    /// A Ready Node carries each of these EC2 instance ids in its providerID.
    NodesReady(BTreeSet<String>),
    /// Any of these.
    Any(Vec<Wake>),
}

impl Wake {
    /// True when the condition holds on the caches now.
    pub fn fired(&self, caches: &Caches) -> bool {
        match self {
            Self::Never => false,
            Self::PodsLeft { node, uids } => !caches
                .pods
                .indexed(node)
                .iter()
                .any(|p| p.uid().is_some_and(|u| uids.contains(u.as_ref()))),
            Self::AttachmentsGone { node, keep_pvs } => {
                attachments_left(&caches.volume_attachments.indexed(node), node, keep_pvs) == 0
            }
            Self::NodesGone(nodes) => {
                let cached = caches.nodes.all();
                !nodes.iter().any(|(name, uid)| {
                    cached.iter().any(|n| {
                        n.name_any() == *name
                            && !super::steps::terminate::is_other_node(uid.as_deref(), n)
                    })
                })
            }
            Self::NodesReady(ids) => {
                let cached = caches.nodes.all();
                ids.iter().all(|id| ready_node_for(&cached, id).is_some())
            }
            Self::Any(all) => all.iter().any(|w| w.fired(caches)),
        }
    }

    /// Waits up to `timeout` for [`Wake::fired`], re-checking after every change of the caches it reads.
    pub async fn wait(&self, caches: &Caches, timeout: Duration) -> bool {
        if *self == Self::Never {
            return false;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = caches_changes(caches);
        loop {
            for c in changes.iter_mut() {
                c.borrow_and_update();
            }
            if self.fired(caches) {
                return true;
            }
            let changed =
                futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
            match tokio::time::timeout_at(deadline, changed).await {
                Ok((Ok(()), _, _)) => continue,
                _ => return false,
            }
        }
    }
}

/// The change signals of the caches a [`Wake`] reads.
fn caches_changes(caches: &Caches) -> Vec<tokio::sync::watch::Receiver<u64>> {
    vec![
        caches.pods.changes(),
        caches.volume_attachments.changes(),
        caches.nodes.changes(),
    ]
}

/// VolumeAttachments on `node` other than those of `keep_pvs`.
pub fn attachments_left(
    attachments: &[Arc<CachedVolumeAttachment>],
    node: &str,
    keep_pvs: &BTreeSet<String>,
) -> usize {
    attachments
        .iter()
        .filter(|va| va.node_name() == node)
        .filter(|va| {
            va.persistent_volume()
                .is_none_or(|pv| !keep_pvs.contains(pv))
        })
        .count()
}

/// The name of the Ready Node whose providerID ends in `/<instance id>`.
pub fn ready_node_for(nodes: &[Arc<Node>], id: &str) -> Option<String> {
    let suffix = format!("/{id}");
    nodes
        .iter()
        .find(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.ends_with(&suffix))
                && n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|n| n.name_any())
}

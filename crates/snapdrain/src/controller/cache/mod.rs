//! Shared caches of what snapdrain reads about the cluster, each kept by one watch per process
//! (kube-runtime `watcher`, the informer pattern of client-go tools/cache): Pods (indexed by node),
//! PVCs, StatefulSets, PDBs (by namespace), VolumeAttachments (by node), Nodes, NodeClaims,
//! Namespaces and the Velero Backups snapdrain made. Planning, drain waits, release, the hold keeper, the signal watcher and the eviction
//! gate read them instead of listing through the API on every pass (at 150,000 pods each list is a
//! scan on the server).
//!
//! - [`store`]: one kind's objects and index, swapped whole on a relist.
//! - [`pod`]: pods in a compact form, decoded straight from the API's JSON.
//! - [`node_claim`]: NodeClaims reduced to what the signal decisions read.
//! - [`stateful_set`], [`pvc`], [`volume_attachment`]: those kinds reduced to what planning and the
//!   drain read.
//! - [`intern`]: one copy of what pods repeat (namespaces, nodes, label keys, label sets, owners).
//! - [`token`]: uids and resourceVersions inline.
//! - [`trim`]: the fields dropped from the other kinds before an object is cached.
//!
//! Fail closed: a cache whose first list is not in is never read as "nothing there"; readers wait for
//! it ([`Caches::wait_synced`]) or read the API. Writes never send a cached object back: they are
//! patches guarded by its resourceVersion, so a stale cache costs a 409 and a retry, never an overwrite.

pub mod intern;
pub mod node_claim;
pub mod pod;
pub mod pvc;
pub mod stateful_set;
pub mod store;
pub mod token;
pub mod trim;
pub mod volume_attachment;

use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

pub use node_claim::CachedNodeClaim;
pub use pod::CachedPod;
pub use pvc::CachedPvc;
pub use stateful_set::CachedStatefulSet;
pub use store::{Cache, Stored};
pub use volume_attachment::CachedVolumeAttachment;

use crate::api::velero::Backup;
use crate::planning::backups::PLAN_LABEL;
use crate::telemetry::Metrics;

/// Every cache of the process. Cheap to clone.
#[derive(Clone)]
pub struct Caches {
    /// Pods in their compact form ([`CachedPod::to_pod`] gives a `Pod`).
    pub pods: Cache<CachedPod>,
    /// PVCs in their compact form ([`CachedPvc::to_pvc`]).
    pub pvcs: Cache<CachedPvc>,
    /// StatefulSets in their compact form ([`CachedStatefulSet::to_stateful_set`]).
    pub stateful_sets: Cache<CachedStatefulSet>,
    pub pdbs: Cache<PodDisruptionBudget>,
    /// VolumeAttachments in their compact form ([`CachedVolumeAttachment::to_volume_attachment`]).
    pub volume_attachments: Cache<CachedVolumeAttachment>,
    pub nodes: Cache<Node>,
    /// Karpenter NodeClaims: never synced in a cluster without Karpenter (the watch fails and backs
    /// off), which only means no NodeClaim signal is seen.
    pub node_claims: Cache<CachedNodeClaim>,
    pub namespaces: Cache<Namespace>,
    /// Velero Backups snapdrain made (labelled `snapdrain.io/plan`), in every namespace: the eviction
    /// gate confirms a plan's verified backup against them (`webhook::confirm`).
    pub backups: Cache<Backup>,
}

fn pod_node(p: &CachedPod) -> Option<String> {
    p.node_name().map(str::to_owned)
}

fn attachment_node(v: &CachedVolumeAttachment) -> Option<String> {
    Some(v.node_name().to_owned())
}

fn namespace_of<K: Resource>(o: &K) -> Option<String> {
    o.namespace()
}

fn none<K>(_: &K) -> Option<String> {
    None
}

/// A cache's first list did not come in within the wait.
#[derive(Debug, thiserror::Error)]
#[error(
    "the {kind} cache has not finished its first list after {waited:?}; snapdrain does not act on a cache it has not filled (check that snapdrain may list and watch {kind} cluster-wide, and the API server's health)"
)]
pub struct NotSynced {
    pub kind: &'static str,
    pub waited: Duration,
}

impl Caches {
    /// Empty caches, not synced (tests feed them events; [`Caches::start`] watches).
    pub fn new() -> Self {
        Self {
            pods: Cache::new("Pod", pod_node),
            pvcs: Cache::new("PersistentVolumeClaim", none),
            stateful_sets: Cache::new("StatefulSet", none),
            pdbs: Cache::new("PodDisruptionBudget", namespace_of),
            volume_attachments: Cache::new("VolumeAttachment", attachment_node),
            nodes: Cache::new("Node", none),
            node_claims: Cache::new("NodeClaim", none),
            namespaces: Cache::new("Namespace", none),
            backups: Cache::new("Backup", none),
        }
    }

    /// Starts one watch per kind. The tasks run until aborted.
    pub fn start(client: &Client, metrics: &Metrics) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        let c = Self::new();
        let started = Instant::now();
        let tasks = vec![
            follow(
                c.pods.clone(),
                Api::<pod::WirePod>::all(client.clone()),
                // Decoding into a WirePod is the trim; the cache keeps its compact form.
                CachedPod::from,
                metrics,
                started,
            ),
            follow(
                c.pvcs.clone(),
                Api::<PersistentVolumeClaim>::all(client.clone()),
                CachedPvc::from,
                metrics,
                started,
            ),
            follow(
                c.stateful_sets.clone(),
                Api::<StatefulSet>::all(client.clone()),
                CachedStatefulSet::from,
                metrics,
                started,
            ),
            follow(
                c.pdbs.clone(),
                Api::all(client.clone()),
                |mut o| {
                    trim::pdb(&mut o);
                    o
                },
                metrics,
                started,
            ),
            follow(
                c.volume_attachments.clone(),
                Api::<VolumeAttachment>::all(client.clone()),
                CachedVolumeAttachment::from,
                metrics,
                started,
            ),
            follow(
                c.nodes.clone(),
                Api::all(client.clone()),
                |mut o| {
                    trim::node(&mut o);
                    o
                },
                metrics,
                started,
            ),
            follow(
                c.node_claims.clone(),
                crate::signals::detect::nodeclaims(client),
                CachedNodeClaim::from,
                metrics,
                started,
            ),
            follow(
                c.namespaces.clone(),
                Api::all(client.clone()),
                |mut o| {
                    trim::namespace(&mut o);
                    o
                },
                metrics,
                started,
            ),
            follow_with(
                c.backups.clone(),
                Api::all(client.clone()),
                watcher::Config::default().labels(PLAN_LABEL),
                |mut o| {
                    trim::backup(&mut o);
                    o
                },
                metrics,
                started,
            ),
        ];
        (c, tasks)
    }

    /// Waits up to `timeout` for the caches planning and draining read (all but NodeClaims).
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), NotSynced> {
        let deadline = tokio::time::Instant::now() + timeout;
        macro_rules! wait {
            ($($c:ident),*) => {$(
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if !self.$c.wait_synced(left).await {
                    return Err(NotSynced { kind: self.$c.kind(), waited: timeout });
                }
            )*};
        }
        wait!(
            pods,
            pvcs,
            stateful_sets,
            pdbs,
            volume_attachments,
            nodes,
            namespaces
        );
        Ok(())
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self::new()
    }
}

/// What the cache keeps of one watched object: `W` as the watch decoded it, `K` as the cache holds it.
fn keep_event<W, K>(event: watcher::Event<W>, keep: fn(W) -> K) -> watcher::Event<K> {
    use watcher::Event;
    match event {
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(keep(o)),
        Event::InitDone => Event::InitDone,
        Event::Apply(o) => Event::Apply(keep(o)),
        Event::Delete(o) => Event::Delete(keep(o)),
    }
}

/// Feeds one kind's watch into its cache, trimmed by `keep`, and keeps `snapdrain_cache_objects{kind}` and
/// `snapdrain_cache_lists_total{kind}`. Logs the first sync (with its duration) at info, relists at debug.
fn follow<W, K>(
    cache: Cache<K>,
    api: Api<W>,
    keep: fn(W) -> K,
    metrics: &Metrics,
    started: Instant,
) -> tokio::task::JoinHandle<()>
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: Stored + Send + Sync + 'static,
{
    follow_with(
        cache,
        api,
        watcher::Config::default(),
        keep,
        metrics,
        started,
    )
}

/// [`follow`] with a watch of its own (a label selector).
fn follow_with<W, K>(
    cache: Cache<K>,
    api: Api<W>,
    config: watcher::Config,
    keep: fn(W) -> K,
    metrics: &Metrics,
    started: Instant,
) -> tokio::task::JoinHandle<()>
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: Stored + Send + Sync + 'static,
{
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let kind = cache.kind();
        let stream = watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let listed = matches!(event, watcher::Event::InitDone);
                    cache.apply(keep_event(event, keep));
                    metrics.cache_objects(kind, cache.len());
                    if listed {
                        metrics.cache_listed(kind);
                        if cache.lists() == 1 {
                            tracing::info!(kind, objects = cache.len(), elapsed = ?started.elapsed(), "cache synced");
                        } else {
                            tracing::debug!(kind, objects = cache.len(), "cache relisted");
                        }
                    }
                }
                // The backoff retries; a 410 Gone makes the watcher relist (Init..InitDone).
                Err(e) => tracing::debug!(kind, error = %e, "cache watch"),
            }
        }
    })
}

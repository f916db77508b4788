//! `snapdrain holds list` and `snapdrain holds release --all`: the pods carrying snapdrain's holds, and
//! taking every one of them away (before an uninstall). Which annotations are snapdrain's is
//! [`snapdrain::planning::holds`]: only those listed in `snapdrain.io/held` and still at the value
//! snapdrain wrote, plus its own `snapdrain.io/held` and `snapdrain.io/released-by`; a user's own
//! `do-not-disrupt` or `safe-to-evict` is never touched.
//!
//! `release` also takes snapdrain's `karpenter.sh/do-not-disrupt` off every Node that carries it (the
//! node-level hold, [`snapdrain::planning::holds`]), again only where `snapdrain.io/held` says it is
//! snapdrain's.
//!
//! Then, as the rollbacks of plans that did not complete would have, it undoes their cordons and
//! taints and takes snapdrain's finalizer off every plan ([`super::cordons`]).
//!
//! A running controller's hold keeper places the holds again within seconds: scale the Deployment to 0
//! first, or pass `--stop-deployment` (the chart's pre-delete hook does, after
//! `--delete-webhook-configuration`; see [`super::uninstall`]).

use std::fmt::Write as _;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use clap::{Args, Subcommand};
use futures::StreamExt;
use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::cluster::ClusterArgs;
use snapdrain::api::lenient::each_page;
use snapdrain::planning::holds::{self, AnnotationPatch, HoldState};

#[derive(Debug, Subcommand)]
pub enum HoldsCommand {
    /// The pods carrying snapdrain's holds: namespace, pod, node, and which annotations are snapdrain's.
    List(ListArgs),
    /// Remove every hold snapdrain placed, and nothing else (a user's own annotations stay); undo the
    /// cordons and taints of plans that did not complete and take snapdrain's finalizer off every plan.
    /// Stop the controller first (scale it to 0 or uninstall it), or its hold keeper places them again.
    Release(ReleaseArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Every pod in every namespace (required: releasing is all or nothing for now).
    #[arg(long, required = true)]
    pub all: bool,
    /// First delete this ValidatingWebhookConfiguration (snapdrain's eviction gate), so a gate that is
    /// going away never delays or refuses an eviction. The chart's pre-delete hook passes its own.
    #[arg(long, value_name = "NAME")]
    pub delete_webhook_configuration: Option<String>,
    /// Then scale this controller Deployment to 0 and wait until its pods are gone, so its hold keeper
    /// cannot place the holds again. The chart's pre-delete hook passes its own.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub stop_deployment: Option<String>,
    /// How long to wait for the Deployment's pods to go (s, m, h or d).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration)]
    pub stop_timeout: Duration,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

fn duration(value: &str) -> Result<Duration, String> {
    snapdrain::api::validate::parse_duration(value)
        .ok_or_else(|| format!("{value:?} is not a duration: a number then s, m, h or d (e.g. 5m)"))
}

/// What went wrong listing or patching pods.
#[derive(Debug, thiserror::Error)]
pub enum HoldsError {
    #[error(
        "cannot list pods in all namespaces (the kubeconfig's user needs `list pods` cluster-wide: `kubectl auth can-i list pods -A`)"
    )]
    List(#[source] kube::Error),
    #[error(
        "cannot remove snapdrain's holds from pod {pod} (needs `get` and `patch` on pods: `kubectl auth can-i patch pods -n NAMESPACE`)"
    )]
    Patch {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{object} kept changing while its holds were removed; is a snapdrain controller still running? Scale it to 0 and run the command again"
    )]
    Conflicts { object: String },
    #[error(
        "cannot list nodes (the kubeconfig's user needs `list nodes`: `kubectl auth can-i list nodes`)"
    )]
    ListNodes(#[source] kube::Error),
    #[error(
        "cannot remove snapdrain's hold from node {node} (needs `get` and `patch` on nodes: `kubectl auth can-i patch nodes`)"
    )]
    PatchNode {
        node: String,
        #[source]
        source: kube::Error,
    },
}

impl HoldsError {
    /// A 409 (the pod changed since it was read): read it again and retry.
    fn is_conflict(&self) -> bool {
        matches!(
            self,
            Self::Patch { source: kube::Error::Api(s), .. }
                | Self::PatchNode { source: kube::Error::Api(s), .. }
                if s.code == 409
        )
    }
}

/// One pod carrying snapdrain's holds, as `holds list` shows it (ordered by namespace, then name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldPod {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// Which of the pod's annotations are snapdrain's.
    pub ours: String,
}

/// The pod as a [`HeldPod`], or None when it carries nothing of snapdrain's.
pub fn held_pod(pod: &Pod) -> Option<HeldPod> {
    let ours = match holds::state(pod) {
        HoldState::Unheld => return None,
        HoldState::Held(short) => short.join(","),
        HoldState::Released(plan) => format!("released by plan {plan}"),
    };
    Some(HeldPod {
        namespace: pod.namespace().unwrap_or_default(),
        pod: pod.name_any(),
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| "-".into()),
        ours,
    })
}

/// The table `holds list` prints (kubectl-like columns).
pub fn table(rows: &[HeldPod]) -> String {
    let header = ["NAMESPACE", "POD", "NODE", "SNAPDRAIN'S HOLDS"];
    let cells: Vec<[&str; 4]> = rows
        .iter()
        .map(|r| [&r.namespace[..], &r.pod, &r.node, &r.ours])
        .collect();
    let mut widths = header.map(str::len);
    for r in &cells {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&cells) {
        let mut l = String::new();
        for (i, c) in r.iter().enumerate() {
            let _ = write!(l, "{c:<w$}   ", w = widths[i]);
        }
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

/// The line `holds release` prints for a pod it changed: the annotations it took away.
pub fn removed_line(pod: &str, patch: &AnnotationPatch) -> String {
    let keys: Vec<&str> = patch
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.as_str())
        .collect();
    format!("{pod}: removed {}", keys.join(", "))
}

/// What `keep` picks of every pod, read a page at a time: the uninstall hook runs under a small memory
/// limit in clusters of any size (review #8), so it holds one page and what it kept, never every pod.
/// Sorted by what `keep` returns.
async fn each_pod<T: Ord>(
    client: &kube::Client,
    keep: impl Fn(&Pod) -> Option<T>,
) -> Result<Vec<T>, HoldsError> {
    let mut kept = each_page(&Api::<Pod>::all(client.clone()), |p| keep(&p))
        .await
        .map_err(HoldsError::List)?;
    kept.sort();
    Ok(kept)
}

/// Removes snapdrain's holds (what `remove` finds) from one object, read afresh, with a patch guarded
/// by its resourceVersion (a concurrent edit, e.g. a user's own annotation, makes it 409 rather than be
/// overwritten). Returns the changes made, or None when the object is gone or carries nothing of
/// snapdrain's any more.
async fn release_one<K>(
    api: &Api<K>,
    name: &str,
    remove: fn(&K) -> Option<AnnotationPatch>,
    patch_error: impl Fn(kube::Error) -> HoldsError,
) -> Result<Option<AnnotationPatch>, HoldsError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Metadata<Ty = ObjectMeta>,
{
    let Some(obj) = api.get_opt(name).await.map_err(&patch_error)? else {
        return Ok(None);
    };
    let Some(patch) = remove(&obj) else {
        return Ok(None);
    };
    let body = holds::merge_patch(&obj, &patch);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(Some(patch)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(patch_error(e)),
    }
}
/// [`release_one`], read again and retried while the object changes under it (a 409). `what` names the
/// object in the error that ends the retries.
async fn release_retrying<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    remove: fn(&K) -> Option<AnnotationPatch>,
    patch_error: impl Fn(kube::Error) -> HoldsError,
) -> Result<Option<AnnotationPatch>, HoldsError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Metadata<Ty = ObjectMeta>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .with_max_times(8);
    let result = (|| release_one(api, name, remove, &patch_error))
        .retry(backoff)
        .when(HoldsError::is_conflict)
        .await;
    match result {
        Err(e) if e.is_conflict() => Err(HoldsError::Conflicts {
            object: what.to_owned(),
        }),
        other => other,
    }
}

/// Takes snapdrain's hold off one pod.
async fn release_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<AnnotationPatch>, HoldsError> {
    let pod = format!("{namespace}/{name}");
    let patch_error = |source| HoldsError::Patch {
        pod: pod.clone(),
        source,
    };
    let api = Api::<Pod>::namespaced(client.clone(), namespace);
    release_retrying(&api, name, &pod, holds::remove, patch_error).await
}

/// The Nodes carrying snapdrain's hold, read a page at a time.
async fn held_nodes(client: &kube::Client) -> Result<Vec<String>, HoldsError> {
    each_page(&Api::<Node>::all(client.clone()), |n| {
        holds::remove_from_node(&n).is_some().then(|| n.name_any())
    })
    .await
    .map_err(HoldsError::ListNodes)
}

/// Takes snapdrain's hold off each of `nodes`; returns the lines to print.
async fn release_nodes(
    client: &kube::Client,
    nodes: Vec<String>,
) -> Result<Vec<String>, HoldsError> {
    let api = Api::<Node>::all(client.clone());
    let mut lines = Vec::new();
    for name in nodes {
        let what = format!("node/{name}");
        let patch_error = |source| HoldsError::PatchNode {
            node: name.clone(),
            source,
        };
        if let Some(patch) =
            release_retrying(&api, &name, &what, holds::remove_from_node, patch_error).await?
        {
            lines.push(removed_line(&what, &patch));
        }
    }
    Ok(lines)
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let rows: Vec<HeldPod> = each_pod(&client, held_pod).await?;
    if rows.is_empty() {
        println!("no pod carries snapdrain's holds");
    } else {
        print!("{}", table(&rows));
    }
    Ok(())
}

/// How many pods are patched at once.
const PARALLEL: usize = 8;

async fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    // `--all` is required by clap; the flag keeps the command from doing everything by accident.
    debug_assert!(args.all);
    let client = args.cluster.client().await?;
    // Checked before anything changes.
    let stop = args
        .stop_deployment
        .as_deref()
        .map(super::uninstall::deployment_ref)
        .transpose()?;
    if let Some(name) = &args.delete_webhook_configuration
        && super::uninstall::delete_webhook_configuration(&client, name).await?
    {
        println!("deleted ValidatingWebhookConfiguration {name}");
    }
    if let Some((ns, name)) = &stop {
        super::uninstall::stop_deployment(&client, ns, name, args.stop_timeout).await?;
        println!("Deployment {ns}/{name} is scaled to 0 and its pods are gone");
    }
    // All listed (and the plans' finalizer patches tried as a dry run) before anything changes, so a
    // missing right changes nothing.
    let candidates: Vec<(String, String)> = each_pod(&client, |p| {
        holds::remove(p)
            .is_some()
            .then(|| (p.namespace().unwrap_or_default(), p.name_any()))
    })
    .await?;
    let nodes = held_nodes(&client).await?;
    let (plans, finalized) = super::cordons::plans(&client).await?;
    super::cordons::check_finalizers(&client, &finalized).await?;
    // Nodes first: while a pod is still held its node stays so on Karpenter's side only for drift
    // under a terminationGracePeriod; a pod hold left behind by a failure here would keep more.
    for line in release_nodes(&client, nodes).await? {
        println!("{line}");
    }
    // Then what the plans that did not complete would have rolled back: their cordons and taints.
    for line in super::cordons::undo_nodes(&client, &super::cordons::to_undo(&plans)).await? {
        println!("{line}");
    }
    if candidates.is_empty() {
        println!("no pod carries snapdrain's holds; nothing to release");
    } else {
        release_pods(&client, candidates).await?;
    }
    // Last, once nothing of the plans is left on the cluster: the finalizer only a running controller
    // removes.
    for line in super::cordons::remove_finalizers(&client, finalized).await? {
        println!("{line}");
    }
    Ok(())
}

/// Takes snapdrain's holds off each of `candidates` (namespace, name), a few at a time.
async fn release_pods(
    client: &kube::Client,
    candidates: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let results: Vec<(String, Result<Option<AnnotationPatch>, HoldsError>)> =
        futures::stream::iter(candidates)
            .map(|(ns, name)| {
                let client = client.clone();
                async move {
                    let r = release_pod(&client, &ns, &name).await;
                    (format!("{ns}/{name}"), r)
                }
            })
            .buffered(PARALLEL)
            .collect()
            .await;
    let mut released = 0usize;
    let mut failed = Vec::new();
    for (pod, r) in results {
        match r {
            Ok(Some(patch)) => {
                released += 1;
                println!("{}", removed_line(&pod, &patch));
            }
            Ok(None) => {}
            Err(e) => failed.push(e),
        }
    }
    println!("released snapdrain's holds on {released} pods");
    if let Some(first) = failed.into_iter().next() {
        return Err(anyhow::Error::new(first).context(
            "some pods still carry snapdrain's holds; fix the cause below and run `holds release --all` again",
        ));
    }
    Ok(())
}

pub async fn run(command: HoldsCommand) -> anyhow::Result<()> {
    match command {
        HoldsCommand::List(args) => list(args).await,
        HoldsCommand::Release(args) => release(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdrain::planning::holds::{HELD_ANNOTATION, RELEASED_ANNOTATION};

    fn pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn held_and_released_pods_are_listed_and_a_users_own_is_not() {
        let held = pod(
            "postgres-0",
            &[
                ("karpenter.sh/do-not-disrupt", "true"),
                (HELD_ANNOTATION, "do-not-disrupt"),
            ],
        );
        let released = pod("redis-0", &[(RELEASED_ANNOTATION, "p1")]);
        let users = pod("web-0", &[("karpenter.sh/do-not-disrupt", "true")]);
        let rows: Vec<HeldPod> = [held, released, users]
            .iter()
            .filter_map(held_pod)
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].ours, "do-not-disrupt");
        assert_eq!(rows[0].node, "-");
        assert_eq!(rows[1].ours, "released by plan p1");
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   POD          NODE   SNAPDRAIN'S HOLDS"
        );
        assert_eq!(lines[1], "shop        postgres-0   -      do-not-disrupt");
        assert_eq!(
            lines[2],
            "shop        redis-0      -      released by plan p1"
        );
    }

    #[test]
    fn the_removed_line_names_each_annotation_taken_away() {
        let patch: AnnotationPatch = [
            ("karpenter.sh/do-not-disrupt".to_string(), None),
            (HELD_ANNOTATION.to_string(), None),
        ]
        .into();
        assert_eq!(
            removed_line("shop/postgres-0", &patch),
            "shop/postgres-0: removed karpenter.sh/do-not-disrupt, snapdrain.io/held"
        );
    }
}

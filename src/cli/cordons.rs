//! What `holds release --all` undoes on nodes and plans besides the holds, once the controller is
//! stopped (security review M-4): the cordon and `snapdrain.io/draining` taint of every plan that did
//! not complete, as its rollback would have, and snapdrain's `snapdrain.io/rollback` finalizer on
//! every plan, which only a running controller removes and which would otherwise keep the plans (and
//! the CRD) from being deleted. A Completed plan's node stays as the plan left it: draining it was
//! the point. A node someone else cordoned, or a taint someone else set, is never touched: only what a
//! plan's status records snapdrain itself set ([`snapdrain::api::status::NodeProgress`]).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::lenient::{Lenient, each_page};
use snapdrain::api::status::PlanPhase;

/// The finalizer snapdrain puts on each plan (its rollback on deletion).
const FINALIZER: &str = snapdrain::controller::FINALIZER;

/// What to undo on one node: the cordon, the taint, or both, and the plans that recorded them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Undo {
    pub uncordon: bool,
    pub untaint: bool,
    pub plans: Vec<String>,
}

/// What went wrong undoing a plan's marks.
#[derive(Debug, thiserror::Error)]
pub enum CordonsError {
    #[error(
        "cannot list DisruptionPlans (the kubeconfig's user needs `list disruptionplans`: `kubectl auth can-i list disruptionplans.snapdrain.io`)"
    )]
    ListPlans(#[source] kube::Error),
    #[error(transparent)]
    Node(#[from] snapdrain::drain::DrainError),
    #[error(
        "cannot remove snapdrain's finalizer from DisruptionPlan {plan} (needs `patch` on disruptionplans); remove it by hand with `kubectl patch disruptionplan {plan} --type json -p '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'` once nothing of it is left on the cluster"
    )]
    Finalizer {
        plan: String,
        #[source]
        source: kube::Error,
    },
}

/// The nodes whose cordon or taint snapdrain set for a plan that did not complete, by node name.
pub fn to_undo(plans: &[DisruptionPlan]) -> BTreeMap<String, Undo> {
    let mut out: BTreeMap<String, Undo> = BTreeMap::new();
    for plan in plans {
        let Some(status) = &plan.status else { continue };
        if status.phase == PlanPhase::Completed {
            continue;
        }
        for n in &status.nodes {
            if !n.cordoned_by_snapdrain && !n.tainted_by_snapdrain {
                continue;
            }
            let undo = out.entry(n.name.clone()).or_default();
            undo.uncordon |= n.cordoned_by_snapdrain;
            undo.untaint |= n.tainted_by_snapdrain;
            undo.plans.push(plan.name_any());
        }
    }
    out
}

/// The line printed for a node put back.
pub fn undone_line(node: &str, undo: &Undo) -> String {
    let what = match (undo.uncordon, undo.untaint) {
        (true, true) => "uncordoned, removed the snapdrain.io/draining taint",
        (true, false) => "uncordoned",
        _ => "removed the snapdrain.io/draining taint",
    };
    format!(
        "node/{node}: {what} (DisruptionPlan {})",
        undo.plans.join(", ")
    )
}

/// A plan carrying snapdrain's finalizer, as listed.
#[derive(Clone, Debug)]
pub struct Finalized {
    pub name: String,
    pub resource_version: Option<String>,
    pub finalizers: Vec<String>,
}

impl Finalized {
    fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Self> {
        let finalizers = meta.finalizers.clone().unwrap_or_default();
        finalizers.iter().any(|f| f == FINALIZER).then(|| Self {
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            finalizers,
        })
    }

    /// The merge patch that takes snapdrain's finalizer off, guarded by the resourceVersion it was read
    /// at (a merge patch replaces the list, so a finalizer another tool added meanwhile makes it a 409,
    /// never lost).
    fn patch(&self) -> serde_json::Value {
        let kept: Vec<&String> = self.finalizers.iter().filter(|f| *f != FINALIZER).collect();
        json!({"metadata": {"resourceVersion": self.resource_version, "finalizers": kept}})
    }
}

/// The plans as listed, one page at a time, and those carrying snapdrain's finalizer; a plan that does
/// not decode is named on stderr and only its finalizer is handled.
pub async fn plans(
    client: &kube::Client,
) -> Result<(Vec<DisruptionPlan>, Vec<Finalized>), CordonsError> {
    let api: Api<Lenient<DisruptionPlan>> = Api::all(client.clone());
    let listed = match each_page(&api, Some).await {
        Ok(listed) => listed,
        // The CRD is not (or no longer) installed: there is no plan to undo.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(CordonsError::ListPlans(e)),
    };
    let mut decoded = Vec::new();
    let mut finalized = Vec::new();
    for p in listed {
        match p {
            Lenient::Decoded(plan) => {
                finalized.extend(Finalized::of(&plan.metadata));
                decoded.push(plan);
            }
            Lenient::Undecodable(u) => {
                let name = u.metadata.name.clone().unwrap_or_default();
                // Escaped: the text comes from what the cluster stored (review L-7).
                eprintln!(
                    "DisruptionPlan {} cannot be read ({}): its nodes' cordons are not undone; check them with `kubectl get nodes`",
                    super::terminal::escape_controls(&name),
                    super::terminal::escape_controls(&u.error)
                );
                finalized.extend(Finalized::of(&u.metadata));
            }
        }
    }
    Ok((decoded, finalized))
}

/// Undoes each node's marks; returns the lines to print for the nodes it changed.
pub async fn undo_nodes(
    client: &kube::Client,
    undo: &BTreeMap<String, Undo>,
) -> Result<Vec<String>, CordonsError> {
    let mut lines = Vec::new();
    for (node, u) in undo {
        if snapdrain::drain::cordon::release(client, node, u.uncordon, u.untaint).await? {
            lines.push(undone_line(node, u));
        }
    }
    Ok(lines)
}

/// Checks, before anything changes, that each finalizer can be taken off: the same patches as a dry run
/// (a missing `patch` right is a 403 here, not after the holds went).
pub async fn check_finalizers(
    client: &kube::Client,
    plans: &[Finalized],
) -> Result<(), CordonsError> {
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    for p in plans {
        match api
            .patch(
                &p.name,
                &PatchParams::default().dry_run(),
                &Patch::Merge(p.patch()),
            )
            .await
        {
            // Changed or gone since the listing: the real patch reads it again.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(source) => {
                return Err(CordonsError::Finalizer {
                    plan: p.name.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Takes snapdrain's finalizer off each plan; a plan changed since the listing (409) is listed again by
/// name and tried once more, up to a few times. Returns the lines to print.
pub async fn remove_finalizers(
    client: &kube::Client,
    plans: Vec<Finalized>,
) -> Result<Vec<String>, CordonsError> {
    const ATTEMPTS: u32 = 5;
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    let mut lines = Vec::new();
    for listed in plans {
        let name = listed.name.clone();
        let failed = |source| CordonsError::Finalizer {
            plan: name.clone(),
            source,
        };
        let mut current = Some(listed);
        for attempt in 1..=ATTEMPTS {
            let Some(p) = current.take() else { break };
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(p.patch()))
                .await
            {
                Ok(_) => {
                    lines.push(format!(
                        "disruptionplan/{name}: removed finalizer {FINALIZER}"
                    ));
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                    // By list, not get: the uninstall hook's role needs no `get` on plans.
                    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
                    let again = api.list(&lp).await.map_err(failed)?;
                    current = again.items.first().and_then(|p| Finalized::of(&p.metadata));
                }
                Err(kube::Error::Api(s)) if s.code == 404 => break,
                Err(e) => return Err(failed(e)),
            }
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, phase: &str, nodes: serde_json::Value) -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name}, "spec": {"nodes": ["n1"]},
            "status": {"phase": phase, "nodes": nodes}
        }))
        .expect("a plan")
    }

    #[test]
    fn only_what_a_plan_that_did_not_complete_recorded_is_undone() {
        let plans = [
            plan(
                "running",
                "Draining",
                json!([{"name": "n1", "cordonedBySnapdrain": true, "taintedBySnapdrain": true}]),
            ),
            // Someone else had cordoned n2: snapdrain only tainted it.
            plan(
                "failed",
                "Failed",
                json!([{"name": "n2", "cordonedBySnapdrain": false, "taintedBySnapdrain": true}]),
            ),
            // Drained on purpose: left as it is.
            plan(
                "done",
                "Completed",
                json!([{"name": "n3", "cordonedBySnapdrain": true, "taintedBySnapdrain": true}]),
            ),
            // Rolled back already: nothing recorded.
            plan("aborted", "Aborted", json!([{"name": "n4"}])),
        ];
        let undo = to_undo(&plans);
        assert_eq!(undo.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(
            undo["n1"],
            Undo {
                uncordon: true,
                untaint: true,
                plans: vec!["running".into()]
            }
        );
        assert!(!undo["n2"].uncordon && undo["n2"].untaint);
        assert_eq!(
            undone_line("n2", &undo["n2"]),
            "node/n2: removed the snapdrain.io/draining taint (DisruptionPlan failed)"
        );
    }
}

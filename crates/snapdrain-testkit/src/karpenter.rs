//! Karpenter's side of a disruption, as tests and the demo drive it through the API.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The NodeClaims API (`karpenter.sh/v1`).
pub fn nodeclaims(client: &Client) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
    )
}

/// Sets `Drifted=True` (reason AMIDrift) on NodeClaim `name`, as Karpenter's drift controller does when
/// the EC2NodeClass resolves a newer AMI (kubernetes-sigs/karpenter
/// `pkg/controllers/nodeclaim/disruption/drift.go`).
pub async fn mark_drifted(client: &Client, name: &str) -> Result<(), kube::Error> {
    let api = nodeclaims(client);
    let claim = api.get(name).await?;
    let mut conditions = claim.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.push(
        json!({"type": "Drifted", "status": "True", "reason": "AMIDrift",
        "message": "the EC2NodeClass resolves a newer Bottlerocket AMI",
        "lastTransitionTime": jiff::Timestamp::now().to_string()}),
    );
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": conditions}})),
    )
    .await?;
    Ok(())
}

/// Marks every NodeClaim drifted; returns how many.
pub async fn mark_all_drifted(client: &Client) -> Result<usize, kube::Error> {
    let claims = nodeclaims(client).list(&Default::default()).await?;
    for c in &claims.items {
        mark_drifted(client, &c.name_any()).await?;
    }
    Ok(claims.items.len())
}

/// Gives NodeClaim `name` a `spec.terminationGracePeriod`, as Karpenter does when it creates the claim
/// from its NodePool's template. A client cannot add it later (the NodeClaim CRD's CEL rule
/// `self == oldSelf` makes the spec immutable), so this writes as the simulated Karpenter writes.
pub fn set_termination_grace_period(
    sim: &snapdrain_sim::SimCluster,
    name: &str,
    period: &str,
) -> Result<(), String> {
    sim.store
        .modify(
            &snapdrain_sim::apiserver::resources::ResKey::new("karpenter.sh", "nodeclaims"),
            None,
            name,
            None,
            snapdrain_sim::apiserver::store::WriteOptions {
                dry_run: false,
                internal: true,
            },
            |c| {
                let mut c = c.clone();
                c["spec"]["terminationGracePeriod"] = json!(period);
                Ok(c)
            },
        )
        .map(|_| ())
        .map_err(|e| e.message)
}

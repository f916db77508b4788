//! AMI drift: which AMI of its EC2NodeClass a NodeClaim launches with, and when a change of the class's
//! resolved AMIs (`status.amis`: a new Bottlerocket release behind `bottlerocket@latest`, or an
//! operator's edit) makes it Drifted.
//!
//! karpenter-provider-aws `pkg/providers/amifamily/ami.go` `MapToInstanceTypes`: each instance type gets
//! the first AMI of `status.amis` (newest first) whose requirements its requirements are compatible
//! with. `pkg/cloudprovider/drift.go` `isAMIDrifted`: a NodeClaim whose `status.imageID` is not among the
//! AMIs so mapped to its instance type is drifted, reason `AMIDrift`. Core
//! `pkg/controllers/nodeclaim/disruption/drift.go` `Drift.Reconcile` looks only at Launched NodeClaims
//! and sets `Drifted=True` with the reason as reason and message; the disruption controller's Drift
//! method then replaces them ([`super::disruption`]). The sim does not clear a Drifted condition: the
//! scenario timeline's `markDrifted` stands for drift it does not compute.

use serde_json::Value;

use super::{condition_true, modify_claim, set_condition};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::world::WorldContext;

pub const AMI_DRIFT: &str = "AMIDrift";

pub(crate) fn classes() -> ResKey {
    ResKey::new("karpenter.k8s.aws", "ec2nodeclasses")
}

/// The NodeClaim's label `key`, or the value of its `In` requirement on it.
fn claim_value(claim: &Value, key: &str) -> Option<String> {
    claim
        .pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| super::requirement(claim, key))
}

/// Whether an AMI's requirements are compatible with the NodeClaim's: for each `In`/`NotIn` on a key
/// the NodeClaim pins, its value must be allowed; a key it does not pin is compatible.
fn compatible(ami: &Value, claim: &Value) -> bool {
    ami["requirements"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|r| {
            let Some(key) = r["key"].as_str() else {
                return true;
            };
            let Some(have) = claim_value(claim, key) else {
                return true;
            };
            let values: Vec<&str> = r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match r["operator"].as_str() {
                Some("In") => values.contains(&have.as_str()),
                Some("NotIn") => !values.contains(&have.as_str()),
                _ => true,
            }
        })
}

/// The NodeClaim's EC2NodeClass.
fn class_of(ctx: &WorldContext, claim: &Value) -> Option<std::sync::Arc<Value>> {
    let name = claim
        .pointer("/spec/nodeClassRef/name")
        .and_then(Value::as_str)?;
    ctx.store.get(&classes(), None, name)
}

/// The AMI the NodeClaim launches with: the first of its class's `status.amis` compatible with it
/// (`MapToInstanceTypes`). None: no class, or none fits (the cloud provider's default is used).
pub fn launch_image(ctx: &WorldContext, claim: &Value) -> Option<String> {
    let class = class_of(ctx, claim)?;
    mapped_ami(&class, claim)
}

fn mapped_ami(class: &Value, claim: &Value) -> Option<String> {
    class["status"]["amis"]
        .as_array()?
        .iter()
        .find(|a| compatible(a, claim))
        .and_then(|a| a["id"].as_str())
        .map(str::to_string)
}

/// `isAMIDrifted` over the class as it is now: the NodeClaim runs an image that is not the one its
/// class maps to it. No AMIs in the class, or no image recorded: not drifted (Karpenter errors).
pub fn ami_drifted(class: &Value, claim: &Value) -> bool {
    let Some(image) = claim.pointer("/status/imageID").and_then(Value::as_str) else {
        return false;
    };
    if image.is_empty() {
        return false;
    }
    mapped_ami(class, claim).is_some_and(|mapped| mapped != image)
}

/// Marks the NodeClaim `Drifted=True` (reason and message `AMIDrift`) when it is Launched, not drifted
/// yet and its image is no longer its class's.
pub fn reconcile(ctx: &WorldContext, claim: &Value) {
    if !condition_true(claim, "Launched") || condition_true(claim, "Drifted") {
        return;
    }
    let Some(class) = class_of(ctx, claim) else {
        return;
    };
    if !ami_drifted(&class, claim) {
        return;
    }
    let name = meta_str(claim, "name").unwrap_or_default().to_string();
    if modify_claim(ctx, &name, |v| {
        set_condition(v, "Drifted", "True", AMI_DRIFT, AMI_DRIFT)
    })
    .is_ok()
    {
        ctx.audit.world(
            "nodeclaim-drifted",
            "nodeclaims.karpenter.sh",
            None,
            Some(&name),
            serde_json::json!({"reason": AMI_DRIFT, "imageID": claim.pointer("/status/imageID")}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(amis: Value) -> Value {
        json!({"status": {"amis": amis}})
    }

    fn ami(id: &str, arch: &str) -> Value {
        json!({"id": id, "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": [arch]}]})
    }

    fn claim(image: &str, arch: &str) -> Value {
        json!({"metadata": {"labels": {"kubernetes.io/arch": arch}},
               "status": {"imageID": image, "conditions": [{"type": "Launched", "status": "True"}]}})
    }

    #[test]
    fn the_first_ami_of_the_claims_architecture_is_mapped() {
        let c = class(json!([ami("ami-arm", "arm64"), ami("ami-x86", "amd64")]));
        assert_eq!(
            mapped_ami(&c, &claim("", "amd64")).as_deref(),
            Some("ami-x86")
        );
        assert_eq!(
            mapped_ami(&c, &claim("", "arm64")).as_deref(),
            Some("ami-arm")
        );
    }

    #[test]
    fn a_claim_on_an_ami_its_class_no_longer_maps_is_drifted() {
        let old = class(json!([ami("ami-old", "amd64")]));
        let new = class(json!([ami("ami-new", "amd64"), ami("ami-old", "amd64")]));
        let c = claim("ami-old", "amd64");
        assert!(!ami_drifted(&old, &c));
        assert!(
            ami_drifted(&new, &c),
            "a newer AMI of its architecture comes first"
        );
        let other_arch = class(json!([
            ami("ami-arm-new", "arm64"),
            ami("ami-old", "amd64")
        ]));
        assert!(
            !ami_drifted(&other_arch, &c),
            "an arm64 release does not drift amd64 nodes"
        );
        assert!(
            !ami_drifted(&class(json!([])), &c),
            "no AMIs: Karpenter errors, no drift"
        );
    }
}

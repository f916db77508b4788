//! policy/v1 PodDisruptionBudget (`k8s.io/api/policy/v1/generated.proto`), as `kubectl create pdb`
//! fills it (`kubectl/pkg/cmd/create/create_pdb.go`: selector, minAvailable or maxUnavailable).

use k8s_pb::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::meta;

pub fn pod_disruption_budget(p: PodDisruptionBudget) -> Result<Value> {
    let PodDisruptionBudget {
        metadata,
        spec,
        status,
    } = p;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, |path, s: PodDisruptionBudgetSpec| {
        let PodDisruptionBudgetSpec {
            min_available,
            selector,
            max_unavailable,
            unhealthy_pod_eviction_policy,
        } = s;
        let mut o = Obj::new(path);
        o.message("minAvailable", min_available, meta::int_or_string)?;
        o.message("selector", selector, meta::label_selector)?;
        o.message("maxUnavailable", max_unavailable, meta::int_or_string)?;
        o.ptr("unhealthyPodEvictionPolicy", unhealthy_pod_eviction_policy);
        o.done()
    })?;
    o.unmapped("status", &status)?;
    o.done()
}

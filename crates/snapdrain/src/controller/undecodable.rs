//! Plans the controller cannot decode (api::lenient): said once per spec change, where a person looks,
//! and otherwise left alone. Such a plan is never acted on: its holds stay, nothing is evicted for it.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::context::Context;
use crate::api::lenient::Undecodable;
use crate::api::{DisruptionPlan, DisruptionPlanSpec};
use crate::telemetry::metrics::ReasonLabel;

/// A plan with only its metadata, for the reflector to drop an undecodable plan that was deleted.
pub fn stub(metadata: ObjectMeta) -> DisruptionPlan {
    DisruptionPlan {
        metadata,
        spec: DisruptionPlanSpec::default(),
        status: None,
    }
}

/// What a person reads about a plan that cannot be decoded. The serde error is cut to a readable size.
pub fn message(error: &str) -> String {
    let error: String = error.chars().take(300).collect();
    format!(
        "snapdrain cannot read this plan ({error}); it does nothing for it until the plan is fixed or deleted"
    )
}

/// Reports each undecodable plan once per generation (a spec change may fix it): an error log, the
/// `snapdrain_reconcile_errors_total{reason="undecodable"}` counter, `status.message` (a merge patch of
/// that field only, so nothing else in a status snapdrain cannot read is lost) and a Warning Event.
pub async fn report(ctx: Arc<Context>, mut plans: UnboundedReceiver<Undecodable>) {
    let mut reported: HashSet<(String, Option<i64>)> = HashSet::new();
    let api: Api<DisruptionPlan> = Api::all(ctx.client.clone());
    while let Some(u) = plans.recv().await {
        let Some(name) = u.metadata.name.clone() else {
            tracing::error!(error = %u.error, "a DisruptionPlan without a readable name cannot be decoded");
            continue;
        };
        let key = (
            u.metadata.uid.clone().unwrap_or_default(),
            u.metadata.generation,
        );
        if !reported.insert(key) {
            continue;
        }
        let message = message(&u.error);
        tracing::error!(plan = %name, error = %u.error, "cannot decode DisruptionPlan");
        ctx.metrics
            .reconcile_errors
            .get_or_create(&ReasonLabel {
                reason: "undecodable".into(),
            })
            .inc();
        let patch = json!({"status": {"message": message}});
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(plan = %name, error = %e, "cannot record that the plan is undecodable");
        }
        let reference = ObjectReference {
            api_version: Some(DisruptionPlan::api_version(&()).into_owned()),
            kind: Some(DisruptionPlan::kind(&()).into_owned()),
            name: Some(name.clone()),
            uid: u.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "Undecodable".into(),
            note: Some(message),
            action: "Decode".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &reference).await {
            tracing::warn!(plan = %name, error = %e, "cannot publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    #[test]
    fn the_stub_carries_the_name_the_reflector_looks_up() {
        let s = stub(ObjectMeta {
            name: Some("p".into()),
            ..ObjectMeta::default()
        });
        assert_eq!(s.name_any(), "p");
        assert!(message("recursion limit exceeded at line 1").contains("recursion limit"));
        assert!(message(&"x".repeat(10_000)).len() < 500);
    }
}

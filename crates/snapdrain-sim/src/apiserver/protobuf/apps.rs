//! apps/v1 Deployment (`k8s.io/api/apps/v1/generated.proto`), as `kubectl create deployment` fills it
//! (`kubectl/pkg/cmd/create/create_deployment.go`: labels, replicas, selector, template).

use k8s_pb::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::{core, meta};

pub fn deployment(d: Deployment) -> Result<Value> {
    let Deployment {
        metadata,
        spec,
        status,
    } = d;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, deployment_spec)?;
    o.unmapped("status", &status)?;
    o.done()
}

fn deployment_spec(path: &str, s: DeploymentSpec) -> Result<Value> {
    let DeploymentSpec {
        replicas,
        selector,
        template,
        strategy,
        min_ready_seconds,
        revision_history_limit,
        paused,
        progress_deadline_seconds,
    } = s;
    let mut o = Obj::new(path);
    o.ptr("replicas", replicas);
    o.message("selector", selector, meta::label_selector)?;
    o.embedded("template", template, core::pod_template_spec)?;
    o.embedded("strategy", strategy, strategy_json)?;
    o.int("minReadySeconds", min_ready_seconds);
    o.ptr("revisionHistoryLimit", revision_history_limit);
    o.flag("paused", paused);
    o.ptr("progressDeadlineSeconds", progress_deadline_seconds);
    o.done()
}

fn strategy_json(path: &str, s: DeploymentStrategy) -> Result<Value> {
    let DeploymentStrategy {
        r#type,
        rolling_update,
    } = s;
    let mut o = Obj::new(path);
    o.string("type", r#type);
    o.message("rollingUpdate", rolling_update, |path, r| {
        let RollingUpdateDeployment {
            max_unavailable,
            max_surge,
        } = r;
        let mut o = Obj::new(path);
        o.message("maxUnavailable", max_unavailable, meta::int_or_string)?;
        o.message("maxSurge", max_surge, meta::int_or_string)?;
        o.done()
    })?;
    o.done()
}

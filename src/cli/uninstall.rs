//! The steps an uninstall takes before `holds release --all` (the chart's pre-delete hook runs them in
//! one `snapdrain` call, from the controller's own image, which has no kubectl): delete the eviction
//! gate's ValidatingWebhookConfiguration, so a gate about to stop never delays or refuses an eviction,
//! then scale the controller Deployment to 0 and wait until its pods are gone, so no hold keeper places
//! the holds again after they are released.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// What went wrong stopping snapdrain before the release.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(
        "cannot delete ValidatingWebhookConfiguration {name} (needs `delete` on validatingwebhookconfigurations)"
    )]
    DeleteWebhook {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("--stop-deployment wants NAMESPACE/NAME, got {0:?}")]
    DeploymentName(String),
    #[error(
        "cannot scale Deployment {deployment} to 0 (needs `get` on deployments and `patch` on deployments/scale)"
    )]
    Scale {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "Deployment {deployment} has no spec.selector.matchLabels to find its pods by; scale it to 0 yourself and run without --stop-deployment"
    )]
    NoSelector { deployment: String },
    #[error(
        "cannot watch the pods of Deployment {deployment} (needs `list` and `watch` on pods in its namespace): {message}"
    )]
    WatchPods { deployment: String, message: String },
    #[error(
        "the pods of Deployment {deployment} were still there after {waited:?}: their hold keeper could place holds again; check `kubectl -n {namespace} get pods -l {selector}` and run again"
    )]
    PodsRemain {
        deployment: String,
        namespace: String,
        selector: String,
        waited: Duration,
    },
}

/// Deletes the ValidatingWebhookConfiguration `name`; true when it was there.
pub async fn delete_webhook_configuration(
    client: &kube::Client,
    name: &str,
) -> Result<bool, UninstallError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(source) => Err(UninstallError::DeleteWebhook {
            name: name.into(),
            source,
        }),
    }
}

/// `namespace/name` split, both non-empty.
pub fn deployment_ref(value: &str) -> Result<(String, String), UninstallError> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.into(), name.into()))
        }
        _ => Err(UninstallError::DeploymentName(value.into())),
    }
}

/// The label selector (`k=v,...`) of a Deployment's pods.
pub fn pod_selector(deployment: &Deployment) -> Option<String> {
    let labels = deployment.spec.as_ref()?.selector.match_labels.as_ref()?;
    if labels.is_empty() {
        return None;
    }
    Some(
        labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// Scales the Deployment to 0 and waits (by watch) until none of its pods is left, at most `wait`.
/// A Deployment that is already gone is fine: nothing runs it.
pub async fn stop_deployment(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    wait: Duration,
) -> Result<(), UninstallError> {
    let id = format!("{namespace}/{name}");
    let scale_error = |source| UninstallError::Scale {
        deployment: id.clone(),
        source,
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let Some(deployment) = deployments.get_opt(name).await.map_err(scale_error)? else {
        return Ok(());
    };
    let selector = pod_selector(&deployment).ok_or_else(|| UninstallError::NoSelector {
        deployment: id.clone(),
    })?;
    match deployments
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(scale_error(e)),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let (store, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector::reflector(
        writer,
        watcher(pods, watcher::Config::default().labels(&selector)),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + wait;
    let mut listed = false;
    loop {
        if listed && store.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => listed = true,
            // Refused (RBAC): waiting longer would not help.
            Ok(Some(Err(
                watcher::Error::InitialListFailed(kube::Error::Api(s))
                | watcher::Error::WatchStartFailed(kube::Error::Api(s)),
            ))) if s.code == 403 => {
                return Err(UninstallError::WatchPods {
                    deployment: id,
                    message: s.message,
                });
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(UninstallError::PodsRemain {
                    deployment: id,
                    namespace: namespace.into(),
                    selector,
                    waited: wait,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_is_named_namespace_slash_name() {
        assert_eq!(
            deployment_ref("snapdrain/snapdrain").expect("valid"),
            ("snapdrain".into(), "snapdrain".into())
        );
        for bad in ["snapdrain", "/x", "x/", "a/b/c"] {
            let e = deployment_ref(bad).expect_err(bad).to_string();
            assert!(e.contains("NAMESPACE/NAME"), "{e}");
        }
    }

    #[test]
    fn the_pod_selector_is_the_deployments_match_labels() {
        let d: Deployment = serde_json::from_value(json!({
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "snapdrain", "app.kubernetes.io/instance": "r"}},
                     "template": {}}
        }))
        .expect("a Deployment");
        assert_eq!(
            pod_selector(&d).as_deref(),
            Some("app.kubernetes.io/instance=r,app.kubernetes.io/name=snapdrain")
        );
        assert_eq!(pod_selector(&Deployment::default()), None);
    }
}

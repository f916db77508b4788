//! Replacing: launch Bottlerocket capacity for each node (CreateFleet instant, or RunInstances from a
//! launch template) with a ClientToken derived from the node's UID, recorded in status before the call,
//! so a restarted controller never launches twice; then wait for the new Node to be Ready.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::watcher;

use crate::api::plan::{CapacityType as SpecCapacity, ReplacementSpec};
use crate::api::status::ReplacementProgress;
use crate::cloud::bottlerocket::{self, NodeSettings};
use crate::cloud::ec2::{
    CapacityType, CloudError, FleetOverride, LaunchRequest, LaunchStrategy, LaunchTemplateRef,
};
use crate::controller::context::Settings;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::wait::wait_for;
use crate::planning::{PhaseFacts, client_token};

/// Bottlerocket settings for the replacement, from the plan with the controller's cluster defaults.
pub fn node_settings(
    spec: &ReplacementSpec,
    settings: &Settings,
) -> Result<NodeSettings, ControllerError> {
    let br = spec.bottlerocket.clone().unwrap_or_default();
    let pick = |plan: Option<String>, default: &Option<String>, what: &str| {
        plan.or_else(|| default.clone()).ok_or_else(|| {
            ControllerError::Config(format!(
                "replacement needs the cluster's {what} for Bottlerocket to join: set spec.replacement.bottlerocket.{what} or start the controller with --{}",
                what.chars().flat_map(|c| if c.is_uppercase() { vec!['-', c.to_ascii_lowercase()] } else { vec![c] }).collect::<String>()
            ))
        })
    };
    let extra = match br.settings {
        Some(map) => match toml::Value::try_from(serde_json::Value::Object(map)) {
            Ok(toml::Value::Table(t)) => t,
            Ok(_) => toml::Table::new(),
            Err(e) => {
                return Err(ControllerError::Config(format!(
                    "spec.replacement.bottlerocket.settings cannot be expressed as TOML: {e}"
                )));
            }
        },
        None => toml::Table::new(),
    };
    Ok(NodeSettings {
        cluster_name: pick(br.cluster_name, &settings.cluster_name, "clusterName")?,
        api_server: pick(br.api_server, &settings.api_server, "apiServer")?,
        cluster_certificate: pick(
            br.cluster_certificate,
            &settings.cluster_certificate,
            "clusterCertificate",
        )?,
        cluster_dns_ip: br.cluster_dns_ip,
        max_pods: None,
        node_labels: br.node_labels,
        node_taints: br.node_taints,
        sysctls: br.sysctls,
        extra,
    })
}

fn launch_request(
    spec: &ReplacementSpec,
    user_data: String,
    token: String,
    plan: &str,
    node: &str,
) -> LaunchRequest {
    let mut tags = BTreeMap::new();
    tags.insert("snapdrain.io/plan".to_string(), plan.to_string());
    tags.insert("snapdrain.io/replaces".to_string(), node.to_string());
    let capacity_type = match spec.capacity_type {
        Some(SpecCapacity::Spot) => CapacityType::Spot,
        _ => CapacityType::OnDemand,
    };
    let template = spec.launch_template.as_ref().map(|lt| LaunchTemplateRef {
        id_or_name: lt
            .id
            .clone()
            .or_else(|| lt.name.clone())
            .unwrap_or_default(),
        version: lt.version.clone().unwrap_or_else(|| "$Default".into()),
    });
    let strategy = match (&template, spec.instance_types.len()) {
        // A template with at most one type: RunInstances, request parameters overriding the template.
        (Some(t), 0 | 1) => LaunchStrategy::LaunchTemplate {
            template: t.clone(),
            instance_type: spec.instance_types.first().cloned(),
            subnet_id: spec.subnets.first().cloned(),
        },
        _ => {
            let subnets: Vec<String> = if spec.subnets.is_empty() {
                vec![String::new()]
            } else {
                spec.subnets.clone()
            };
            LaunchStrategy::Fleet {
                overrides: spec
                    .instance_types
                    .iter()
                    .flat_map(|t| {
                        subnets.iter().map(move |s| FleetOverride {
                            instance_type: t.clone(),
                            subnet_id: s.clone(),
                        })
                    })
                    .collect(),
                capacity_type,
                launch_template: template,
            }
        }
    };
    LaunchRequest {
        strategy,
        image_id: spec.image_id.clone(),
        user_data: if spec.launch_template.is_some() && spec.bottlerocket.is_none() {
            None
        } else {
            Some(user_data)
        },
        tags,
        client_token: token,
    }
}

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let Some(spec) = run.plan.spec.replacement.clone() else {
        facts.replacement_ready = true;
        return Ok(None);
    };
    for i in 0..run.status.nodes.len() {
        let node = run.status.nodes[i].clone();
        let token = client_token(node.uid.as_deref().unwrap_or(&node.name), 1);
        if node.replacement.is_none() {
            // Recorded before the launch: the token makes a retried or resumed launch return the same instance.
            run.status.nodes[i].replacement = Some(ReplacementProgress {
                client_token: token.clone(),
                ..Default::default()
            });
            run.save().await?;
        }
        let progress = run.status.nodes[i].replacement.clone().unwrap_or_default();
        if progress.instance_ids.is_empty() {
            // Problems no retry can fix end the plan (rolled back) with the reason; others are retried.
            let user_data = match node_settings(&spec, &run.ctx.settings)
                .and_then(|s| Ok(bottlerocket::render(&s)?))
            {
                Ok(u) => u,
                Err(e) => {
                    run.fail = Some(format!("replacement for node {}: {e}", node.name));
                    return Ok(None);
                }
            };
            let request = launch_request(
                &spec,
                user_data,
                progress.client_token.clone(),
                &run.name(),
                &node.name,
            );
            let launched = match run.ctx.ec2().await?.launch(request).await {
                Ok(l) => l,
                Err(
                    e @ (CloudError::NoCapacity { .. }
                    | CloudError::InvalidRequest(_)
                    | CloudError::KarpenterOwnershipTags { .. }),
                ) => {
                    run.fail = Some(format!(
                        "replacement for node {} could not be launched: {e}",
                        node.name
                    ));
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            };
            let ids: Vec<String> = launched.iter().map(|l| l.instance_id.clone()).collect();
            tracing::info!(plan = %run.name(), node = %node.name, instances = ?ids, "replacement launched");
            run.event(
                EventType::Normal,
                "ReplacementLaunched",
                "Replace",
                format!(
                    "launched {} for node {} (client token {})",
                    ids.join(", "),
                    node.name,
                    progress.client_token
                ),
            )
            .await;
            if let Some(r) = run.status.nodes[i].replacement.as_mut() {
                r.instance_ids = ids;
            }
            run.save().await?;
        }
    }
    // Wait (by watch) for a Ready Node carrying each launched instance's providerID.
    let wanted: BTreeSet<String> = run
        .status
        .nodes
        .iter()
        .filter_map(|n| n.replacement.as_ref())
        .filter(|r| !r.ready)
        .flat_map(|r| r.instance_ids.clone())
        .collect();
    if !wanted.is_empty() {
        let api: Api<Node> = Api::all(run.ctx.client.clone());
        let ready_for = |nodes: &[std::sync::Arc<Node>], id: &str| -> Option<String> {
            nodes
                .iter()
                .find(|n| {
                    n.spec
                        .as_ref()
                        .and_then(|s| s.provider_id.as_deref())
                        .is_some_and(|p| p.ends_with(&format!("/{id}")))
                        && n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .map(|n| n.name_any())
        };
        let wanted_vec: Vec<String> = wanted.iter().cloned().collect();
        let found = std::sync::Mutex::new(BTreeMap::<String, String>::new());
        let done = wait_for(
            api,
            watcher::Config::default(),
            "replacement nodes to be Ready",
            run.ctx.settings.wait_slice,
            |nodes| {
                let mut f = found.lock().unwrap_or_else(|e| e.into_inner());
                for id in &wanted_vec {
                    if let Some(name) = ready_for(nodes, id) {
                        f.insert(id.clone(), name);
                    }
                }
                f.len() == wanted_vec.len()
            },
        )
        .await?;
        let found = found.into_inner().unwrap_or_else(|e| e.into_inner());
        for n in run.status.nodes.iter_mut() {
            if let Some(r) = n.replacement.as_mut()
                && let Some(name) = r.instance_ids.iter().find_map(|id| found.get(id))
            {
                r.node_name = Some(name.clone());
                r.ready = true;
            }
        }
        if !done {
            run.status.message = Some(format!(
                "waiting for replacement instance(s) {} to join as Ready nodes",
                wanted_vec.join(", ")
            ));
            return Ok(Some(Duration::from_secs(2)));
        }
        run.event(
            EventType::Normal,
            "ReplacementReady",
            "Replace",
            format!(
                "replacement node(s) Ready: {}",
                found.values().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
        .await;
    }
    facts.replacement_ready = run
        .status
        .nodes
        .iter()
        .all(|n| n.replacement.as_ref().is_some_and(|r| r.ready));
    Ok(None)
}

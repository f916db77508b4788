//! Replacing: launch Bottlerocket capacity for each node (CreateFleet instant, or RunInstances from a
//! launch template) with a ClientToken derived from the node's UID and attempt, recorded in status before
//! the call, so a restarted controller never launches twice; then wait for the new Node to be Ready, up
//! to the join timeout. The replacement carries what a node needs to join (instance profile, security
//! groups, IMDS options, the cluster tag), from the plan or copied from the replaced instance.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::instance::record_instance;
use crate::api::parse_duration;
use crate::api::plan::{CapacityType as SpecCapacity, ReplacementSpec};
use crate::api::status::ReplacementProgress;
use crate::cloud::bottlerocket::{self, NodeSettings};
use crate::cloud::ec2::{
    CAPACITY_ATTEMPTS, CapacityType, CloudError, FleetOverride, JoinSettings, LaunchRequest,
    LaunchStrategy, LaunchTemplateRef,
};
use crate::controller::context::Settings;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::replacement::{
    DEFAULT_JOIN_TIMEOUT, JoinWait, join_settings, join_wait, launch_subnets,
};
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

/// The tag Bottlerocket's EKS quickstart (and Karpenter) put on nodes: the cluster owns the instance.
fn cluster_tag(cluster_name: &str) -> String {
    format!("kubernetes.io/cluster/{cluster_name}")
}

#[allow(clippy::too_many_arguments)]
fn launch_request(
    spec: &ReplacementSpec,
    user_data: String,
    token: String,
    plan: &str,
    node: &str,
    cluster_name: &str,
    join: JoinSettings,
    subnets: Vec<String>,
) -> Result<LaunchRequest, String> {
    let mut tags = BTreeMap::new();
    tags.insert("snapdrain.io/plan".to_string(), plan.to_string());
    tags.insert("snapdrain.io/replaces".to_string(), node.to_string());
    tags.insert(cluster_tag(cluster_name), "owned".to_string());
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
            subnet_id: subnets.first().cloned(),
            capacity_type: spec.capacity_type.map(|_| capacity_type),
        },
        _ => {
            if subnets.is_empty() {
                return Err("no subnet to launch into: set spec.replacement.subnets (the replaced instance's subnet could not be read from EC2)".into());
            }
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
    Ok(LaunchRequest {
        strategy,
        image_id: spec.image_id.clone(),
        user_data: if spec.launch_template.is_some() && spec.bottlerocket.is_none() {
            None
        } else {
            Some(user_data)
        },
        tags,
        join,
        client_token: token,
    })
}

/// Zones of the PersistentVolumes behind the plan's backed-up claims on `node` (their node affinity,
/// as the EBS CSI driver and in-tree provisioners write it).
/// A claim or volume that is gone constrains nothing; a refused read (RBAC) is an error, not "no zone":
/// a replacement in the wrong zone leaves the StatefulSet pod unschedulable.
async fn volume_zones(run: &PlanRun, node: &str) -> Result<BTreeSet<String>, ControllerError> {
    let client = run.ctx.client.clone();
    let mut zones = BTreeSet::new();
    for b in &run.status.backups {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &b.namespace);
        for claim in &b.pvcs {
            let claim = claim.rsplit('/').next().unwrap_or(claim);
            let pvc = pvcs
                .get_opt(claim)
                .await
                .map_err(|source| ControllerError::Read {
                    what: format!("PersistentVolumeClaim {}/{claim}", b.namespace),
                    source,
                })?;
            let Some(pv_name) = pvc.and_then(|p| p.spec).and_then(|s| s.volume_name) else {
                continue;
            };
            let pv = Api::<PersistentVolume>::all(client.clone())
                .get_opt(&pv_name)
                .await
                .map_err(|source| ControllerError::Read {
                    what: format!("PersistentVolume {pv_name}"),
                    source,
                })?;
            if let Some(pv) = pv {
                zones.extend(pv_zones(&pv));
            }
        }
    }
    tracing::debug!(plan = %run.name(), node, ?zones, "zones of the evicted pods' volumes");
    Ok(zones)
}

/// `topology.kubernetes.io/zone` (or the EBS CSI / legacy zone keys) in a PV's required node affinity.
pub fn pv_zones(pv: &PersistentVolume) -> BTreeSet<String> {
    const KEYS: [&str; 3] = [
        "topology.kubernetes.io/zone",
        "topology.ebs.csi.aws.com/zone",
        "failure-domain.beta.kubernetes.io/zone",
    ];
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| KEYS.contains(&e.key.as_str()) && e.operator == "In")
                .flat_map(|e| e.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// The wait after the `errors`-th consecutive capacity error: `base`, doubling, at most 16 times `base`.
/// Capacity shortages last minutes (EC2 docs, "Insufficient instance capacity": try again later, or
/// another type or zone), so the tries are spread out rather than spent at once.
pub fn capacity_backoff(base: Duration, errors: u32) -> Duration {
    base.saturating_mul(1 << errors.saturating_sub(1).min(4))
}

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let Some(spec) = run.plan.spec.replacement.clone() else {
        facts.replacement_ready = true;
        return Ok(None);
    };
    let join_timeout = match spec.join_timeout.as_deref() {
        None => DEFAULT_JOIN_TIMEOUT,
        Some(t) => match parse_duration(t) {
            Some(d) => d,
            None => {
                run.fail = Some(format!(
                    "spec.replacement.joinTimeout {t:?} is not a duration; write it like 10m"
                ));
                return Ok(None);
            }
        },
    };
    let max_attempts = spec.max_attempts.max(1);
    for i in 0..run.status.nodes.len() {
        let node = run.status.nodes[i].clone();
        let uid = node.uid.clone().unwrap_or_else(|| node.name.clone());
        if node.replacement.is_none() {
            // Recorded before the launch: the token makes a retried or resumed launch return the same instance.
            run.status.nodes[i].replacement = Some(ReplacementProgress {
                client_token: client_token(&uid, 1),
                attempt: 1,
                ..Default::default()
            });
            run.save().await?;
        }
        let progress = run.status.nodes[i].replacement.clone().unwrap_or_default();
        if progress.ready || !progress.instance_ids.is_empty() {
            continue;
        }
        if let Some(at) = progress.retry_at.as_ref().map(|t| t.0)
            && at > PlanRun::now()
        {
            let wait = at.duration_since(PlanRun::now()).unsigned_abs();
            run.status.message = Some(format!(
                "no EC2 capacity for the replacement of node {} ({} of {CAPACITY_ATTEMPTS} tries); trying again in {}s",
                node.name,
                progress.capacity_errors,
                wait.as_secs()
            ));
            return Ok(Some(wait));
        }
        // Problems no retry can fix end the plan (rolled back) with the reason; others are retried.
        let settings = match node_settings(&spec, &run.ctx.settings) {
            Ok(s) => s,
            Err(e) => {
                run.fail = Some(format!("replacement for node {}: {e}", node.name));
                return Ok(None);
            }
        };
        let user_data = match bottlerocket::render(&settings) {
            Ok(u) => u,
            Err(e) => {
                run.fail = Some(format!("replacement for node {}: {e}", node.name));
                return Ok(None);
            }
        };
        let record = record_instance(run, i).await?;
        let join = match join_settings(&spec, record.as_ref()) {
            Ok(j) => j,
            Err(e) => {
                run.fail = Some(format!("replacement for node {}: {e}", node.name));
                return Ok(None);
            }
        };
        let zones = volume_zones(run, &node.name).await?;
        let subnet_zones = if spec.subnets.len() > 1 && !zones.is_empty() {
            run.ctx.ec2().await?.subnet_zones(&spec.subnets).await?
        } else {
            BTreeMap::new()
        };
        let subnets = launch_subnets(
            &spec,
            record.as_ref(),
            |s| subnet_zones.get(s).cloned(),
            &zones,
        );
        let request = match launch_request(
            &spec,
            user_data,
            progress.client_token.clone(),
            &run.name(),
            &node.name,
            &settings.cluster_name,
            join,
            subnets,
        ) {
            Ok(r) => r,
            Err(e) => {
                run.fail = Some(format!("replacement for node {}: {e}", node.name));
                return Ok(None);
            }
        };
        let ec2 = run.ctx.ec2().await?;
        let outcome = match ec2.launch_with_report(request).await {
            Ok(o) => o,
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
            // RunInstances has one type and one subnet: nothing to fall back to. Retried a few times
            // (capacity comes back), then the plan fails saying how to widen the request.
            Err(e) if e.is_capacity() => {
                let errors = progress.capacity_errors + 1;
                if errors >= CAPACITY_ATTEMPTS {
                    run.fail = Some(format!(
                        "replacement for node {} could not be launched after {errors} tries: {e}; list more spec.replacement.instanceTypes or subnets (a fleet launch tries each)",
                        node.name
                    ));
                    return Ok(None);
                }
                let wait = capacity_backoff(run.ctx.settings.capacity_retry_base, errors);
                if let Some(r) = run.status.nodes[i].replacement.as_mut() {
                    r.capacity_errors = errors;
                    r.retry_at = Some(Time(PlanRun::now() + wait));
                }
                run.status.message = Some(format!(
                    "no EC2 capacity for the replacement of node {} ({errors} of {CAPACITY_ATTEMPTS} tries): {e}; trying again in {}s",
                    node.name,
                    wait.as_secs()
                ));
                return Ok(Some(wait));
            }
            Err(e) => return Err(e.into()),
        };
        for f in &outcome.override_failures {
            tracing::warn!(
                instance_type = ?f.instance_type, subnet = ?f.subnet_id, code = %f.code,
                ec2_message = %f.message, "EC2 could not use a launch override; another one was used"
            );
        }
        // The template only carried this launch: deleting it keeps the region's template quota free.
        // A retry makes it again (same name, same content).
        if let Some(t) = &outcome.created_template
            && let Err(e) = ec2.delete_launch_template(t).await
        {
            tracing::warn!(plan = %run.name(), template = %t, error = %e, "could not delete the launch template made for the replacement");
        }
        let ids: Vec<String> = outcome
            .instances
            .iter()
            .map(|l| l.instance_id.clone())
            .collect();
        tracing::info!(plan = %run.name(), node = %node.name, instances = ?ids, "replacement launched");
        run.event(
            EventType::Normal,
            "ReplacementLaunched",
            "Replace",
            format!(
                "launched {} for node {} (client token {}, attempt {} of {max_attempts})",
                ids.join(", "),
                node.name,
                progress.client_token,
                progress.attempt.max(1),
            ),
        )
        .await;
        if let Some(r) = run.status.nodes[i].replacement.as_mut() {
            r.instance_ids = ids;
            r.launched_at = Some(Time(PlanRun::now()));
            r.capacity_errors = 0;
            r.retry_at = None;
        }
        run.save().await?;
    }
    // A replacement that has not joined within the timeout is terminated: retried with a new
    // ClientToken (the old one would return the same instance), or the plan fails.
    let now = PlanRun::now();
    let mut next_check = join_timeout;
    for i in 0..run.status.nodes.len() {
        let Some(r) = run.status.nodes[i].replacement.clone() else {
            continue;
        };
        if r.ready || r.instance_ids.is_empty() {
            continue;
        }
        let Some(launched_at) = r.launched_at.as_ref().map(|t| t.0) else {
            // Launched by an older controller that did not record the time: the clock starts now.
            if let Some(p) = run.status.nodes[i].replacement.as_mut() {
                p.launched_at = Some(Time(now));
            }
            run.save().await?;
            continue;
        };
        let attempt = r.attempt.max(1);
        let decision = join_wait(launched_at, now, join_timeout, attempt, max_attempts);
        let next = match decision {
            JoinWait::Wait(left) => {
                next_check = next_check.min(left);
                continue;
            }
            JoinWait::Retry { next } => Some(next),
            JoinWait::GiveUp => None,
        };
        let node = run.status.nodes[i].name.clone();
        let ec2 = run.ctx.ec2().await?;
        let mut reasons = Vec::new();
        for id in &r.instance_ids {
            if let Ok(Some(state)) = ec2.instance_state(id).await {
                reasons.push(format!("{id} was {state:?}"));
            }
            ec2.terminate(id).await?;
        }
        let message = format!(
            "replacement {} for node {node} did not join as a Ready node within {join_timeout:?} ({}); terminated it (attempt {attempt} of {max_attempts}). Check its instance profile, security groups and user data",
            r.instance_ids.join(", "),
            reasons.join(", ")
        );
        run.event(
            EventType::Warning,
            "ReplacementJoinTimeout",
            "Replace",
            message.clone(),
        )
        .await;
        match next {
            Some(next) => {
                let uid = run.status.nodes[i]
                    .uid
                    .clone()
                    .unwrap_or_else(|| node.clone());
                run.status.nodes[i].replacement = Some(ReplacementProgress {
                    client_token: client_token(&uid, next),
                    attempt: next,
                    ..Default::default()
                });
                run.status.message = Some(message);
                run.save().await?;
                return Ok(Some(Duration::from_millis(100)));
            }
            None => {
                run.fail = Some(message);
                return Ok(None);
            }
        }
    }
    // Wait (on the shared Node cache) for a Ready Node carrying each launched instance's providerID.
    let wanted: BTreeSet<String> = run
        .status
        .nodes
        .iter()
        .filter_map(|n| n.replacement.as_ref())
        .filter(|r| !r.ready)
        .flat_map(|r| r.instance_ids.clone())
        .collect();
    if !wanted.is_empty() {
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
        let caches = run.ctx.synced_caches().await?.clone();
        let done = caches
            .nodes
            .wait_until(
                run.ctx
                    .settings
                    .wait_slice
                    .min(next_check.max(Duration::from_millis(100))),
                |cache| {
                    let nodes = cache.all();
                    let nodes = nodes.as_slice();
                    let mut f = found.lock().unwrap_or_else(|e| e.into_inner());
                    for id in &wanted_vec {
                        if let Some(name) = ready_for(nodes, id) {
                            f.insert(id.clone(), name);
                        }
                    }
                    f.len() == wanted_vec.len()
                },
            )
            .await;
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
                "waiting for replacement instance(s) {} to join as Ready nodes (join timeout {join_timeout:?}, next check in {next_check:?})",
                wanted_vec.join(", ")
            ));
            return Ok(Some(next_check.min(Duration::from_secs(2))));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_tries_are_spread_out() {
        let base = Duration::from_secs(30);
        assert_eq!(capacity_backoff(base, 1), Duration::from_secs(30));
        assert_eq!(capacity_backoff(base, 2), Duration::from_secs(60));
        assert_eq!(capacity_backoff(base, 9), Duration::from_secs(480));
    }

    #[test]
    fn pv_zones_come_from_the_required_node_affinity() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1b"]},
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
                ]}
            ]}}}
        }))
        .expect("a PV");
        assert_eq!(
            pv_zones(&pv).into_iter().collect::<Vec<_>>(),
            ["us-east-1b"]
        );
        assert!(pv_zones(&PersistentVolume::default()).is_empty());
    }

    #[test]
    fn launch_requests_tag_the_cluster_and_never_send_an_empty_subnet() {
        let spec = ReplacementSpec {
            when: crate::api::plan::ReplacementWhen::AfterDrain,
            instance_types: vec!["m5.large".into()],
            image_id: Some("ami-1".into()),
            capacity_type: Some(SpecCapacity::Spot),
            ..Default::default()
        };
        let req = |subnets: Vec<String>| {
            launch_request(
                &spec,
                String::new(),
                "t".into(),
                "p",
                "n1",
                "prod",
                JoinSettings::default(),
                subnets,
            )
        };
        let e = req(vec![]).unwrap_err();
        assert!(e.contains("spec.replacement.subnets"), "{e}");
        let r = req(vec!["subnet-a".into()]).unwrap();
        assert_eq!(r.tags["kubernetes.io/cluster/prod"], "owned");
        let mut with_template = spec.clone();
        with_template.launch_template = Some(crate::api::plan::LaunchTemplateRef {
            name: Some("nodes".into()),
            ..Default::default()
        });
        let r = launch_request(
            &with_template,
            String::new(),
            "t".into(),
            "p",
            "n1",
            "prod",
            JoinSettings::default(),
            vec![],
        )
        .unwrap();
        assert!(matches!(
            r.strategy,
            LaunchStrategy::LaunchTemplate {
                subnet_id: None,
                capacity_type: Some(CapacityType::Spot),
                ..
            }
        ));
    }
}

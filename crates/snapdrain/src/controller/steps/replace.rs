//! Replacing: launch Bottlerocket capacity for each node (CreateFleet instant, or RunInstances from a
//! launch template) with a ClientToken derived from the node's UID and attempt, recorded in status before
//! the call, so a restarted controller never launches twice; then wait for the new Node to be Ready, up
//! to the join timeout. The replacement carries what a node needs to join (cluster settings, instance
//! profile, security groups, subnets, IMDS options, the cluster tag), as planning resolved and recorded
//! them ([`super::join`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;

use crate::api::parse_duration;
use crate::api::plan::{CapacityType as SpecCapacity, ReplacementSpec};
use crate::api::status::{ClusterJoinRecord, DisruptionPlanStatus, ReplacementProgress};
use crate::cloud::bottlerocket::{self, NodeSettings};
use crate::cloud::ec2::{
    CAPACITY_ATTEMPTS, CapacityType, CloudError, FleetOverride, JoinSettings, LaunchRequest,
    LaunchStrategy, LaunchTemplateRef,
};
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView, Wake, ready_node_for};
use crate::planning::join::{ClusterKey, join_settings, needed_keys};
use crate::planning::launch_policy;
use crate::planning::replacement::{DEFAULT_JOIN_TIMEOUT, JoinWait, join_wait, order_subnets};
use crate::planning::{client_token, launch_token};

/// Bottlerocket settings for the replacement: the EC2NodeClass's user data (when the plan names one),
/// the plan's settings over it, joining the cluster resolved while planning (which wins, as Karpenter's
/// own cluster settings win over the class's user data: karpenter-provider-aws
/// `pkg/providers/amifamily/bootstrap/bottlerocket.go` `Script`).
pub fn node_settings(
    spec: &ReplacementSpec,
    cluster: &ClusterJoinRecord,
    class_user_data: Option<(&str, &str)>,
) -> Result<NodeSettings, String> {
    let br = spec.bottlerocket.clone().unwrap_or_default();
    let resolved = |v: &Option<String>, key: ClusterKey| {
        v.clone().ok_or_else(|| {
            format!(
                "settings.kubernetes.{} was not resolved while planning; set spec.replacement.bottlerocket.{}",
                key.toml(),
                key.field()
            )
        })
    };
    let mut extra = match class_user_data {
        Some((class, text)) => class_settings(text).map_err(|e| {
            format!(
                "the user data of EC2NodeClass {class} is not Bottlerocket TOML with a [settings] table: {e}"
            )
        })?,
        None => toml::Table::new(),
    };
    let plan_extra = match br.settings {
        Some(map) => match toml::Value::try_from(serde_json::Value::Object(map)) {
            Ok(toml::Value::Table(t)) => t,
            Ok(_) => toml::Table::new(),
            Err(e) => {
                return Err(format!(
                    "spec.replacement.bottlerocket.settings cannot be expressed as TOML: {e}"
                ));
            }
        },
        None => toml::Table::new(),
    };
    bottlerocket::merge_into(&mut extra, plan_extra);
    Ok(NodeSettings {
        cluster_name: cluster.cluster_name.clone(),
        api_server: resolved(&cluster.api_server, ClusterKey::ApiServer)?,
        cluster_certificate: resolved(
            &cluster.cluster_certificate,
            ClusterKey::ClusterCertificate,
        )?,
        cluster_dns_ip: br.cluster_dns_ip,
        max_pods: None,
        node_labels: br.node_labels,
        node_taints: br.node_taints,
        sysctls: br.sysctls,
        extra,
    })
}

/// The `[settings]` table of an EC2NodeClass's Bottlerocket user data.
fn class_settings(text: &str) -> Result<toml::Table, String> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    match doc.remove("settings") {
        Some(toml::Value::Table(t)) => Ok(t),
        Some(_) => Err("settings is not a table".into()),
        None => Ok(toml::Table::new()),
    }
}

/// The tag Bottlerocket's EKS quickstart (and Karpenter) put on nodes: the cluster owns the instance.
fn cluster_tag(cluster_name: &str) -> String {
    format!("kubernetes.io/cluster/{cluster_name}")
}

/// What a launch carries besides the plan's own spec.
struct LaunchInputs<'a> {
    user_data: Option<String>,
    token: String,
    plan: &'a str,
    node: &'a str,
    cluster_name: &'a str,
    join: JoinSettings,
    /// The plan's, the node class's or the replaced instance's AMI.
    image_id: Option<String>,
    /// The node class's `spec.tags` (snapdrain's own tags win).
    class_tags: BTreeMap<String, String>,
    subnets: Vec<String>,
    /// The instance types that run the AMI, as planning checked them; empty: the plan's.
    instance_types: Vec<String>,
    /// The launch template version planning checked (its number); None: as the plan names it.
    template_version: Option<String>,
}

fn launch_request(
    spec: &ReplacementSpec,
    inputs: LaunchInputs<'_>,
) -> Result<LaunchRequest, String> {
    let LaunchInputs {
        user_data,
        token,
        plan,
        node,
        cluster_name,
        join,
        image_id,
        class_tags,
        subnets,
        instance_types,
        template_version,
    } = inputs;
    let instance_types = if instance_types.is_empty() {
        spec.instance_types.clone()
    } else {
        instance_types
    };
    let mut tags = class_tags;
    tags.insert("snapdrain.io/plan".to_string(), plan.to_string());
    tags.insert("snapdrain.io/replaces".to_string(), node.to_string());
    tags.insert(cluster_tag(cluster_name), "owned".to_string());
    let capacity_type = match spec.capacity_type {
        Some(SpecCapacity::Spot) => CapacityType::Spot,
        _ => CapacityType::OnDemand,
    };
    let template = spec.launch_template.as_ref().map(|lt| LaunchTemplateRef {
        id_or_name: lt.id_or_name().to_owned(),
        version: template_version
            .clone()
            .unwrap_or_else(|| lt.version_or_default().to_owned()),
    });
    let strategy = match (&template, instance_types.len()) {
        // A template with at most one type: RunInstances, request parameters overriding the template.
        (Some(t), 0 | 1) => LaunchStrategy::LaunchTemplate {
            template: t.clone(),
            instance_type: instance_types.first().cloned(),
            subnet_id: subnets.first().cloned(),
            capacity_type: spec.capacity_type.map(|_| capacity_type),
        },
        _ => {
            if subnets.is_empty() {
                return Err("no subnet to launch into: set spec.replacement.subnets (the replaced instance's subnet could not be read from EC2)".into());
            }
            LaunchStrategy::Fleet {
                overrides: instance_types
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
        image_id,
        user_data,
        tags,
        join,
        client_token: token,
    })
}

/// Zones of the PersistentVolumes behind the plan's backed-up claims (their node affinity, as the EBS
/// CSI driver and in-tree provisioners write it). A claim or volume that is gone constrains nothing; a
/// refused read (RBAC) is an error, not "no zone": a replacement in the wrong zone leaves the
/// StatefulSet pod unschedulable.
async fn volume_zones(
    status: &DisruptionPlanStatus,
    io: &Io<'_>,
) -> Result<BTreeSet<String>, ControllerError> {
    let mut zones = BTreeSet::new();
    for b in &status.backups {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(io.client.clone(), &b.namespace);
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
            let pv = Api::<PersistentVolume>::all(io.client.clone())
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

/// The wait after the `errors`-th launch in a row without capacity, or None once
/// [`CAPACITY_ATTEMPTS`] launches went without: `base`, doubling, at most 16 times `base`. Capacity
/// shortages last minutes (EC2 user guide, "Insufficient instance capacity": try again later, or another
/// type or zone), so the tries are spread out rather than spent at once.
pub fn capacity_backoff(base: Duration, errors: u32) -> Option<Duration> {
    let index = usize::try_from(errors.checked_sub(1)?).ok()?;
    ExponentialBuilder::new()
        .with_min_delay(base)
        .with_factor(2.0)
        .with_max_delay(base.saturating_mul(16))
        .with_max_times(usize::try_from(CAPACITY_ATTEMPTS.saturating_sub(1)).ok()?)
        .build()
        .nth(index)
}

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let Some(spec) = &v.plan.spec.replacement else {
        return Ok(v.outcome());
    };
    let join_timeout = match join_timeout(spec) {
        Ok(t) => t,
        Err(why) => return Ok(v.outcome().then(Next::Fail(why))),
    };
    let mut out = v.outcome();
    // Intent before act: every node gets its ClientToken written before any launch, so a retried or
    // resumed launch returns the same instance.
    if assign_tokens(&mut out.status) {
        return Ok(out.then(Next::Checkpoint));
    }
    for i in 0..out.status.nodes.len() {
        if let Some(next) = launch(v, io, spec, i, &mut out).await? {
            return Ok(out.then(next));
        }
    }
    if let Some(next) = join_timeouts(v, io, spec, join_timeout, &mut out).await? {
        return Ok(out.then(next));
    }
    Ok(ready(io, join_timeout, v.now, out))
}

/// `spec.replacement.joinTimeout`, or the default.
pub(super) fn join_timeout(spec: &ReplacementSpec) -> Result<Duration, String> {
    match spec.join_timeout.as_deref() {
        None => Ok(DEFAULT_JOIN_TIMEOUT),
        Some(t) => parse_duration(t).ok_or_else(|| {
            format!("spec.replacement.joinTimeout {t:?} is not a duration; write it like 10m")
        }),
    }
}

/// Gives each node without a replacement record its first ClientToken. True when one was added.
pub fn assign_tokens(status: &mut DisruptionPlanStatus) -> bool {
    let mut added = false;
    for n in status.nodes.iter_mut().filter(|n| n.replacement.is_none()) {
        let uid = n.uid.clone().unwrap_or_else(|| n.name.clone());
        n.replacement = Some(ReplacementProgress {
            client_token: client_token(&uid, 1),
            attempt: 1,
            ..Default::default()
        });
        added = true;
    }
    added
}

/// Launches node `i`'s replacement when it has none yet. Some(next) ends the step's call.
async fn launch(
    v: &PlanView<'_>,
    io: &Io<'_>,
    spec: &ReplacementSpec,
    i: usize,
    out: &mut Outcome,
) -> Result<Option<Next>, ControllerError> {
    let node = out.status.nodes[i].clone();
    let progress = node.replacement.clone().unwrap_or_default();
    if progress.ready || !progress.instance_ids.is_empty() {
        return Ok(None);
    }
    if let Some(at) = progress.retry_at.as_ref().map(|t| t.0)
        && at > v.now
    {
        let wait = at.duration_since(v.now).unsigned_abs();
        out.status.message = Some(format!(
            "no EC2 capacity for the replacement of node {} ({} of {CAPACITY_ATTEMPTS} tries: {}); trying again in {}s",
            node.name,
            progress.capacity_errors,
            progress.capacity_error.as_deref().unwrap_or("no capacity"),
            wait.as_secs()
        ));
        return Ok(Some(Next::Wait {
            wake: Wake::Never,
            recheck: wait,
        }));
    }
    let request = match prepare(v, io, spec, i, out).await? {
        Prepared::Request(r) => r,
        Prepared::Then(next) => return Ok(Some(next)),
    };
    let ec2 = io.cloud.ec2().await?;
    let result = ec2.launch_with_report(*request).await;
    if let Ok(o) = &result {
        for f in &o.override_failures {
            tracing::warn!(
                instance_type = ?f.instance_type, subnet = ?f.subnet_id, code = %f.code,
                ec2_message = %f.message, "EC2 could not use a launch override; another one was used"
            );
        }
        // The template only carried this launch: deleting it keeps the region's template quota free.
        // A retry makes it again (same name, same content).
        if let Some(t) = &o.created_template
            && let Err(e) = ec2.delete_launch_template(t).await
        {
            tracing::warn!(template = %t, error = %e, "could not delete the launch template made for the replacement");
        }
    }
    let ids = result.map(|o| o.instances.into_iter().map(|l| l.instance_id).collect());
    Ok(record_launch(
        out,
        i,
        ids,
        v.now,
        io.settings.capacity_retry_base,
        spec.max_attempts.max(1),
    ))
}

/// What [`prepare`] got to.
enum Prepared {
    Request(Box<LaunchRequest>),
    /// Write first (the replaced instance's record), or fail (what no retry fixes).
    Then(Next),
}

/// Builds node `i`'s launch request from what planning resolved and recorded: user data for the
/// cluster, the node's instance profile, security groups and subnets (those in the zones of its volumes
/// first).
async fn prepare(
    v: &PlanView<'_>,
    io: &Io<'_>,
    spec: &ReplacementSpec,
    i: usize,
    out: &mut Outcome,
) -> Result<Prepared, ControllerError> {
    let node = out.status.nodes[i].clone();
    let (Some(cluster), Some(join)) = (out.status.join.clone(), node.join.clone()) else {
        // Planned by a controller that did not resolve the join settings: resolve them now and write
        // them before the launch.
        return Ok(Prepared::Then(
            match super::join::resolve(spec, io, &mut out.status).await? {
                Ok(()) => Next::Checkpoint,
                Err(why) => Next::Fail(why),
            },
        ));
    };
    let fail = |e: &dyn std::fmt::Display| {
        Prepared::Then(Next::Fail(format!(
            "replacement for node {}: {e}",
            node.name
        )))
    };
    // Judged again right before the launch: the policy may have narrowed since the plan was decided.
    let Some(policy) = &io.policy else {
        out.status.message =
            Some("waiting for the DisruptionPolicy to be read before launching".into());
        return Ok(Prepared::Then(Next::Wait {
            wake: Wake::Never,
            recheck: Duration::from_millis(500),
        }));
    };
    let problems = launch_policy::check(spec, &policy.replacement);
    if !problems.is_empty() {
        return Ok(fail(&launch_policy::refusal_message(&problems)));
    }
    let class = out.status.node_class.clone();
    // The class's user data is read again (the status keeps only its hash): the same class, or none.
    let class_user_data = match &class {
        None => None,
        Some(record) => match super::join::node_class(io, &record.name).await? {
            Ok((launch, _)) if launch.record.uid == record.uid => {
                launch.user_data.map(|u| (record.name.clone(), u))
            }
            Ok(_) => {
                return Ok(fail(&format!(
                    "EC2NodeClass {} was deleted and created again since the plan was decided; create a new plan",
                    record.name
                )));
            }
            Err(why) => return Ok(fail(&why)),
        },
    };
    let user_data = if needed_keys(spec).len() > 1 {
        match node_settings(
            spec,
            &cluster,
            class_user_data
                .as_ref()
                .map(|(n, u)| (n.as_str(), u.as_str())),
        )
        .and_then(|s| bottlerocket::render(&s).map_err(|e| e.to_string()))
        {
            Ok(u) => Some(u),
            Err(e) => return Ok(fail(&e)),
        }
    } else {
        None
    };
    let zones = volume_zones(&out.status, io).await?;
    let subnet_zones = if join.subnet_ids.len() > 1 && !zones.is_empty() {
        io.cloud.ec2().await?.subnet_zones(&join.subnet_ids).await?
    } else {
        BTreeMap::new()
    };
    let subnets = order_subnets(&join.subnet_ids, |s| subnet_zones.get(s).cloned(), &zones);
    let token = node.replacement.map(|r| r.client_token).unwrap_or_default();
    let plan = v.name();
    let request = launch_request(
        spec,
        LaunchInputs {
            user_data,
            token,
            plan: &plan,
            node: &node.name,
            cluster_name: &cluster.cluster_name,
            join: join_settings(&join),
            image_id: spec.image_id.clone().or_else(|| join.image_id.clone()),
            class_tags: class.map(|c| c.tags).unwrap_or_default(),
            subnets,
            instance_types: join.instance_types.clone(),
            template_version: join.launch_template_version.clone(),
        },
    );
    Ok(match request {
        Ok(r) => Prepared::Request(Box::new(r)),
        Err(e) => fail(&e),
    })
}

/// Records what EC2 answered to node `i`'s launch. Some(next) ends the step's call: a launch is written
/// before the next node's (a checkpoint), a capacity error waits, a refusal fails the plan.
pub fn record_launch(
    out: &mut Outcome,
    i: usize,
    result: Result<Vec<String>, CloudError>,
    now: Timestamp,
    capacity_base: Duration,
    max_attempts: u32,
) -> Option<Next> {
    let name = out.status.nodes[i].name.clone();
    let progress = out.status.nodes[i].replacement.clone().unwrap_or_default();
    let ids = match result {
        Ok(ids) => ids,
        // No capacity anywhere the request allows (RunInstances: its one type and subnet; an instant
        // fleet: every override). Retried later, each time with a token of its own, then the plan fails
        // saying how to widen the request.
        Err(e) if e.is_capacity() => return Some(capacity_short(out, i, &e, now, capacity_base)),
        Err(
            e @ (CloudError::NoCapacity { .. }
            | CloudError::InvalidRequest(_)
            | CloudError::KarpenterOwnershipTags { .. }),
        ) => {
            return Some(Next::Fail(format!(
                "replacement for node {name} could not be launched: {e}"
            )));
        }
        Err(e) => return Some(Next::Retry(e.into())),
    };
    tracing::info!(node = %name, instances = ?ids, "replacement launched");
    out.note(
        What::ReplacementLaunched,
        format!(
            "launched {} for node {name} (client token {}, attempt {} of {max_attempts})",
            ids.join(", "),
            progress.client_token,
            progress.attempt.max(1),
        ),
    );
    if let Some(r) = out.status.nodes[i].replacement.as_mut() {
        r.instance_ids = ids;
        r.launched_at = Some(Time(now));
        r.capacity_errors = 0;
        r.capacity_error = None;
        r.retry_at = None;
    }
    Some(Next::Checkpoint)
}

/// Records a launch of node `i`'s replacement that found no capacity: the next launch's ClientToken
/// and when it may go (one status write, before that launch is sent: a controller stopped in between
/// resends the recorded token, whose first launch EC2 remembers), or, past the bound, the plan fails.
fn capacity_short(
    out: &mut Outcome,
    i: usize,
    e: &CloudError,
    now: Timestamp,
    base: Duration,
) -> Next {
    let node = out.status.nodes[i].clone();
    let progress = node.replacement.clone().unwrap_or_default();
    let errors = progress.capacity_errors + 1;
    let Some(wait) = capacity_backoff(base, errors) else {
        return Next::Fail(format!(
            "replacement for node {} could not be launched: EC2 had no capacity in {errors} tries over {:?}: {e}; list more spec.replacement.instanceTypes or subnets (a fleet launch tries each), or another capacityType",
            node.name,
            (1..errors)
                .filter_map(|k| capacity_backoff(base, k))
                .sum::<Duration>(),
        ));
    };
    let uid = node.uid.clone().unwrap_or_else(|| node.name.clone());
    let token = launch_token(&uid, progress.attempt.max(1), errors);
    let why = e.to_string();
    let message = format!(
        "no EC2 capacity for the replacement of node {} ({errors} of {CAPACITY_ATTEMPTS} tries): {why}; trying again in {}s with client token {token}",
        node.name,
        wait.as_secs()
    );
    if let Some(r) = out.status.nodes[i].replacement.as_mut() {
        r.capacity_errors = errors;
        r.capacity_error = Some(why);
        r.client_token = token;
        r.retry_at = Some(Time(now + wait));
    }
    out.note(What::ReplacementWaitingForCapacity, message.clone());
    out.status.message = Some(message);
    Next::Wait {
        wake: Wake::Never,
        recheck: wait,
    }
}

/// A replacement that has not joined within the timeout is terminated: retried with a new ClientToken
/// (the old one would return the same instance), or the plan fails.
async fn join_timeouts(
    v: &PlanView<'_>,
    io: &Io<'_>,
    spec: &ReplacementSpec,
    join_timeout: Duration,
    out: &mut Outcome,
) -> Result<Option<Next>, ControllerError> {
    let max_attempts = spec.max_attempts.max(1);
    for i in 0..out.status.nodes.len() {
        let Some(r) = out.status.nodes[i].replacement.clone() else {
            continue;
        };
        if r.ready || r.instance_ids.is_empty() {
            continue;
        }
        let Some(launched_at) = r.launched_at.as_ref().map(|t| t.0) else {
            // Launched by an older controller that did not record the time: the clock starts now.
            if let Some(p) = out.status.nodes[i].replacement.as_mut() {
                p.launched_at = Some(Time(v.now));
            }
            return Ok(Some(Next::Checkpoint));
        };
        let attempt = r.attempt.max(1);
        let next = match join_wait(launched_at, v.now, join_timeout, attempt, max_attempts) {
            JoinWait::Wait(_) => continue,
            JoinWait::Retry { next } => Some(next),
            JoinWait::GiveUp => None,
        };
        let ec2 = io.cloud.ec2().await?;
        let mut states = Vec::new();
        for id in &r.instance_ids {
            if let Ok(Some(state)) = ec2.instance_state(id).await {
                states.push(format!("{id} was {state:?}"));
            }
            ec2.terminate(id).await?;
        }
        return Ok(Some(record_join_timeout(
            out,
            i,
            next,
            &states,
            join_timeout,
            max_attempts,
        )));
    }
    Ok(None)
}

/// Records a replacement terminated for not joining: the next attempt's token (written before it
/// launches), or the plan fails.
pub fn record_join_timeout(
    out: &mut Outcome,
    i: usize,
    next: Option<u32>,
    states: &[String],
    join_timeout: Duration,
    max_attempts: u32,
) -> Next {
    let node = out.status.nodes[i].clone();
    let r = node.replacement.clone().unwrap_or_default();
    let message = format!(
        "replacement {} for node {} did not join as a Ready node within {join_timeout:?} ({}); terminated it (attempt {} of {max_attempts}). Check its instance profile, security groups and user data",
        r.instance_ids.join(", "),
        node.name,
        states.join(", "),
        r.attempt.max(1),
    );
    out.note(What::ReplacementJoinTimeout, message.clone());
    let Some(next) = next else {
        return Next::Fail(message);
    };
    let uid = node.uid.clone().unwrap_or_else(|| node.name.clone());
    out.status.nodes[i].replacement = Some(ReplacementProgress {
        client_token: client_token(&uid, next),
        attempt: next,
        ..Default::default()
    });
    out.status.message = Some(message);
    Next::Checkpoint
}

/// Marks the replacements a Ready Node carries (by providerID, from the Node cache) and waits for the
/// rest, at most until the nearest join timeout.
fn ready(io: &Io<'_>, join_timeout: Duration, now: Timestamp, mut out: Outcome) -> Outcome {
    let nodes = io.caches.nodes.all();
    let mut newly = Vec::new();
    let mut wanted = BTreeSet::new();
    let mut next_check = join_timeout;
    for n in out.status.nodes.iter_mut() {
        let Some(r) = n.replacement.as_mut().filter(|r| !r.ready) else {
            continue;
        };
        match r
            .instance_ids
            .iter()
            .find_map(|id| ready_node_for(&nodes, id))
        {
            Some(name) => {
                r.node_name = Some(name.clone());
                r.ready = true;
                newly.push(name);
            }
            None => {
                wanted.extend(r.instance_ids.iter().cloned());
                if let Some(at) = r.launched_at.as_ref().map(|t| t.0) {
                    let waited = now.duration_since(at).unsigned_abs();
                    next_check = next_check.min(join_timeout.saturating_sub(waited));
                }
            }
        }
    }
    if wanted.is_empty() {
        if !newly.is_empty() {
            let all: Vec<String> = out
                .status
                .nodes
                .iter()
                .filter_map(|n| n.replacement.as_ref()?.node_name.clone())
                .collect();
            out.note(
                What::ReplacementReady,
                format!("replacement node(s) Ready: {}", all.join(", ")),
            );
        }
        return out;
    }
    out.status.message = Some(format!(
        "waiting for replacement instance(s) {} to join as Ready nodes (join timeout {join_timeout:?}, next check in {next_check:?})",
        wanted.iter().cloned().collect::<Vec<_>>().join(", ")
    ));
    let recheck = next_check.max(Duration::from_millis(100));
    out.then(Next::Wait {
        wake: Wake::NodesReady(wanted),
        recheck,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replacing(nodes: &[&str]) -> Outcome {
        let mut status = DisruptionPlanStatus {
            nodes: nodes
                .iter()
                .map(|n| crate::api::status::NodeProgress {
                    name: n.to_string(),
                    uid: Some(format!("uid-{n}")),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        assign_tokens(&mut status);
        Outcome::decide(status)
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn every_node_gets_its_token_before_any_launch_and_keeps_it() {
        let out = replacing(&["n1", "n2"]);
        let tokens: Vec<String> = out
            .status
            .nodes
            .iter()
            .map(|n| n.replacement.clone().expect("a token").client_token)
            .collect();
        assert_eq!(
            tokens,
            [client_token("uid-n1", 1), client_token("uid-n2", 1)]
        );
        let mut again = out.status.clone();
        assert!(
            !assign_tokens(&mut again),
            "a written token is kept: a resumed launch reuses it"
        );
        assert_eq!(again, out.status);
    }

    #[test]
    fn a_launch_is_written_before_the_next_and_capacity_errors_wait_then_fail() {
        let now = at("2026-12-03T10:00:00Z");
        let base = Duration::from_secs(30);
        let mut out = replacing(&["n1"]);
        let next = record_launch(&mut out, 0, Ok(vec!["i-1".into()]), now, base, 2);
        assert!(matches!(next, Some(Next::Checkpoint)));
        let r = out.status.nodes[0].replacement.clone().expect("recorded");
        assert_eq!(
            (r.instance_ids, r.launched_at),
            (vec!["i-1".to_string()], Some(Time(now)))
        );
        assert_eq!(out.notes[0].what, What::ReplacementLaunched);

        let mut out = replacing(&["n1"]);
        let short = || CloudError::Api {
            operation: "CreateFleet",
            instance: None,
            code: "InsufficientInstanceCapacity".into(),
            message: "none".into(),
        };
        let next = record_launch(&mut out, 0, Err(short()), now, base, 2);
        assert!(matches!(next, Some(Next::Wait { wake: Wake::Never, recheck }) if recheck == base));
        let r = out.status.nodes[0].replacement.clone().expect("recorded");
        assert_eq!((r.capacity_errors, r.retry_at), (1, Some(Time(now + base))));
        for _ in 1..CAPACITY_ATTEMPTS - 1 {
            let _ = record_launch(&mut out, 0, Err(short()), now, base, 2);
        }
        let last = record_launch(&mut out, 0, Err(short()), now, base, 2);
        assert!(matches!(last, Some(Next::Fail(m)) if m.contains("instanceTypes")));
        let refused = record_launch(
            &mut replacing(&["n1"]),
            0,
            Err(CloudError::InvalidRequest("bad AMI".into())),
            now,
            base,
            2,
        );
        assert!(matches!(refused, Some(Next::Fail(m)) if m.contains("bad AMI")));
    }

    #[test]
    fn a_replacement_that_never_joined_is_retried_with_a_new_token_or_fails() {
        let mut out = replacing(&["n1"]);
        if let Some(r) = out.status.nodes[0].replacement.as_mut() {
            r.instance_ids = vec!["i-1".into()];
        }
        let timeout = Duration::from_secs(600);
        let next = record_join_timeout(
            &mut out,
            0,
            Some(2),
            &["i-1 was Running".into()],
            timeout,
            2,
        );
        assert!(matches!(next, Next::Checkpoint));
        let r = out.status.nodes[0]
            .replacement
            .clone()
            .expect("the next attempt");
        assert_eq!(
            (r.attempt, r.client_token.clone(), r.instance_ids.len()),
            (2, client_token("uid-n1", 2), 0)
        );
        assert_eq!(out.notes[0].what, What::ReplacementJoinTimeout);
        let gave_up = record_join_timeout(&mut out, 0, None, &[], timeout, 2);
        assert!(matches!(gave_up, Next::Fail(m) if m.contains("did not join")));
    }

    #[test]
    fn capacity_tries_are_spread_out_and_bounded() {
        let base = Duration::from_secs(30);
        let waits: Vec<Option<Duration>> = (0..=CAPACITY_ATTEMPTS)
            .map(|n| capacity_backoff(base, n))
            .collect();
        assert_eq!(
            waits,
            [
                None,
                Some(Duration::from_secs(30)),
                Some(Duration::from_secs(60)),
                Some(Duration::from_secs(120)),
                Some(Duration::from_secs(240)),
                None,
            ]
        );
    }

    #[test]
    fn a_fleet_without_capacity_in_any_pool_waits_with_a_new_token_recorded_before_the_next_launch()
    {
        let now = at("2026-12-03T10:00:00Z");
        let base = Duration::from_secs(30);
        let pool = |t: &str| crate::cloud::ec2::OverrideFailure {
            instance_type: Some(t.into()),
            subnet_id: Some("subnet-a".into()),
            zone: None,
            code: "InsufficientInstanceCapacity".into(),
            message: "none".into(),
        };
        let short = || CloudError::NoCapacity {
            failures: vec![pool("m5.large"), pool("c5.large")],
        };
        let mut out = replacing(&["n1"]);
        let mut tokens = vec![
            out.status.nodes[0]
                .replacement
                .clone()
                .expect("a token")
                .client_token,
        ];
        for n in 1..CAPACITY_ATTEMPTS {
            let next = record_launch(&mut out, 0, Err(short()), now, base, 2);
            assert!(
                matches!(
                    next,
                    Some(Next::Wait {
                        wake: Wake::Never,
                        ..
                    })
                ),
                "{next:?}"
            );
            let r = out.status.nodes[0].replacement.clone().expect("recorded");
            assert_eq!(r.capacity_errors, n);
            assert_eq!(r.client_token, launch_token("uid-n1", 1, n));
            assert!(
                r.capacity_error
                    .as_deref()
                    .is_some_and(|e| e.contains("c5.large"))
            );
            tokens.push(r.client_token);
            assert_eq!(
                out.notes.last().map(|n| &n.what),
                Some(&What::ReplacementWaitingForCapacity)
            );
        }
        let distinct: BTreeSet<&String> = tokens.iter().collect();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "one token per launch: {tokens:?}"
        );
        let last = record_launch(&mut out, 0, Err(short()), now, base, 2);
        assert!(
            matches!(&last, Some(Next::Fail(m)) if m.contains("no capacity in 5 tries") && m.contains("m5.large")),
            "{last:?}"
        );
        // Capacity back: the launch under the recorded token is kept and the capacity record cleared.
        let mut out = replacing(&["n1"]);
        let _ = record_launch(&mut out, 0, Err(short()), now, base, 2);
        let _ = record_launch(&mut out, 0, Ok(vec!["i-9".into()]), now, base, 2);
        let r = out.status.nodes[0].replacement.clone().expect("recorded");
        assert_eq!(
            (
                r.instance_ids,
                r.capacity_errors,
                r.capacity_error,
                r.retry_at
            ),
            (vec!["i-9".to_string()], 0, None, None)
        );
        assert_eq!(r.client_token, launch_token("uid-n1", 1, 1));
        // A pool refused for something waiting does not fix fails at once.
        let mut quota = pool("c5.large");
        quota.code = "VcpuLimitExceeded".into();
        let mixed = CloudError::NoCapacity {
            failures: vec![pool("m5.large"), quota],
        };
        let failed = record_launch(&mut replacing(&["n1"]), 0, Err(mixed), now, base, 2);
        assert!(matches!(failed, Some(Next::Fail(m)) if m.contains("VcpuLimitExceeded")));
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
    fn the_node_classs_user_data_is_the_base_and_the_cluster_settings_win() {
        let spec = ReplacementSpec {
            when: crate::api::plan::ReplacementWhen::AfterDrain,
            instance_types: vec!["m5.large".into()],
            bottlerocket: Some(crate::api::plan::BottlerocketSpec {
                node_labels: [("example.com/pool".to_string(), "db".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cluster = ClusterJoinRecord {
            cluster_name: "prod".into(),
            api_server: Some("https://prod.example".into()),
            cluster_certificate: Some("Y2E=".into()),
            from: Vec::new(),
        };
        let class = "[settings]\nmotd = \"platform\"\n[settings.kubernetes]\ncluster-name = \"other\"\n[settings.kubernetes.node-labels]\n\"example.com/team\" = \"storage\"\n";
        let rendered = bottlerocket::render(
            &node_settings(&spec, &cluster, Some(("general", class))).unwrap(),
        )
        .unwrap();
        let doc: toml::Table = toml::from_str(&rendered).unwrap();
        let settings = &doc["settings"];
        assert_eq!(settings["motd"].as_str(), Some("platform"));
        assert_eq!(
            settings["kubernetes"]["cluster-name"].as_str(),
            Some("prod")
        );
        let labels = &settings["kubernetes"]["node-labels"];
        assert_eq!(labels["example.com/team"].as_str(), Some("storage"));
        assert_eq!(labels["example.com/pool"].as_str(), Some("db"));
        let e = node_settings(&spec, &cluster, Some(("general", "not toml ["))).unwrap_err();
        assert!(
            e.contains("EC2NodeClass general is not Bottlerocket TOML"),
            "{e}"
        );
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
        let inputs = |subnets: Vec<String>| LaunchInputs {
            user_data: None,
            token: "t".into(),
            plan: "p",
            node: "n1",
            cluster_name: "prod",
            join: JoinSettings::default(),
            image_id: Some("ami-1".into()),
            class_tags: [
                ("team".to_string(), "db".to_string()),
                ("snapdrain.io/plan".to_string(), "spoofed".to_string()),
            ]
            .into(),
            subnets,
            instance_types: Vec::new(),
            template_version: None,
        };
        let req = |subnets: Vec<String>| launch_request(&spec, inputs(subnets));
        let e = req(vec![]).unwrap_err();
        assert!(e.contains("spec.replacement.subnets"), "{e}");
        let r = req(vec!["subnet-a".into()]).unwrap();
        assert_eq!(r.tags["kubernetes.io/cluster/prod"], "owned");
        assert_eq!(r.tags["team"], "db", "the node class's tags");
        assert_eq!(r.tags["snapdrain.io/plan"], "p", "snapdrain's own tags win");
        assert_eq!(r.image_id.as_deref(), Some("ami-1"));
        let mut with_template = spec.clone();
        with_template.launch_template = Some(crate::api::plan::LaunchTemplateRef {
            name: Some("nodes".into()),
            ..Default::default()
        });
        let r = launch_request(&with_template, inputs(vec![])).unwrap();
        assert!(matches!(
            r.strategy,
            LaunchStrategy::LaunchTemplate {
                subnet_id: None,
                capacity_type: Some(CapacityType::Spot),
                ..
            }
        ));
        // The launch names the version planning checked, never `$Latest` again.
        with_template
            .launch_template
            .as_mut()
            .expect("set above")
            .version = Some("$Latest".into());
        let pinned = LaunchInputs {
            template_version: Some("3".into()),
            ..inputs(vec![])
        };
        let r = launch_request(&with_template, pinned).unwrap();
        let LaunchStrategy::LaunchTemplate { template, .. } = r.strategy else {
            panic!("one type and a template launch with RunInstances")
        };
        assert_eq!(template.version, "3");
        let r = launch_request(&with_template, inputs(vec![])).unwrap();
        let LaunchStrategy::LaunchTemplate { template, .. } = r.strategy else {
            panic!("one type and a template launch with RunInstances")
        };
        assert_eq!(
            template.version, "$Latest",
            "unchecked: as the plan names it"
        );
    }
}

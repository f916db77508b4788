//! Whether a plan's replacement stays within what the DisruptionPolicy allows (security review C-1): a
//! plan author gains nothing they could not get otherwise. A replacement launches with the node IAM
//! role and attracts the workloads its labels match, so its AMI, instance profile, security groups,
//! subnets, launch template, IMDS options, cluster settings and Bottlerocket settings come from an
//! EC2NodeClass, the replaced instance, or the policy's allow-lists, and a plan selects at most
//! `maxNodesPerPlan` nodes. Pure: the controller calls it while the plan is Pending, before any node is
//! touched, and again right before a launch.

use crate::api::launch::ReplacementPolicy;
use crate::api::plan::{
    BackupPolicy, BottlerocketSpec, DisruptionPlanSpec, PlanMode, ReplacementSpec, ReplacementWhen,
};
use crate::api::policy::PlanSettingsPolicy;
use crate::api::validate::SpecProblem;
use crate::api::{DEFAULT_POLICY, DisruptionPolicySpec};

/// Bottlerocket settings that run code as root on the host or change what it trusts or boots with:
/// host and bootstrap containers (`superpowered`, any `source` image), bootstrap commands, kernel
/// settings (`kernel.sysctl` such as `kernel.core_pattern`, `kernel.modules`, lockdown), boot (kernel
/// command line), `pki` (trusted CA bundles) and `container-registry` (mirrors every image pull goes
/// through). The policy's `allowedSettings` must list them even when `allowFreeForm` is on.
pub const ROOT_SETTINGS: &[&str] = &[
    "host-containers",
    "bootstrap-containers",
    "bootstrap-commands",
    "kernel",
    "boot",
    "pki",
    "container-registry",
];

/// The highest IMDS hop limit a plan may ask for without `allowFreeForm`: 2 lets pods without host
/// networking reach IMDS behind one NAT hop (the EKS best-practice guide's ceiling); IMDSv1 never.
const MAX_SAFE_HOP_LIMIT: i32 = 2;

/// Why an `allowedSettings` entry is malformed, if it is.
pub fn check_setting_entry(entry: &str) -> Result<(), String> {
    if entry.is_empty() || entry.starts_with('.') || entry.ends_with('.') || entry.contains("..") {
        return Err(format!(
            "{entry:?} is not a dotted settings path such as kubernetes.node-labels or kernel.sysctl.fs.inotify"
        ));
    }
    if entry.starts_with("settings.") {
        return Err(format!(
            "{entry:?}: write the path without the leading settings. (e.g. kubernetes.node-labels)"
        ));
    }
    Ok(())
}

/// Everything the policy refuses in a plan that selects `selected` nodes: the node cap, the plan
/// settings that drain without a backup or without the pods' consent, and its replacement's launch
/// settings (only when it launches one).
pub fn check_plan(
    spec: &DisruptionPlanSpec,
    policy: &DisruptionPolicySpec,
    selected: usize,
) -> Vec<SpecProblem> {
    let mut out: Vec<SpecProblem> = check_node_count(
        selected,
        spec.node_selector.is_some() && spec.nodes.is_empty(),
        policy.max_nodes_per_plan,
    )
    .into_iter()
    .collect();
    out.extend(check_settings(spec, &policy.plan_settings));
    if let Some(r) = spec
        .replacement
        .as_ref()
        .filter(|r| r.when != ReplacementWhen::None)
    {
        out.extend(check(r, &policy.replacement));
    }
    out
}

/// The plan settings `policy` does not allow: `backup.policy: skip`, `backup.releaseNetworkVolumesAt:
/// Snapshot`, `drain.force` and `drain.gracePeriodSeconds: 0`. Judged regardless of what runs on the nodes: the pods can change
/// between the check and the drain, and the preview judges a plan without looking at them. These
/// fields stay editable (a drain waiting on a bare pod is unblocked by setting `force`), so the
/// controller judges them on every pass of a running plan, not only while it is Pending.
pub fn check_settings(spec: &DisruptionPlanSpec, policy: &PlanSettingsPolicy) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    if spec.backup.policy == BackupPolicy::Skip && !policy.allow_backup_skip {
        out.push(problem(
            "spec.backup.policy",
            format!(
                "skip lets protected pods go with no backup; the {} does not allow it: use required (or best-effort), or set the policy's spec.planSettings.allowBackupSkip",
                policy_name()
            ),
        ));
    }
    if spec.backup.release_network_volumes_at == crate::api::plan::ReleasePoint::Snapshot
        && !policy.allow_release_at_snapshot
    {
        out.push(problem(
            "spec.backup.releaseNetworkVolumesAt",
            format!(
                "Snapshot lets pods on network volumes go at their CSI snapshot, crash-consistent, before the copy in the bucket is verified; the {} does not allow it: use Verified, or set the policy's spec.planSettings.allowReleaseAtSnapshot",
                policy_name()
            ),
        ));
    }
    if spec.drain.force && !policy.allow_force {
        out.push(problem(
            "spec.drain.force",
            format!(
                "true evicts pods no controller owns (lost for good) and overrides an active karpenter.sh/do-not-disrupt; the {} does not allow it: remove it and move or delete such pods yourself, or set the policy's spec.planSettings.allowForce",
                policy_name()
            ),
        ));
    }
    if spec.drain.grace_period_seconds == Some(0) && !policy.allow_zero_grace_period {
        out.push(problem(
            "spec.drain.gracePeriodSeconds",
            format!(
                "0 kills pods without their shutdown; the {} does not allow it: leave it out to use each pod's own grace period, or set the policy's spec.planSettings.allowZeroGracePeriod",
                policy_name()
            ),
        ));
    }
    out
}

/// The refusal of an Execute plan whose nodes run snapdrain's own controller pods (`pods`, as
/// `namespace/name on node`): draining them takes down the leader driving the plan and the eviction
/// gate with it, so the plan would run on a standby (or none) while the gate is away. A Release plan
/// and a dry run drain nothing themselves and are not refused. Moving the pod first is always
/// possible where a plan could move it, so no switch allows this.
pub fn check_controller_pods(spec: &DisruptionPlanSpec, pods: &[String]) -> Option<SpecProblem> {
    if pods.is_empty() || spec.mode != PlanMode::Execute || spec.dry_run {
        return None;
    }
    let field = if spec.nodes.is_empty() {
        "spec.nodeSelector"
    } else {
        "spec.nodes"
    };
    Some(problem(
        field,
        format!(
            "selects the node of snapdrain's own controller pod {}; snapdrain does not drain the nodes it runs on: cordon the node and delete that pod so it is scheduled elsewhere, then create the plan again (or use mode Release and let the autoscaler drain it)",
            pods.join(", ")
        ),
    ))
}

/// The one-line message of a refused plan, for `status.message` and the `Valid` condition.
pub fn refusal_message(problems: &[SpecProblem]) -> String {
    let parts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    format!("refused by {}: {}", policy_name(), parts.join("; "))
}

/// Every problem of `spec` under the policy `policy`, each naming the plan's field and the policy field
/// that would allow it.
pub fn check(spec: &ReplacementSpec, policy: &ReplacementPolicy) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    if let Some(class) = &spec.node_class_ref
        && !policy.node_classes.is_empty()
        && !policy.node_classes.contains(&class.name)
    {
        out.push(problem(
            "spec.replacement.nodeClassRef.name",
            format!(
                "EC2NodeClass {} is not one the {} allows: name one of {} or add it to the policy's spec.replacement.nodeClasses",
                class.name,
                policy_name(),
                policy.node_classes.join(", ")
            ),
        ));
    }
    let lists = [
        AllowList {
            field: "imageId",
            values: spec.image_id.iter().map(String::as_str).collect(),
            allowed: &policy.image_ids,
            policy_field: "imageIds",
            instead: "leave it out to launch the EC2NodeClass's or the replaced instance's AMI",
        },
        AllowList {
            field: "iamInstanceProfile",
            values: spec
                .iam_instance_profile
                .iter()
                .map(String::as_str)
                .collect(),
            allowed: &policy.instance_profiles,
            policy_field: "instanceProfiles",
            instead: "leave it out to use the EC2NodeClass's or the replaced instance's",
        },
        AllowList {
            field: "securityGroupIds",
            values: spec.security_group_ids.iter().map(String::as_str).collect(),
            allowed: &policy.security_group_ids,
            policy_field: "securityGroupIds",
            instead: "leave them out to use the EC2NodeClass's or the replaced instance's",
        },
        AllowList {
            field: "subnets",
            values: spec.subnets.iter().map(String::as_str).collect(),
            allowed: &policy.subnets,
            policy_field: "subnets",
            instead: "leave them out to use the EC2NodeClass's or the replaced instance's",
        },
        AllowList {
            field: "launchTemplate",
            values: spec
                .launch_template
                .iter()
                .map(|t| t.id_or_name())
                .filter(|t| !t.is_empty())
                .collect(),
            allowed: &policy.launch_templates,
            policy_field: "launchTemplates",
            instead: "name an EC2NodeClass in spec.replacement.nodeClassRef instead",
        },
    ];
    for AllowList {
        field,
        values,
        allowed,
        policy_field,
        instead,
    } in lists
    {
        let refused = refused(&values, allowed, policy.allow_free_form);
        if !refused.is_empty() {
            out.push(problem(
                &format!("spec.replacement.{field}"),
                format!(
                    "{} not allowed by the {}: list {} in the policy's spec.replacement.{policy_field}{}, or {instead}",
                    refused.join(", "),
                    policy_name(),
                    if refused.len() == 1 { "it" } else { "them" },
                    if allowed.is_empty() && !policy.allow_free_form {
                        " (or set its spec.replacement.allowFreeForm)"
                    } else {
                        ""
                    },
                ),
            ));
        }
    }
    if !policy.instance_types.is_empty() {
        let types: Vec<&str> = spec.instance_types.iter().map(String::as_str).collect();
        let refused = refused(&types, &policy.instance_types, false);
        if !refused.is_empty() {
            out.push(problem(
                "spec.replacement.instanceTypes",
                format!(
                    "{} not allowed by the {}: use {} or list them in the policy's spec.replacement.instanceTypes",
                    refused.join(", "),
                    policy_name(),
                    policy.instance_types.join(", ")
                ),
            ));
        }
    }
    if let Some(m) = &spec.metadata_options
        && !policy.allow_free_form
        && (m.http_tokens != "required" || m.http_put_response_hop_limit > MAX_SAFE_HOP_LIMIT)
    {
        out.push(problem(
            "spec.replacement.metadataOptions",
            format!(
                "IMDS with httpTokens {} and hop limit {} lets pods take the node role's credentials; the {} allows httpTokens required with a hop limit of at most {MAX_SAFE_HOP_LIMIT} (or set its spec.replacement.allowFreeForm)",
                m.http_tokens,
                m.http_put_response_hop_limit,
                policy_name()
            ),
        ));
    }
    if let Some(br) = &spec.bottlerocket {
        bottlerocket(br, policy, &mut out);
    }
    out
}

/// One free-form field of the plan and the policy's list for it.
struct AllowList<'a> {
    /// Under `spec.replacement.`.
    field: &'static str,
    values: Vec<&'a str>,
    allowed: &'a [String],
    /// Under the policy's `spec.replacement.`.
    policy_field: &'static str,
    /// What the plan can do instead.
    instead: &'static str,
}

/// Values not on `allowed` (all of them when it is empty, unless free form is allowed).
fn refused<'a>(values: &[&'a str], allowed: &[String], free_form: bool) -> Vec<&'a str> {
    if allowed.is_empty() && free_form {
        return Vec::new();
    }
    values
        .iter()
        .filter(|v| !allowed.iter().any(|a| a == *v))
        .copied()
        .collect()
}

fn bottlerocket(br: &BottlerocketSpec, policy: &ReplacementPolicy, out: &mut Vec<SpecProblem>) {
    let cluster: Vec<&str> = [
        ("clusterName", &br.cluster_name),
        ("apiServer", &br.api_server),
        ("clusterCertificate", &br.cluster_certificate),
    ]
    .into_iter()
    .filter_map(|(f, v)| v.as_ref().map(|_| f))
    .collect();
    if !cluster.is_empty() && !policy.allow_free_form {
        out.push(problem(
            "spec.replacement.bottlerocket",
            format!(
                "{} would join the node to a cluster the plan names; the {} takes them from the controller's flags or the replaced instance's user data: remove them (or set the policy's spec.replacement.allowFreeForm)",
                cluster.join(", "),
                policy_name()
            ),
        ));
    }
    for (field, paths) in setting_paths(br) {
        let refused: Vec<String> = paths
            .into_iter()
            .filter(|p| !setting_allowed(p, policy))
            .collect();
        if refused.is_empty() {
            continue;
        }
        let root = refused.iter().any(|p| is_root_setting(p));
        out.push(problem(
            &format!("spec.replacement.bottlerocket.{field}"),
            format!(
                "settings {} are not allowed by the {}: list them (or a parent path) in the policy's spec.replacement.allowedSettings{}",
                refused.join(", "),
                policy_name(),
                if root {
                    " (host and bootstrap containers, bootstrap commands, kernel, boot, pki and container-registry settings run as root or change what the node trusts, so they must be listed even with allowFreeForm)"
                } else if policy.allow_free_form {
                    ""
                } else {
                    ", or set its spec.replacement.allowFreeForm"
                }
            ),
        ));
    }
}

/// The settings paths (under `settings.`, dotted) each Bottlerocket field of the plan writes.
pub fn setting_paths(br: &BottlerocketSpec) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    let keyed = |prefix: &str, keys: Vec<&String>| -> Vec<String> {
        keys.into_iter().map(|k| format!("{prefix}.{k}")).collect()
    };
    out.push((
        "nodeLabels",
        keyed("kubernetes.node-labels", br.node_labels.keys().collect()),
    ));
    out.push((
        "nodeTaints",
        keyed("kubernetes.node-taints", br.node_taints.keys().collect()),
    ));
    out.push((
        "sysctls",
        keyed("kernel.sysctl", br.sysctls.keys().collect()),
    ));
    out.push((
        "clusterDnsIp",
        br.cluster_dns_ip
            .iter()
            .map(|_| "kubernetes.cluster-dns-ip".to_string())
            .collect(),
    ));
    let mut free = Vec::new();
    if let Some(map) = &br.settings {
        for (k, v) in map {
            leaves(k, v, &mut free);
        }
    }
    free.sort();
    out.push(("settings", free));
    out.retain(|(_, paths)| !paths.is_empty());
    out
}

/// Paths of the leaves under `path` (a table's keys joined by dots; anything else is a leaf).
fn leaves(path: &str, value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(&format!("{path}.{k}"), v, out);
            }
        }
        _ => out.push(path.to_string()),
    }
}

/// `path` is `entry` or lies under it.
fn under(path: &str, entry: &str) -> bool {
    path == entry
        || path
            .strip_prefix(entry)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn is_root_setting(path: &str) -> bool {
    ROOT_SETTINGS.iter().any(|r| under(path, r))
}

/// Listed in `allowedSettings`, or free form allows it (never a root setting).
fn setting_allowed(path: &str, policy: &ReplacementPolicy) -> bool {
    policy.allowed_settings.iter().any(|e| under(path, e))
        || (policy.allow_free_form && !is_root_setting(path))
}

/// A plan that selects `selected` nodes (by `spec.nodes`, or by its selector) under the cap `max`
/// (0: none).
pub fn check_node_count(selected: usize, by_selector: bool, max: u32) -> Option<SpecProblem> {
    let max_nodes = usize::try_from(max).unwrap_or(usize::MAX);
    if max == 0 || selected <= max_nodes {
        return None;
    }
    let (field, what) = if by_selector {
        ("spec.nodeSelector", "matches")
    } else {
        ("spec.nodes", "lists")
    };
    Some(problem(
        field,
        format!(
            "{what} {selected} nodes; the {} allows at most {max} per plan: split the plan, or raise the policy's spec.maxNodesPerPlan",
            policy_name()
        ),
    ))
}

fn policy_name() -> String {
    format!("DisruptionPolicy {DEFAULT_POLICY}")
}

fn problem(field: &str, message: String) -> SpecProblem {
    SpecProblem {
        field: field.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ReplacementSpec {
        serde_json::from_value(json).expect("a replacement spec")
    }

    fn policy(json: serde_json::Value) -> ReplacementPolicy {
        serde_json::from_value(json).expect("a replacement policy")
    }

    fn fields(problems: &[SpecProblem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn the_default_policy_refuses_every_free_form_launch_setting() {
        let s = spec(serde_json::json!({
            "when": "before-drain", "instanceTypes": ["m6i.large"], "imageId": "ami-0evil",
            "iamInstanceProfile": "admin", "securityGroupIds": ["sg-0open"], "subnets": ["subnet-0x"],
            "metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 64},
            "bottlerocket": {
                "apiServer": "https://other.example", "nodeLabels": {"example.com/pool": "db"},
                "sysctls": {"kernel.core_pattern": "|/bin/sh"},
                "settings": {"bootstrap-containers": {"x": {"source": "evil/img", "essential": true}}}
            }
        }));
        let problems = check(&s, &ReplacementPolicy::default());
        assert_eq!(
            fields(&problems),
            [
                "spec.replacement.imageId",
                "spec.replacement.iamInstanceProfile",
                "spec.replacement.securityGroupIds",
                "spec.replacement.subnets",
                "spec.replacement.metadataOptions",
                "spec.replacement.bottlerocket",
                "spec.replacement.bottlerocket.nodeLabels",
                "spec.replacement.bottlerocket.sysctls",
                "spec.replacement.bottlerocket.settings",
            ]
        );
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        let text = text.join("\n");
        for want in [
            "ami-0evil not allowed by the DisruptionPolicy default: list it in the policy's spec.replacement.imageIds (or set its spec.replacement.allowFreeForm)",
            "bootstrap-containers.x.essential, bootstrap-containers.x.source",
            "kernel.sysctl.kernel.core_pattern",
            "kubernetes.node-labels.example.com/pool",
            "spec.replacement.allowedSettings",
            "apiServer",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
    }

    #[test]
    fn a_node_class_or_an_inherited_launch_needs_nothing_from_the_policy() {
        let by_class = spec(serde_json::json!({
            "when": "after-drain", "instanceTypes": ["m6i.large"], "nodeClassRef": {"name": "default"}
        }));
        assert_eq!(check(&by_class, &ReplacementPolicy::default()), []);
        let inherited = spec(serde_json::json!({
            "when": "after-drain", "instanceTypes": ["m6i.large"],
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}
        }));
        assert_eq!(check(&inherited, &ReplacementPolicy::default()), []);
        // A list of classes narrows which may be named.
        let narrowed = policy(serde_json::json!({"nodeClasses": ["general"]}));
        let p = check(&by_class, &narrowed);
        assert_eq!(fields(&p), ["spec.replacement.nodeClassRef.name"]);
        assert!(
            p[0].message.contains("spec.replacement.nodeClasses"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn allow_lists_admit_exactly_their_values() {
        let p = policy(serde_json::json!({
            "imageIds": ["ami-0good"], "subnets": ["subnet-0a"], "instanceTypes": ["m6i.large"],
            "launchTemplates": ["nodes"], "allowedSettings": ["kubernetes.node-labels.example.com/team", "kernel.sysctl.fs.inotify"]
        }));
        let ok = spec(serde_json::json!({
            "when": "after-drain", "instanceTypes": ["m6i.large"], "imageId": "ami-0good",
            "subnets": ["subnet-0a"], "launchTemplate": {"name": "nodes"},
            "bottlerocket": {"nodeLabels": {"example.com/team": "a"}, "sysctls": {"fs.inotify.max_user_watches": "524288"}}
        }));
        assert_eq!(check(&ok, &p), []);
        let bad = spec(serde_json::json!({
            "when": "after-drain", "instanceTypes": ["m6i.large", "p5.48xlarge"], "imageId": "ami-0other",
            "subnets": ["subnet-0a", "subnet-0b"], "launchTemplate": {"name": "other"},
            "bottlerocket": {"nodeLabels": {"example.com/teams": "a"}, "sysctls": {"fs.inotifyx": "1"}}
        }));
        let problems = check(&bad, &p);
        assert_eq!(
            fields(&problems),
            [
                "spec.replacement.imageId",
                "spec.replacement.subnets",
                "spec.replacement.launchTemplate",
                "spec.replacement.instanceTypes",
                "spec.replacement.bottlerocket.nodeLabels",
                "spec.replacement.bottlerocket.sysctls",
            ]
        );
        assert!(
            problems[1].message.starts_with("subnet-0b not allowed"),
            "{}",
            problems[1]
        );
        assert!(
            problems[3].message.starts_with("p5.48xlarge"),
            "{}",
            problems[3]
        );
    }

    #[test]
    fn free_form_still_needs_root_settings_listed() {
        let free = policy(serde_json::json!({"allowFreeForm": true}));
        let s = spec(serde_json::json!({
            "when": "after-drain", "instanceTypes": ["m6i.large"], "imageId": "ami-0any",
            "iamInstanceProfile": "p", "securityGroupIds": ["sg-1"], "subnets": ["subnet-1"],
            "metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 3},
            "bottlerocket": {"clusterName": "c", "nodeLabels": {"a": "b"}, "settings": {
                "motd": "hi", "host-containers": {"admin": {"enabled": true}}}}
        }));
        let problems = check(&s, &free);
        assert_eq!(
            fields(&problems),
            ["spec.replacement.bottlerocket.settings"]
        );
        assert!(
            problems[0]
                .message
                .contains("host-containers.admin.enabled")
        );
        assert!(!problems[0].message.contains("motd"), "{}", problems[0]);
        assert!(problems[0].message.contains("even with allowFreeForm"));
        let listed = policy(
            serde_json::json!({"allowFreeForm": true, "allowedSettings": ["host-containers.admin"]}),
        );
        assert_eq!(check(&s, &listed), []);
        // A list narrows free form: only its values.
        let narrowed =
            policy(serde_json::json!({"allowFreeForm": true, "imageIds": ["ami-0good"]}));
        assert_eq!(
            fields(&check(&s, &narrowed)),
            [
                "spec.replacement.imageId",
                "spec.replacement.bottlerocket.settings"
            ]
        );
    }

    #[test]
    fn a_parent_path_allows_its_children_and_nothing_beside_it() {
        assert!(under(
            "kernel.sysctl.fs.inotify.max_user_watches",
            "kernel.sysctl.fs.inotify"
        ));
        assert!(under("kubernetes.node-labels", "kubernetes.node-labels"));
        assert!(!under(
            "kubernetes.node-labels-extra.a",
            "kubernetes.node-labels"
        ));
        assert!(!under("kernel", "kernel.sysctl"));
        assert!(is_root_setting("kernel.modules.x.allowed"));
        assert!(!is_root_setting("kernelx"));
        assert!(check_setting_entry("kubernetes.node-labels").is_ok());
        for bad in ["", ".kernel", "kernel.", "a..b", "settings.kernel"] {
            assert!(check_setting_entry(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_plan_is_judged_on_its_cap_and_only_a_launched_replacement_on_its_settings() {
        let policy = DisruptionPolicySpec::defaults();
        assert_eq!(policy.max_nodes_per_plan, 10);
        let plan: DisruptionPlanSpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"pool": "db"}},
            "replacement": {"when": "none", "imageId": "ami-0evil"}
        }))
        .expect("a plan");
        assert_eq!(check_plan(&plan, &policy, 10), []);
        let over = check_plan(&plan, &policy, 11);
        assert_eq!(fields(&over), ["spec.nodeSelector"]);
        let mut launching = plan.clone();
        launching.replacement = Some(spec(
            serde_json::json!({"when": "after-drain", "imageId": "ami-0evil"}),
        ));
        let problems = check_plan(&launching, &policy, 11);
        assert_eq!(
            fields(&problems),
            ["spec.nodeSelector", "spec.replacement.imageId"]
        );
        let m = refusal_message(&problems);
        assert!(
            m.starts_with(
                "refused by DisruptionPolicy default: spec.nodeSelector: matches 11 nodes"
            ),
            "{m}"
        );
    }

    #[test]
    fn the_node_cap_names_the_field_and_the_policy_field() {
        assert_eq!(check_node_count(10, false, 10), None);
        assert_eq!(check_node_count(1000, true, 0), None);
        let p = check_node_count(11, true, 10).expect("over the cap");
        assert_eq!(p.field, "spec.nodeSelector");
        assert!(p.message.contains("matches 11 nodes"), "{p}");
        assert!(p.message.contains("spec.maxNodesPerPlan"), "{p}");
        assert_eq!(
            check_node_count(3, false, 2).map(|p| p.field),
            Some("spec.nodes".to_string())
        );
    }

    #[test]
    fn skip_snapshot_release_force_and_a_zero_grace_period_need_the_policys_switch() {
        let plan: DisruptionPlanSpec = serde_json::from_value(serde_json::json!({
            "nodes": ["n1"], "backup": {"policy": "skip", "releaseNetworkVolumesAt": "Snapshot"},
            "drain": {"force": true, "gracePeriodSeconds": 0}
        }))
        .expect("a plan");
        let problems = check_settings(&plan, &PlanSettingsPolicy::default());
        assert_eq!(
            fields(&problems),
            [
                "spec.backup.policy",
                "spec.backup.releaseNetworkVolumesAt",
                "spec.drain.force",
                "spec.drain.gracePeriodSeconds"
            ]
        );
        for (p, switch) in problems.iter().zip([
            "spec.planSettings.allowBackupSkip",
            "spec.planSettings.allowReleaseAtSnapshot",
            "spec.planSettings.allowForce",
            "spec.planSettings.allowZeroGracePeriod",
        ]) {
            assert!(p.message.contains(switch), "{p}");
        }
        // check_plan judges them too, whatever the mode.
        assert_eq!(
            check_plan(&plan, &DisruptionPolicySpec::defaults(), 1).len(),
            4
        );
        let allowed = PlanSettingsPolicy {
            allow_backup_skip: true,
            allow_force: true,
            allow_zero_grace_period: true,
            allow_release_at_snapshot: true,
        };
        assert_eq!(check_settings(&plan, &allowed), []);
        let safe: DisruptionPlanSpec = serde_json::from_value(serde_json::json!({
            "nodes": ["n1"], "backup": {"policy": "best-effort"}, "drain": {"gracePeriodSeconds": 1}
        }))
        .expect("a plan");
        assert_eq!(check_settings(&safe, &PlanSettingsPolicy::default()), []);
    }

    #[test]
    fn an_execute_plan_on_the_controllers_node_is_refused_naming_the_pod() {
        let mut plan: DisruptionPlanSpec =
            serde_json::from_value(serde_json::json!({"nodes": ["n1"]})).expect("a plan");
        let pods = vec!["snapdrain/snapdrain-0 on n1".to_string()];
        assert_eq!(check_controller_pods(&plan, &[]), None);
        let p = check_controller_pods(&plan, &pods).expect("refused");
        assert_eq!(p.field, "spec.nodes");
        assert!(p.message.contains("snapdrain/snapdrain-0 on n1"), "{p}");
        plan.dry_run = true;
        assert_eq!(check_controller_pods(&plan, &pods), None);
        plan.dry_run = false;
        plan.mode = PlanMode::Release;
        assert_eq!(check_controller_pods(&plan, &pods), None);
    }
}

//! Validation of a `DisruptionPlanSpec` without an API server.
//!
//! Repeats every constraint the CRD schema and its CEL rules enforce (so a controller running against an
//! API server that skips CEL, or against objects stored before a rule existed, still marks a bad plan
//! Invalid), and adds the checks CEL cannot express cheaply (duplicate node names, selector operators,
//! durations that parse). On success the durations come back parsed.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use regex::Regex;

use super::duration::{DurationError, parse_spec_duration};
use super::plan::{
    BackupPolicy, DURATION_MAX_LENGTH, DURATION_PATTERN, DisruptionPlanSpec, NODE_NAME_PATTERN,
    PlanMode, ReplacementWhen, TAINT_VALUE_PATTERN,
};

/// One thing wrong with a spec: the JSON path of the field and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecProblem {
    /// e.g. `spec.drain.maxConcurrentEvictions`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A spec that passed [`validate`], with its durations parsed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ValidSpec {
    pub backup_ttl: Option<Duration>,
    pub reuse_if_newer_than: Option<Duration>,
    pub backup_timeout: Option<Duration>,
    pub drain_timeout: Option<Duration>,
    /// Release mode: how long released holds wait for the node to be taken.
    pub release_window: Duration,
}

/// Release window when a plan does not set one (DESIGN.md, the hold's life cycle).
pub const DEFAULT_RELEASE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// All problems joined into one line, for `status.message` and the `Valid` condition.
pub fn problems_message(problems: &[SpecProblem]) -> String {
    let parts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    format!("invalid spec: {}", parts.join("; "))
}

/// Checks `spec`; returns every problem found, not just the first.
pub fn validate(spec: &DisruptionPlanSpec) -> Result<ValidSpec, Vec<SpecProblem>> {
    let mut v = Validator::default();
    v.nodes(spec);
    if let Some(r) = &spec.reason
        && r.len() > 1024
    {
        v.problem("spec.reason", "must be at most 1024 characters");
    }

    let b = &spec.backup;
    if b.storage_location
        .as_ref()
        .is_some_and(|l| l.is_empty() || l.len() > 253)
    {
        v.problem(
            "spec.backup.storageLocation",
            "must name a Velero BackupStorageLocation (1-253 characters)",
        );
    }
    if !is_dns_label(&b.velero_namespace) {
        v.problem(
            "spec.backup.veleroNamespace",
            format!(
                "{:?} is not a namespace name (DNS-1123 label)",
                b.velero_namespace
            ),
        );
    }
    if !(1..=10).contains(&b.max_attempts) {
        v.problem(
            "spec.backup.maxAttempts",
            format!("must be between 1 and 10, got {}", b.max_attempts),
        );
    }
    let backup_ttl = v.duration("spec.backup.ttl", b.ttl.as_deref());
    let reuse_if_newer_than = v.duration(
        "spec.backup.reuseIfNewerThan",
        b.reuse_if_newer_than.as_deref(),
    );
    let backup_timeout = v.duration("spec.backup.timeout", b.timeout.as_deref());
    if b.policy == BackupPolicy::Skip && b.reuse_if_newer_than.is_some() {
        v.problem(
            "spec.backup.reuseIfNewerThan",
            "has no effect with backup.policy skip; remove one of them",
        );
    }

    let d = &spec.drain;
    let drain_timeout = v.duration("spec.drain.timeout", d.timeout.as_deref());
    if let Some(g) = d.grace_period_seconds
        && g < 0
    {
        v.problem(
            "spec.drain.gracePeriodSeconds",
            format!("must be >= 0, got {g}"),
        );
    }
    if !(1..=1000).contains(&d.max_concurrent_evictions) {
        v.problem(
            "spec.drain.maxConcurrentEvictions",
            format!(
                "must be between 1 and 1000, got {}",
                d.max_concurrent_evictions
            ),
        );
    }
    if let Some(sel) = &d.pod_selector {
        v.selector("spec.drain.podSelector", sel);
    }

    v.replacement(spec);
    let release_window = v
        .duration("spec.releaseWindow", spec.release_window.as_deref())
        .unwrap_or(DEFAULT_RELEASE_WINDOW);

    if v.problems.is_empty() {
        Ok(ValidSpec {
            backup_ttl,
            reuse_if_newer_than,
            backup_timeout,
            drain_timeout,
            release_window,
        })
    } else {
        Err(v.problems)
    }
}

#[derive(Default)]
struct Validator {
    problems: Vec<SpecProblem>,
}

impl Validator {
    fn problem(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(SpecProblem {
            field: field.to_owned(),
            message: message.into(),
        });
    }

    fn nodes(&mut self, spec: &DisruptionPlanSpec) {
        // An explicit `nodes: []` deserializes like an absent list, so both read "set exactly one".
        match (spec.nodes.is_empty(), &spec.node_selector) {
            (true, None) | (false, Some(_)) => {
                self.problem("spec", "set exactly one of spec.nodes or spec.nodeSelector");
            }
            _ => {}
        }
        if let Some(sel) = &spec.node_selector {
            let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
            if empty {
                self.problem(
                    "spec.nodeSelector",
                    "must not be empty: an empty selector would select every node",
                );
            } else {
                self.selector("spec.nodeSelector", sel);
            }
        }
        if spec.nodes.len() > 1000 {
            self.problem(
                "spec.nodes",
                format!("at most 1000 nodes per plan, got {}", spec.nodes.len()),
            );
        }
        let re = anchored(NODE_NAME_PATTERN);
        let mut seen = BTreeSet::new();
        for (i, name) in spec.nodes.iter().enumerate() {
            if name.len() > 253 || !re.is_match(name) {
                self.problem(
                    &format!("spec.nodes[{i}]"),
                    format!("{name:?} is not a node name (lowercase DNS-1123 subdomain, at most 253 characters)"),
                );
            }
            if !seen.insert(name.as_str()) {
                self.problem(
                    &format!("spec.nodes[{i}]"),
                    format!("node {name:?} is listed twice"),
                );
            }
        }
    }

    fn duration(&mut self, field: &str, value: Option<&str>) -> Option<Duration> {
        let value = value?;
        match spec_duration(value) {
            Ok(d) => Some(d),
            Err(e) => {
                self.problem(field, e.to_string());
                None
            }
        }
    }

    fn selector(&mut self, field: &str, sel: &LabelSelector) {
        if let Err(e) = kube::core::Selector::try_from(sel.clone()) {
            self.problem(field, format!("invalid label selector: {e}"));
        }
    }

    fn replacement(&mut self, spec: &DisruptionPlanSpec) {
        let Some(r) = &spec.replacement else { return };
        if r.when != ReplacementWhen::None && spec.mode == PlanMode::Release {
            self.problem(
                "spec.replacement.when",
                "replacement is only launched in Execute mode; in Release mode the autoscaler provisions capacity",
            );
        }
        if r.when != ReplacementWhen::None
            && r.instance_types.is_empty()
            && r.launch_template.is_none()
        {
            self.problem(
                "spec.replacement",
                "replacement needs instanceTypes or launchTemplate unless replacement.when is none",
            );
        }
        if let Some(class) = &r.node_class_ref {
            let named: Vec<&str> = [
                ("launchTemplate", r.launch_template.is_some()),
                ("imageId", r.image_id.is_some()),
                ("iamInstanceProfile", r.iam_instance_profile.is_some()),
                ("securityGroupIds", !r.security_group_ids.is_empty()),
                ("subnets", !r.subnets.is_empty()),
                ("metadataOptions", r.metadata_options.is_some()),
            ]
            .into_iter()
            .filter_map(|(f, set)| set.then_some(f))
            .collect();
            if !named.is_empty() {
                self.problem(
                    "spec.replacement.nodeClassRef",
                    format!(
                        "EC2NodeClass {} carries the AMI, instance profile, security groups, subnets and IMDS options: remove spec.replacement.{}",
                        class.name,
                        named.join(", spec.replacement.")
                    ),
                );
            }
            if class.name.is_empty()
                || class.name.len() > 253
                || !anchored(NODE_NAME_PATTERN).is_match(&class.name)
            {
                self.problem(
                    "spec.replacement.nodeClassRef.name",
                    format!(
                        "{:?} is not an EC2NodeClass name (DNS-1123 subdomain)",
                        class.name
                    ),
                );
            }
        }
        if let Some(lt) = &r.launch_template {
            if lt.id.is_some() == lt.name.is_some() {
                self.problem(
                    "spec.replacement.launchTemplate",
                    "launchTemplate needs exactly one of id or name",
                );
            }
            if let Some(id) = &lt.id
                && !anchored(r"^lt-[0-9a-f]{17}$").is_match(id)
            {
                self.problem(
                    "spec.replacement.launchTemplate.id",
                    format!("{id:?} is not a launch template id (lt- and 17 hex characters); put a template name in launchTemplate.name"),
                );
            }
            if let Some(name) = &lt.name
                && !(3..=128).contains(&name.len())
            {
                self.problem(
                    "spec.replacement.launchTemplate.name",
                    "must be 3-128 characters",
                );
            }
            if let Some(ver) = &lt.version
                && !anchored(r"^([0-9]+|\$Latest|\$Default)$").is_match(ver)
            {
                self.problem(
                    "spec.replacement.launchTemplate.version",
                    format!("{ver:?} is not a version number, $Latest or $Default"),
                );
            }
        }
        if r.instance_types.len() > 50 {
            self.problem(
                "spec.replacement.instanceTypes",
                "at most 50 instance types",
            );
        }
        for (i, t) in r.instance_types.iter().enumerate() {
            if t.is_empty() || t.len() > 64 {
                self.problem(
                    &format!("spec.replacement.instanceTypes[{i}]"),
                    "must be 1-64 characters",
                );
            }
        }
        if r.subnets.len() > 50 {
            self.problem("spec.replacement.subnets", "at most 50 subnets");
        }
        if r.subnets.iter().any(|s| s.is_empty()) {
            self.problem(
                "spec.replacement.subnets",
                "a subnet id is empty; list subnet ids (subnet-...) or leave subnets out to use the replaced node's",
            );
        }
        self.duration("spec.replacement.joinTimeout", r.join_timeout.as_deref());
        if !(1..=5).contains(&r.max_attempts) {
            self.problem("spec.replacement.maxAttempts", "must be 1-5");
        }
        if let Some(m) = &r.metadata_options {
            if !matches!(m.http_tokens.as_str(), "required" | "optional") {
                self.problem(
                    "spec.replacement.metadataOptions.httpTokens",
                    "must be required or optional",
                );
            }
            if !(1..=64).contains(&m.http_put_response_hop_limit) {
                self.problem(
                    "spec.replacement.metadataOptions.httpPutResponseHopLimit",
                    "must be 1-64",
                );
            }
        }
        if let Some(br) = &r.bottlerocket {
            let re = anchored(TAINT_VALUE_PATTERN);
            for (key, values) in &br.node_taints {
                for (i, value) in values.iter().enumerate() {
                    if !re.is_match(value) {
                        self.problem(
                            &format!("spec.replacement.bottlerocket.nodeTaints[{key}][{i}]"),
                            format!("{value:?} must be value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute"),
                        );
                    }
                }
            }
        }
    }
}

/// Parses a duration field of a plan or policy: [`DURATION_PATTERN`] (no sign, no bare `0`), at most
/// [`MAX_SPEC_DURATION`](super::duration::MAX_SPEC_DURATION). `None` for anything else, never a panic.
pub fn parse_duration(value: &str) -> Option<Duration> {
    spec_duration(value).ok()
}

/// [`parse_duration`] with the reason a value is refused.
pub fn spec_duration(value: &str) -> Result<Duration, DurationError> {
    // The CRD's maxLength; the pattern below would also take a megabyte of digits.
    if value.len() > DURATION_MAX_LENGTH || !anchored(DURATION_PATTERN).is_match(value) {
        return Err(DurationError::Syntax(truncated(value)));
    }
    parse_spec_duration(value)
}

/// A value for an error message: at most 64 characters of it.
fn truncated(value: &str) -> String {
    match value.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &value[..i]),
        None => value.to_owned(),
    }
}

/// RFC 1123 label: what namespace and container names are.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && anchored(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").is_match(s)
}

// The patterns are compile-time constants checked by the tests, so building them cannot fail at runtime.
fn anchored(pattern: &str) -> Regex {
    #[allow(clippy::expect_used)]
    Regex::new(pattern).expect("constant pattern compiles")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::{LaunchTemplateRef, ReplacementSpec};

    fn spec(json: serde_json::Value) -> DisruptionPlanSpec {
        serde_json::from_value(json).expect("spec parses")
    }

    fn fields(problems: &[SpecProblem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn minimal_plan_is_valid() {
        let v = validate(&spec(
            serde_json::json!({"nodes": ["ip-10-0-1-5.ec2.internal"]}),
        ))
        .expect("valid");
        assert_eq!(
            v,
            ValidSpec {
                release_window: DEFAULT_RELEASE_WINDOW,
                ..ValidSpec::default()
            }
        );
    }

    #[test]
    fn durations_are_parsed() {
        let v = validate(&spec(serde_json::json!({
            "nodes": ["n1"],
            "backup": {"ttl": "168h", "reuseIfNewerThan": "1h30m", "timeout": "90s"},
            "drain": {"timeout": "1.5m"}
        })))
        .expect("valid");
        assert_eq!(v.backup_ttl, Some(Duration::from_secs(168 * 3600)));
        assert_eq!(v.reuse_if_newer_than, Some(Duration::from_secs(5400)));
        assert_eq!(v.backup_timeout, Some(Duration::from_secs(90)));
        assert_eq!(v.drain_timeout, Some(Duration::from_secs(90)));
    }

    #[test]
    fn bad_durations_are_named() {
        let err = validate(&spec(serde_json::json!({
            "nodes": ["n1"], "backup": {"ttl": "7 days", "timeout": "-5s"}, "drain": {"timeout": "10"}
        })))
        .unwrap_err();
        assert_eq!(
            fields(&err),
            [
                "spec.backup.ttl",
                "spec.backup.timeout",
                "spec.drain.timeout"
            ]
        );
        assert!(err[0].message.contains("1h30m"), "{}", err[0]);
    }

    #[test]
    fn needs_exactly_one_node_source() {
        let err = validate(&spec(serde_json::json!({}))).unwrap_err();
        assert_eq!(
            err[0].message,
            "set exactly one of spec.nodes or spec.nodeSelector"
        );
        let err = validate(&spec(serde_json::json!({"nodes": []}))).unwrap_err();
        assert_eq!(fields(&err), ["spec"]);
        let both =
            spec(serde_json::json!({"nodes": ["n1"], "nodeSelector": {"matchLabels": {"a": "b"}}}));
        assert_eq!(fields(&validate(&both).unwrap_err()), ["spec"]);
        let sel = spec(serde_json::json!({"nodeSelector": {"matchLabels": {"a": "b"}}}));
        assert!(validate(&sel).is_ok());
    }

    #[test]
    fn empty_or_broken_node_selector_is_refused() {
        let err = validate(&spec(serde_json::json!({"nodeSelector": {}}))).unwrap_err();
        assert_eq!(fields(&err), ["spec.nodeSelector"]);
        assert!(err[0].message.contains("every node"));
        let err = validate(&spec(
            serde_json::json!({"nodeSelector": {"matchExpressions": [
                {"key": "a", "operator": "Near", "values": ["b"]}
            ]}}),
        ))
        .unwrap_err();
        assert_eq!(fields(&err), ["spec.nodeSelector"]);
    }

    #[test]
    fn node_names_must_be_dns_and_unique() {
        let err =
            validate(&spec(serde_json::json!({"nodes": ["Node_1", "n2", "n2"]}))).unwrap_err();
        assert_eq!(fields(&err), ["spec.nodes[0]", "spec.nodes[2]"]);
        assert!(err[1].message.contains("twice"));
    }

    #[test]
    fn numeric_ranges() {
        let err = validate(&spec(serde_json::json!({
            "nodes": ["n1"], "backup": {"maxAttempts": 11}, "drain": {"maxConcurrentEvictions": 0, "gracePeriodSeconds": -1}
        })))
        .unwrap_err();
        assert_eq!(
            fields(&err),
            [
                "spec.backup.maxAttempts",
                "spec.drain.gracePeriodSeconds",
                "spec.drain.maxConcurrentEvictions"
            ]
        );
    }

    #[test]
    fn replacement_needs_something_to_launch() {
        let mut s =
            spec(serde_json::json!({"nodes": ["n1"], "replacement": {"when": "after-drain"}}));
        assert_eq!(fields(&validate(&s).unwrap_err()), ["spec.replacement"]);
        s.replacement = Some(ReplacementSpec {
            when: ReplacementWhen::None,
            max_attempts: 1,
            ..Default::default()
        });
        assert!(validate(&s).is_ok(), "when: none needs nothing");
        // Without an imageId the AMI comes from the node class or the replaced instance.
        let s = spec(
            serde_json::json!({"nodes": ["n1"], "replacement": {"when": "before-drain", "instanceTypes": ["m7i.large"]}}),
        );
        assert!(validate(&s).is_ok());
        let s = spec(
            serde_json::json!({"nodes": ["n1"], "replacement": {"when": "before-drain", "instanceTypes": ["m7i.large"],
            "nodeClassRef": {"name": "default"}, "imageId": "ami-0abc", "subnets": ["subnet-1"]}}),
        );
        let problems = validate(&s).unwrap_err();
        assert_eq!(fields(&problems), ["spec.replacement.nodeClassRef"]);
        assert!(
            problems[0]
                .message
                .contains("remove spec.replacement.imageId, spec.replacement.subnets"),
            "{}",
            problems[0]
        );
        let s = spec(
            serde_json::json!({"nodes": ["n1"], "replacement": {"when": "before-drain", "instanceTypes": ["m7i.large"], "imageId": "ami-0abc"}}),
        );
        assert!(validate(&s).is_ok());
    }

    #[test]
    fn launch_template_needs_id_xor_name() {
        let mut s = spec(
            serde_json::json!({"nodes": ["n1"], "replacement": {"when": "after-drain",
            "launchTemplate": {"id": "lt-0abcd290751193123", "name": "workers"}}}),
        );
        assert_eq!(
            fields(&validate(&s).unwrap_err()),
            ["spec.replacement.launchTemplate"]
        );
        if let Some(r) = s.replacement.as_mut() {
            r.launch_template = Some(LaunchTemplateRef {
                id: Some("lt-0abcd290751193123".into()),
                name: None,
                version: Some("latest".into()),
            });
        }
        assert_eq!(
            fields(&validate(&s).unwrap_err()),
            ["spec.replacement.launchTemplate.version"]
        );
        // EC2 ids are lt- and 17 hex characters; anything else is a name.
        if let Some(r) = s.replacement.as_mut() {
            r.launch_template = Some(LaunchTemplateRef {
                id: Some("lt-web".into()),
                ..Default::default()
            });
        }
        let problems = validate(&s).unwrap_err();
        assert_eq!(fields(&problems), ["spec.replacement.launchTemplate.id"]);
        assert!(problems_message(&problems).contains("launchTemplate.name"));
    }

    #[test]
    fn replacement_is_refused_in_release_mode() {
        let s = spec(serde_json::json!({"nodes": ["n1"], "mode": "Release",
            "replacement": {"when": "after-drain", "instanceTypes": ["m7i.large"], "imageId": "ami-0abc"}}));
        assert_eq!(
            fields(&validate(&s).unwrap_err()),
            ["spec.replacement.when"]
        );
    }

    #[test]
    fn taints_need_an_effect() {
        let s = spec(
            serde_json::json!({"nodes": ["n1"], "replacement": {"when": "after-drain",
            "instanceTypes": ["m7i.large"], "imageId": "ami-0abc",
            "bottlerocket": {"nodeTaints": {"dedicated": ["db:NoSchedule", "db"]}}}}),
        );
        assert_eq!(
            fields(&validate(&s).unwrap_err()),
            ["spec.replacement.bottlerocket.nodeTaints[dedicated][1]"]
        );
    }

    #[test]
    fn message_lists_every_problem() {
        let err = validate(&spec(
            serde_json::json!({"nodes": ["A"], "backup": {"veleroNamespace": "Velero"}}),
        ))
        .unwrap_err();
        let msg = problems_message(&err);
        assert!(msg.starts_with("invalid spec: spec.nodes[0]: "), "{msg}");
        assert!(msg.contains("; spec.backup.veleroNamespace: "), "{msg}");
    }
}

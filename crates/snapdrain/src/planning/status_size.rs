//! How large a plan's status can grow, judged while planning (real-cluster review #18). etcd refuses a
//! value over its `--max-request-bytes` (1.5 MiB by default): a plan whose status outgrew it could write
//! nothing any more, not even its rollback, and its finalizer would keep it, with its nodes cordoned and
//! tainted. So every free-text field is cut to a bound when the status is written ([`bound_texts`]), and
//! a plan whose status could pass the budget at its largest ([`worst_case_bytes`]) fails before any node
//! is touched, asking for a split. Pure.

use crate::api::status::{DisruptionPlanStatus, EvictionTarget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// etcd's default `--max-request-bytes` (etcd `server/embed/config.go` `DefaultMaxRequestBytes`).
/// Custom resources are stored as JSON, so the object's JSON size is what counts.
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;

/// The default budget for a plan's status: a third of etcd's limit is left for the spec (up to 1,000
/// node names), metadata and managedFields.
pub const DEFAULT_BUDGET: usize = 1 << 20;

/// `status.message` and each condition's message.
pub const MAX_MESSAGE: usize = 4096;
/// A node's `blockedBy`, a backup's message and verification error, a replacement's capacity error.
pub const MAX_NOTE: usize = 1024;
/// A refused eviction's last error, kept per pod.
pub const MAX_REFUSAL: usize = 80;
/// Each line of a node's join record saying where a launch setting came from.
pub const MAX_FROM: usize = 512;

/// What a node's progress can gain after planning besides its eviction targets: `blockedBy`, the
/// replacement, instance and join records (with the architecture check's lines) (checked by the unit test below against a node with every
/// one of them at its largest).
const NODE_GROWTH: usize = 12 * 1024;
/// What a node's emergency EBS snapshot set can take: reason and error at [`MAX_NOTE`], and one entry
/// per protected volume (about 200 bytes; a Nitro instance attaches at most 28 EBS volumes, EC2 user
/// guide "Amazon EBS volume limits for Amazon EC2 instances") plus unsaved claims with their reason.
const EMERGENCY_GROWTH: usize = 16 * 1024;
/// What a backup attempt's record can gain after planning: phase, times, verified objects, messages.
const BACKUP_GROWTH: usize = 4 * 1024;
/// What a backup attempt's `policyHooks` can take: [`super::backup_hooks::SHOWN`] entries of a name
/// (at most 63 bytes) with its counts, and the count of the rest.
const POLICY_HOOKS_GROWTH: usize = 512;
/// What one volume's record can gain once its CSI snapshot is cut (a release at the snapshot): the
/// snapshot's and content's names (at most 253 bytes each), the handle, the time and the flags.
const CSI_SNAPSHOT_GROWTH: usize = 768;
/// What the status as a whole can gain: conditions, message, timings, summary, release records.
const FIXED_GROWTH: usize = 40 * 1024;

/// Cuts `text` to at most `max` bytes as JSON writes it (a quote or backslash takes two; control
/// characters, which JSON escapes into up to six, become spaces); a cut text ends in "...".
pub fn bounded(text: &str, max: usize) -> String {
    let json_len = |c: char| match c {
        '"' | '\\' => 2,
        c => c.len_utf8(),
    };
    let plain = text.chars().map(|c| if c.is_control() { ' ' } else { c });
    if plain.clone().map(json_len).sum::<usize>() <= max {
        return plain.collect();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in plain {
        if used + json_len(c) > max.saturating_sub(3) {
            break;
        }
        used += json_len(c);
        out.push(c);
    }
    out.push_str("...");
    out
}

fn bound(field: &mut Option<String>, max: usize) {
    if let Some(text) = field.as_mut() {
        *text = bounded(text, max);
    }
}

/// Applies the bounds above to every free-text field of the status, before it is written.
pub fn bound_texts(status: &mut DisruptionPlanStatus) {
    bound(&mut status.message, MAX_MESSAGE);
    for c in &mut status.conditions {
        c.message = bounded(&c.message, MAX_MESSAGE);
    }
    for n in &mut status.nodes {
        bound(&mut n.blocked_by, MAX_NOTE);
        if let Some(r) = n.replacement.as_mut() {
            bound(&mut r.capacity_error, MAX_NOTE);
        }
        if let Some(j) = n.join.as_mut() {
            for line in &mut j.from {
                *line = bounded(line, MAX_FROM);
            }
        }
        for t in n.eviction_targets.iter_mut().flatten() {
            bound(&mut t.last_error, MAX_REFUSAL);
        }
    }
    for e in &mut status.emergency_snapshots {
        e.reason = bounded(&e.reason, MAX_NOTE);
        bound(&mut e.error, MAX_NOTE);
        for u in &mut e.unsaved {
            u.why = bounded(&u.why, MAX_REFUSAL * 4);
        }
    }
    for b in &mut status.backups {
        bound(&mut b.message, MAX_NOTE);
        bound(&mut b.verification_error, MAX_NOTE);
    }
}

/// The largest JSON one eviction target can take: a refused pod with every field at its bound.
fn target_bytes() -> usize {
    let far = jiff::Timestamp::MAX;
    let worst = EvictionTarget {
        namespace: String::new(),
        name: String::new(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
        failures: u32::MAX,
        retry_at: Some(Time(far)),
        last_error: Some("x".repeat(MAX_REFUSAL)),
    };
    json_len(&worst) + 1
}

fn json_len<T: serde::Serialize>(value: &T) -> usize {
    // Serializing plain status types to a Vec cannot fail (string keys, no non-finite floats).
    serde_json::to_vec(value).map_or(0, |v| v.len())
}

/// An upper bound of the status's JSON size over the plan's life, from the status planning decided
/// (nodes with their planned pod counts, one backup record per namespace): every planned pod becomes an
/// eviction target refused with the longest message (a tenth more for pods that arrive before the drain
/// fixes its targets: tolerating or bound with `nodeName`), every backup is tried `max_attempts` times,
/// and every text is at its bound.
pub fn worst_case_bytes(decided: &DisruptionPlanStatus, max_attempts: u32) -> usize {
    let mut base = decided.clone();
    bound_texts(&mut base);
    let per_target = target_bytes();
    let nodes: usize = decided
        .nodes
        .iter()
        .map(|n| {
            let pods = n.pods_total as usize;
            (pods + pods / 10 + 5) * per_target + NODE_GROWTH + EMERGENCY_GROWTH
        })
        .sum();
    let attempts = max_attempts.max(1) as usize;
    let backups: usize = decided
        .backups
        .iter()
        .map(|b| {
            attempts
                * (json_len(b)
                    + BACKUP_GROWTH
                    + POLICY_HOOKS_GROWTH
                    + b.volumes.len() * CSI_SNAPSHOT_GROWTH)
        })
        .sum();
    json_len(&base) + nodes + backups + FIXED_GROWTH
}

/// Why the plan cannot run within `budget` bytes of status, naming the figures and what to do.
pub fn check(
    decided: &DisruptionPlanStatus,
    max_attempts: u32,
    budget: usize,
) -> Result<(), String> {
    let worst = worst_case_bytes(decided, max_attempts);
    if worst <= budget {
        return Ok(());
    }
    let pods: u64 = decided.nodes.iter().map(|n| u64::from(n.pods_total)).sum();
    Err(format!(
        "this plan covers {} node(s) and {pods} pod(s): its status could grow to {} KiB, over the {} KiB \
         a plan may take (the whole object must stay under etcd's request limit, 1.5 MiB by default); \
         split it into plans of fewer nodes (spec.nodes, or a narrower spec.nodeSelector; the policy's \
         spec.maxNodesPerPlan caps selector plans)",
        decided.nodes.len(),
        worst.div_ceil(1024),
        budget / 1024,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::ReleasePoint;
    use crate::api::status::{
        BackupRecord, InstanceRecord, NodeJoinRecord, NodeProgress, ReplacementProgress,
        VerifiedObject,
    };
    use crate::api::volume::{CsiSnapshot, VolumeClass, VolumeMethod, VolumeRecord};
    use crate::api::{DisruptionPlan, DisruptionPlanSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};

    const UID: &str = "0c5e1f9a-7d1b-4c1e-9f3a-2b8d6e4a1c70";

    fn decided(nodes: usize, pods_per_node: u32, namespaces: usize) -> DisruptionPlanStatus {
        DisruptionPlanStatus {
            nodes: (0..nodes)
                .map(|i| NodeProgress {
                    name: format!("ip-10-0-{}-{}.eu-west-1.compute.internal", i / 250, i % 250),
                    uid: Some(UID.into()),
                    instance_id: Some("i-0123456789abcdef0".into()),
                    pods_total: pods_per_node,
                    ..NodeProgress::default()
                })
                .collect(),
            backups: (0..namespaces)
                .map(|i| BackupRecord {
                    name: format!("snapdrain-plan-{i}-1-abcdef"),
                    namespace: format!("tenant-namespace-{i}"),
                    stateful_sets: vec!["postgres".into()],
                    pvcs: (0..3).map(|p| format!("data-postgres-{p}")).collect(),
                    pods: (0..3).map(|p| format!("postgres-{p}")).collect(),
                    volumes: (0..3)
                        .map(|p| VolumeRecord {
                            pvc: format!("data-postgres-{p}"),
                            pv: Some(format!("pvc-{UID}")),
                            class: VolumeClass::Network,
                            source: Some("ebs.csi.aws.com".into()),
                            reason: "an EBS volume".into(),
                            method: VolumeMethod::CsiDataMover,
                            snapshot_class: Some("ebs-csi".into()),
                            release_at: ReleasePoint::Snapshot,
                            snapshot: None,
                            size_bytes: None,
                            expected_seconds: None,
                        })
                        .collect(),
                    attempt: 1,
                    ..BackupRecord::default()
                })
                .collect(),
            ..DisruptionPlanStatus::default()
        }
    }

    /// `decided` as it could be at its largest: every target refused with the longest error (as
    /// written: bounded), every node blocked and replaced, every backup tried `attempts` times with
    /// long messages, conditions and message at their bounds.
    fn grown(mut s: DisruptionPlanStatus, attempts: u32) -> DisruptionPlanStatus {
        let long = "\u{1}\"\\é".repeat(5000);
        let far = Time(jiff::Timestamp::MAX);
        for n in &mut s.nodes {
            let pods = n.pods_total as usize;
            n.eviction_targets = Some(
                (0..pods + pods / 10 + 5)
                    .map(|_| EvictionTarget {
                        uid: UID.into(),
                        failures: u32::MAX,
                        retry_at: Some(far.clone()),
                        last_error: Some(long.clone()),
                        ..EvictionTarget::default()
                    })
                    .collect(),
            );
            n.pods_evicted = u32::MAX;
            n.pods_blocked = u32::MAX;
            n.blocked_by = Some(long.clone());
            n.replacement = Some(ReplacementProgress {
                client_token: "snapdrain-".repeat(7),
                instance_ids: vec!["i-0123456789abcdef0".into(); 4],
                node_name: Some("i-0123456789abcdef0.eu-west-1.compute.internal".into()),
                ready: true,
                attempt: u32::MAX,
                launched_at: Some(far.clone()),
                capacity_errors: u32::MAX,
                capacity_error: Some(long.clone()),
                retry_at: Some(far.clone()),
            });
            n.instance = Some(InstanceRecord {
                image_id: Some("ami-0123456789abcdef0".into()),
                subnet_id: Some("subnet-0123456789abcdef0".into()),
                zone: Some("eu-west-1a".into()),
                instance_profile: Some("x".repeat(128)),
                security_group_ids: vec!["sg-0123456789abcdef0".into(); 5],
                http_tokens_required: Some(true),
                hop_limit: Some(64),
                auto_scaling_group: Some("x".repeat(255)),
            });
            n.join = Some(NodeJoinRecord {
                image_id: Some("ami-0123456789abcdef0".into()),
                instance_profile: Some("x".repeat(128)),
                security_group_ids: vec!["sg-0123456789abcdef0".into(); 5],
                subnet_ids: vec!["subnet-0123456789abcdef0".into(); 16],
                http_tokens_required: Some(true),
                hop_limit: Some(64),
                image_architecture: Some("x86_64_mac".into()),
                instance_types: vec!["m7i-flex.48xlarge".into(); 50],
                launch_template_version: Some(i64::MAX.to_string()),
                from: vec!["x".repeat(1200); 8],
            });
        }
        let mut backups = Vec::new();
        for b in &s.backups {
            for attempt in 1..=attempts {
                let mut volumes = b.volumes.clone();
                for v in &mut volumes {
                    // Object names are DNS subdomains: at most 253 characters.
                    v.snapshot = Some(CsiSnapshot {
                        volume_snapshot: "v".repeat(253),
                        content: "c".repeat(253),
                        handle: "snap-0123456789abcdef0".into(),
                        cut_at: Some(far.clone()),
                        ready: true,
                    });
                }
                backups.push(BackupRecord {
                    attempt,
                    volumes,
                    uid: Some(UID.into()),
                    storage_location: Some("default".into()),
                    phase: Some("PartiallyFailed".into()),
                    verified: true,
                    verified_objects: (0..12)
                        .map(|i| VerifiedObject {
                            key: format!("backups/{}/{}-{i}.json.gz", b.name, b.name),
                            size: u64::MAX,
                        })
                        .collect(),
                    verification_error: Some(long.clone()),
                    message: Some(long.clone()),
                    policy_hooks: {
                        let mut shown = vec![
                            format!("{} (pre 10, post 10)", "h".repeat(63));
                            crate::planning::backup_hooks::SHOWN
                        ];
                        shown.push("and 46 more".into());
                        shown
                    },
                    started_at: Some(far.clone()),
                    completed_at: Some(MicroTime(jiff::Timestamp::MAX)),
                    verified_at: Some(MicroTime(jiff::Timestamp::MAX)),
                    ..b.clone()
                });
            }
        }
        s.backups = backups;
        s.conditions = [
            "Valid",
            "Done",
            "BackupsVerified",
            "Drained",
            "Replaced",
            "Notified",
        ]
        .iter()
        .map(|t| Condition {
            type_: (*t).into(),
            status: "False".into(),
            reason: "SomeLongReasonInCamelCase".into(),
            message: long.clone(),
            last_transition_time: far.clone(),
            observed_generation: Some(i64::MAX),
        })
        .collect();
        s.message = Some(long);
        s.step_timings = ["Pending", "Cordoning", "BackingUp", "Verifying", "Draining"]
            .iter()
            .map(|p| ((*p).to_string(), f64::MAX))
            .collect();
        bound_texts(&mut s);
        s
    }

    #[test]
    fn bounded_texts_fit_their_bound_as_json() {
        for text in [
            "plain",
            "\u{1}\u{2}\"\\",
            "ééééé",
            &"x".repeat(500),
            &"é".repeat(500),
            &"\"".repeat(500),
        ] {
            let cut = bounded(text, 50);
            let as_json = serde_json::to_string(&cut).expect("a string");
            assert!(
                as_json.len() <= 52,
                "{text:?} -> {as_json} ({} bytes)",
                as_json.len()
            );
        }
        // A server's quotes are kept as they are.
        let forbidden = r#"pods "pg-0" is forbidden"#;
        assert_eq!(bounded(forbidden, 50), forbidden);
        assert_eq!(bounded("short", 50), "short");
        assert!(bounded(&"y".repeat(60), 50).ends_with("..."));
    }

    #[test]
    fn the_worst_case_bounds_a_status_grown_to_its_largest() {
        for (nodes, pods, namespaces, attempts) in [
            (1, 0, 0, 1),
            (1, 110, 3, 3),
            (10, 250, 20, 10),
            (40, 110, 40, 3),
        ] {
            let d = decided(nodes, pods, namespaces);
            let estimate = worst_case_bytes(&d, attempts);
            let actual = json_len(&grown(d, attempts));
            assert!(
                actual <= estimate,
                "{nodes} nodes x {pods} pods, {namespaces} namespaces x {attempts} attempts: \
                 {actual} bytes grown > {estimate} estimated"
            );
        }
    }

    /// The largest plan the default budget accepts, grown to its largest and with the largest spec
    /// (1,000 node names of 253 characters), still fits etcd's default limit.
    #[test]
    fn the_largest_plan_the_budget_accepts_fits_in_etcd() {
        let mut largest = None;
        for pods in (0..20_000u32).step_by(100) {
            let d = decided(10, pods / 10, 10);
            if check(&d, 3, DEFAULT_BUDGET).is_err() {
                break;
            }
            largest = Some(d);
        }
        let d = largest.expect("small plans pass");
        let accepted: u32 = d.nodes.iter().map(|n| n.pods_total).sum();
        assert!(
            accepted >= 2_000,
            "the budget takes at least 10 nodes of 200 pods: {accepted}"
        );
        let spec = DisruptionPlanSpec {
            nodes: vec!["n".repeat(253); 1000],
            ..DisruptionPlanSpec::default()
        };
        let mut plan = DisruptionPlan::new("p".repeat(253).as_str(), spec);
        plan.status = Some(grown(d, 3));
        let size = json_len(&plan);
        assert!(
            size < ETCD_DEFAULT_MAX_REQUEST_BYTES,
            "{accepted} pods: the plan at its largest is {size} bytes"
        );
    }

    #[test]
    fn a_plan_over_the_budget_is_refused_with_the_figures_and_the_fix() {
        let d = decided(200, 60, 5);
        let e = check(&d, 3, DEFAULT_BUDGET).expect_err("12,000 pods do not fit");
        assert!(e.contains("200 node(s) and 12000 pod(s)"), "{e}");
        assert!(e.contains("split it"), "{e}");
        assert!(check(&decided(10, 110, 5), 3, DEFAULT_BUDGET).is_ok());
    }
}

//! Deterministic names and tokens, so a restarted controller finds (instead of repeating) what it created.

use sha2::{Digest, Sha256};

/// The plan a name belongs to. The uid makes names unique even when a plan is deleted and re-created under
/// the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRef<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// Longest Kubernetes label value / DNS-1123 label.
pub const MAX_LABEL: usize = 63;

/// Longest Velero Backup name snapdrain makes. Velero puts the name in the `velero.io/backup-name` label of
/// everything it backs up and, when the name is longer than a label value allows (63), shortens the label
/// with a hash (velero `pkg/label/label.go`, `GetValidName`), so the label no longer equals the name and
/// snapdrain could not find its Backups' items by it. S3 keys (`backups/<name>/<name>-podvolumebackups.json.gz`,
/// at most 1,024 bytes with the BSL prefix) leave room for that.
pub const MAX_BACKUP_NAME: usize = MAX_LABEL;

/// EC2 ClientToken limit.
pub const MAX_CLIENT_TOKEN: usize = 64;

/// Velero Backup name for one plan, workload namespace and attempt (1-based):
/// `<plan>-<namespace>-<attempt>-<hash8>`, a DNS-1123 label of at most [`MAX_BACKUP_NAME`] characters.
///
/// The hash (over plan uid, plan name, namespace and attempt) is always appended, not only when the readable
/// part is truncated: joining with `-` is ambiguous (plan `a-b` + namespace `c` vs plan `a` + namespace
/// `b-c`), and the hash keeps those apart. Dots in plan names become dashes.
pub fn backup_name(plan: &PlanRef<'_>, namespace: &str, attempt: u32) -> String {
    let hash = short_hash(&[plan.uid, plan.name, namespace, &attempt.to_string()]);
    let suffix = format!("-{attempt}-{hash}");
    let readable = dns_label_chars(&format!("{}-{}", plan.name, namespace));
    let room = MAX_BACKUP_NAME - suffix.len();
    let readable = truncate_label(&readable, room);
    if readable.is_empty() {
        format!("b{suffix}")
    } else {
        format!("{readable}{suffix}")
    }
}

/// EC2 ClientToken for launching the replacement of one node (by Node uid) in one attempt:
/// `snapdrain-<node uid>-<attempt>`, hashed when the uid is not plain ASCII or too long. At most 64 ASCII
/// characters, so a retried launch with the same token never starts a second instance.
pub fn client_token(node_uid: &str, attempt: u32) -> String {
    launch_token(node_uid, attempt, 0)
}

/// The ClientToken of an attempt's `retry`-th launch after EC2 had no capacity: [`client_token`] for
/// the first launch, `snapdrain-<node uid>-<attempt>-c<retry>` after. A capacity retry needs a token of
/// its own: an instant CreateFleet whose every pool failed has completed (HTTP 200 with its errors), and
/// EC2 answers a retry with the same token with that first result ("Ensuring idempotency in Amazon EC2
/// API requests", EC2 developer guide), however much capacity is back.
pub fn launch_token(node_uid: &str, attempt: u32, retry: u32) -> String {
    let suffix = if retry == 0 {
        format!("-{attempt}")
    } else {
        format!("-{attempt}-c{retry}")
    };
    let plain = format!("snapdrain-{node_uid}{suffix}");
    if plain.len() <= MAX_CLIENT_TOKEN && plain.bytes().all(|b| b.is_ascii_graphic()) {
        return plain;
    }
    let digest = hex(&Sha256::digest(node_uid.as_bytes()));
    let room = MAX_CLIENT_TOKEN - "snapdrain-".len() - suffix.len();
    format!("snapdrain-{}{suffix}", &digest[..room.min(40)])
}

/// A valid label value for `value`: unchanged when it already is one, else its label-safe characters
/// truncated and suffixed with a hash of the original.
pub fn label_value(value: &str) -> String {
    let valid = value.len() <= MAX_LABEL
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && value
            .bytes()
            .next()
            .is_none_or(|b| b.is_ascii_alphanumeric())
        && value
            .bytes()
            .last()
            .is_none_or(|b| b.is_ascii_alphanumeric());
    if valid {
        return value.to_owned();
    }
    let hash = short_hash(&[value]);
    let readable = truncate_label(&dns_label_chars(value), MAX_LABEL - hash.len() - 1);
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// First 8 hex digits of SHA-256 over the parts, each terminated by a NUL (so `["ab","c"]` != `["a","bc"]`).
pub(crate) fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    hex(&h.finalize())[..8].to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Name of the plan a disruption signal makes for a node: `<node>-<hash8>` for the first run, then
/// `<node>-<hash8>-<run>`. The hash covers the node and its uid only, not the signal: every caller that
/// decides at the same moment to make the node's plan (two webhook replicas, the signal watcher and the
/// gate, for different signals) picks the same name, and the second create gets 409 instead of a second
/// plan; a node re-created under the same name gets new plans. A DNS-1123 label.
pub fn signal_plan_name(node: &str, node_uid: &str, run: u32) -> String {
    let hash = short_hash(&[node_uid, node]);
    let suffix = if run > 1 {
        format!("-{hash}-{run}")
    } else {
        format!("-{hash}")
    };
    let readable = truncate_label(&dns_label_chars(node), MAX_LABEL - suffix.len());
    if readable.is_empty() {
        format!("n{suffix}")
    } else {
        format!("{readable}{suffix}")
    }
}

/// Lowercase alphanumerics and dashes; anything else becomes a dash.
pub(crate) fn dns_label_chars(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// At most `max` characters, without leading or trailing dashes. Input is ASCII (see `dns_label_chars`).
pub(crate) fn truncate_label(s: &str, max: usize) -> String {
    let s = s.trim_start_matches('-');
    let cut = &s[..s.len().min(max)];
    cut.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: PlanRef<'static> = PlanRef {
        name: "drain-worker-3",
        uid: "0b6c3d4e-1111-2222-3333-444455556666",
    };

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn backup_name_is_readable_and_stable() {
        let n = backup_name(&PLAN, "db", 1);
        assert!(n.starts_with("drain-worker-3-db-1-"), "{n}");
        assert_eq!(n.len(), "drain-worker-3-db-1-".len() + 8);
        assert_eq!(n, backup_name(&PLAN, "db", 1));
        assert!(is_dns_label(&n));
    }

    #[test]
    fn backup_name_differs_by_plan_namespace_attempt_and_uid() {
        let names = [
            backup_name(&PLAN, "db", 1),
            backup_name(&PLAN, "db", 2),
            backup_name(&PLAN, "cache", 1),
            backup_name(
                &PlanRef {
                    name: "other",
                    uid: PLAN.uid,
                },
                "db",
                1,
            ),
            backup_name(
                &PlanRef {
                    name: PLAN.name,
                    uid: "another-uid",
                },
                "db",
                1,
            ),
            // Same joined text, different split.
            backup_name(
                &PlanRef {
                    name: "a-b",
                    uid: "u",
                },
                "c",
                1,
            ),
            backup_name(
                &PlanRef {
                    name: "a",
                    uid: "u",
                },
                "b-c",
                1,
            ),
        ];
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn long_names_are_truncated_to_a_label() {
        let long_plan = "karpenter.drift.".repeat(15) + "ip-10-0-12-34.eu-west-1.compute.internal";
        let ns = "n".repeat(63);
        let plan = PlanRef {
            name: &long_plan,
            uid: "u",
        };
        let a = backup_name(&plan, &ns, 10);
        let b = backup_name(&plan, &(ns.clone() + "x"), 10);
        assert!(is_dns_label(&a), "{a}");
        assert_eq!(a.len(), MAX_BACKUP_NAME);
        assert_ne!(a, b, "truncated names must still differ");
        assert!(a.starts_with("karpenter-drift-"));
    }

    #[test]
    fn client_token_is_short_ascii_and_deterministic() {
        let uid = "0b6c3d4e-1111-2222-3333-444455556666";
        let t = client_token(uid, 1);
        assert_eq!(t, format!("snapdrain-{uid}-1"));
        assert!(t.len() <= 64);
        assert_ne!(client_token(uid, 1), client_token(uid, 2));
        let weird = client_token(&"é".repeat(80), 4_000_000_000);
        assert!(weird.len() <= 64 && weird.is_ascii(), "{weird}");
        assert_eq!(weird, client_token(&"é".repeat(80), 4_000_000_000));
    }

    #[test]
    fn each_capacity_retry_has_its_own_token_and_the_first_is_the_attempts() {
        let uid = "0b6c3d4e-1111-2222-3333-444455556666";
        assert_eq!(launch_token(uid, 2, 0), client_token(uid, 2));
        assert_eq!(launch_token(uid, 2, 1), format!("snapdrain-{uid}-2-c1"));
        assert_ne!(launch_token(uid, 2, 1), launch_token(uid, 2, 2));
        let long = "é".repeat(80);
        let a = launch_token(&long, u32::MAX, u32::MAX);
        assert!(a.len() <= 64 && a.is_ascii(), "{a}");
        assert_ne!(a, launch_token(&long, u32::MAX, u32::MAX - 1));
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value("my-plan.v2"), "my-plan.v2");
        let long = "p".repeat(80);
        let v = label_value(&long);
        assert_eq!(v.len(), 63);
        assert_ne!(v, label_value(&"p".repeat(81)));
        assert!(
            label_value("-x")
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
        );
    }

    #[test]
    fn signal_plans_are_named_for_their_node_whatever_the_signal() {
        let a = signal_plan_name("ip-10-0-1-7.ec2.internal", "u1", 1);
        assert!(a.starts_with("ip-10-0-1-7-ec2-internal-"), "{a}");
        assert_eq!(a, signal_plan_name("ip-10-0-1-7.ec2.internal", "u1", 1));
        assert_ne!(a, signal_plan_name("ip-10-0-1-7.ec2.internal", "u2", 1));
        assert_eq!(
            signal_plan_name("ip-10-0-1-7.ec2.internal", "u1", 2),
            format!("{a}-2")
        );
        let long = signal_plan_name(&"n".repeat(300), "u", 12);
        assert!(long.len() <= MAX_LABEL, "{long}");
    }
}

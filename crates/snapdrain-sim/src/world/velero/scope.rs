//! What a Backup covers: namespace and label-selector filtering, validation, and which pod volumes get a
//! file-system backup. Pure functions over JSON objects, so they are unit-tested without a store.

use std::collections::BTreeMap;

use serde_json::Value;

/// Velero's message when both selectors are set (`pkg/controller/backup_controller.go`).
pub const BOTH_SELECTORS: &str = "encountered labelSelector as well as orLabelSelectors in backup spec, only one can be specified";

/// Pod annotation opting volumes in to file-system backup.
pub const BACKUP_VOLUMES: &str = "backup.velero.io/backup-volumes";
/// Pod annotation opting volumes out when `defaultVolumesToFsBackup` is on.
pub const BACKUP_VOLUMES_EXCLUDES: &str = "backup.velero.io/backup-volumes-excludes";

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Shell-style glob with `*` and `?`, as Velero's namespace filters accept.
fn glob(pattern: &str, s: &str) -> bool {
    fn rec(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => rec(&p[1..], s) || (!s.is_empty() && rec(p, &s[1..])),
            (Some(b'?'), Some(_)) => rec(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => rec(&p[1..], &s[1..]),
            _ => false,
        }
    }
    rec(pattern.as_bytes(), s.as_bytes())
}

/// Whether `ns` is in scope: included (default `*`) and not excluded.
pub fn namespace_included(spec: &Value, ns: &str) -> bool {
    let mut included = strings(spec.get("includedNamespaces"));
    if included.is_empty() {
        included.push("*".into());
    }
    let excluded = strings(spec.get("excludedNamespaces"));
    included.iter().any(|p| glob(p, ns)) && !excluded.iter().any(|p| glob(p, ns))
}

/// metav1.LabelSelector semantics: every matchLabels pair and every matchExpression must hold.
pub fn label_selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    crate::apiserver::selectors::LabelSelector::metav1_matches(Some(selector), &labels)
}

/// The labels of an object as a map.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an object passes the Backup's `labelSelector` or `orLabelSelectors` (no selector: everything).
pub fn selected(spec: &Value, obj: &Value) -> bool {
    let labels = labels_of(obj);
    if let Some(sel) = spec.get("labelSelector").filter(|v| v.is_object()) {
        return label_selector_matches(sel, &labels);
    }
    match spec.get("orLabelSelectors").and_then(Value::as_array) {
        Some(sels) if !sels.is_empty() => sels.iter().any(|s| label_selector_matches(s, &labels)),
        _ => true,
    }
}

/// Validation errors Velero reports before a backup starts (phase FailedValidation), as
/// prepareBackupRequest words them (velero pkg/controller/backup_controller.go). `bsl` is the resolved
/// storage location when it exists; `server_specified` when the backup named none and the server's default
/// was used.
pub fn validate(
    spec: &Value,
    location_name: &str,
    bsl: Option<&Value>,
    server_specified: bool,
) -> Vec<String> {
    let mut errors = Vec::new();
    let has_label = spec.get("labelSelector").is_some_and(Value::is_object);
    let has_or = spec
        .get("orLabelSelectors")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_label && has_or {
        errors.push(BOTH_SELECTORS.to_string());
    }
    match bsl {
        None => {
            let not_found =
                format!("backupstoragelocations.velero.io \"{location_name}\" not found");
            errors.push(if server_specified {
                format!(
                    "an existing backup storage location was not specified at backup creation time and the server default {location_name} does not exist. Please address this issue (see `velero backup-location -h` for options) and create a new backup. Error: {not_found}"
                )
            } else {
                format!(
                    "an existing backup storage location was not specified at backup creation time and the default {location_name} was not found. Please address this issue (see `velero backup-location -h` for options) and create a new backup. Error: {not_found}"
                )
            });
        }
        Some(bsl) => {
            if bsl.pointer("/spec/accessMode").and_then(Value::as_str) == Some("ReadOnly") {
                errors.push(format!(
                    "backup can't be created because backup storage location {location_name} is currently in read-only mode"
                ));
            }
        }
    }
    errors
}

/// The names of a pod's volumes that get a file-system backup, given the Backup spec.
pub fn fs_backup_volumes(spec: &Value, pod: &Value) -> Vec<String> {
    let annotation = |key: &str| -> Vec<String> {
        pod.pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let volumes: Vec<&Value> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let default_fs = spec
        .get("defaultVolumesToFsBackup")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if default_fs {
        let excluded = annotation(BACKUP_VOLUMES_EXCLUDES);
        // Velero skips volume types that hold no user data (service account tokens, config, host paths).
        volumes
            .iter()
            .filter(|v| v.get("persistentVolumeClaim").is_some() || v.get("emptyDir").is_some())
            .filter_map(|v| v.get("name").and_then(Value::as_str))
            .filter(|n| !excluded.iter().any(|e| e == n))
            .map(str::to_string)
            .collect()
    } else {
        let opted = annotation(BACKUP_VOLUMES);
        volumes
            .iter()
            .filter_map(|v| v.get("name").and_then(Value::as_str))
            .filter(|n| opted.iter().any(|o| o == n))
            .map(str::to_string)
            .collect()
    }
}

/// The PVC claim name of a pod volume, if it is a PVC volume.
pub fn claim_of(pod: &Value, volume: &str) -> Option<String> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(volume))?
        .pointer("/persistentVolumeClaim/claimName")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Bytes in a Kubernetes quantity such as `10Gi`, `500M` or `1073741824` (0 when unparsable).
pub fn quantity_bytes(q: &str) -> u64 {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().unwrap_or(0.0);
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => 0.0,
    };
    (n * mult) as u64
}

/// The size of a PVC: its bound capacity, else its request.
/// Annotation on a claim: how many bytes of its volume change between two backups (a quantity). Kopia
/// stores content by hash in the namespace's repository, so a later upload of the same volume moves only
/// what changed (kopia's deduplication; Velero's file-system backup and data mover both upload through
/// it). Kopia "uses content-addressable storage for snapshots: snapshots are always incremental; data that
/// is already included in previous snapshots is not re-uploaded to the repository" (OKD docs, OADP "About
/// Kopia", https://docs.okd.io/4.17/backup_and_restore/application_backup_and_restore/backing_up_and_restoring/oadp-about-kopia.html).
/// The simulator counts bytes, not chunks: a real change touches whole chunks, so it moves somewhat more.
/// Absent, every byte counts as changed: the first upload's cost, the conservative stand-in.
pub const CHANGED_BYTES: &str = "sim.snapdrain.io/changed-bytes";

/// The claim's [`CHANGED_BYTES`], when set and readable.
pub fn changed_bytes(pvc: &Value) -> Option<u64> {
    pvc.pointer("/metadata/annotations")
        .and_then(|a| a.get(CHANGED_BYTES))
        .and_then(Value::as_str)
        .map(quantity_bytes)
}

pub fn pvc_bytes(pvc: &Value) -> u64 {
    pvc.pointer("/status/capacity/storage")
        .or_else(|| pvc.pointer("/spec/resources/requests/storage"))
        .and_then(Value::as_str)
        .map(quantity_bytes)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn namespaces_default_to_all_and_honour_globs_and_excludes() {
        assert!(namespace_included(&json!({}), "db"));
        let spec = json!({"includedNamespaces": ["d*"], "excludedNamespaces": ["dev"]});
        assert!(namespace_included(&spec, "db"));
        assert!(!namespace_included(&spec, "dev"));
        assert!(!namespace_included(&spec, "web"));
    }

    #[test]
    fn selectors_filter_and_both_is_invalid() {
        let pod = json!({"metadata": {"labels": {"app": "pg", "tier": "db"}}});
        assert!(selected(
            &json!({"labelSelector": {"matchLabels": {"app": "pg"}}}),
            &pod
        ));
        assert!(!selected(
            &json!({"labelSelector": {"matchLabels": {"app": "x"}}}),
            &pod
        ));
        let or = json!({"orLabelSelectors": [{"matchLabels": {"app": "x"}}, {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}]});
        assert!(selected(&or, &pod));
        let both = json!({"labelSelector": {}, "orLabelSelectors": [{}]});
        let errs = validate(&both, "default", Some(&json!({"spec": {}})), false);
        assert_eq!(errs, vec![BOTH_SELECTORS.to_string()]);
        let named = &validate(&json!({}), "nope", None, false)[0];
        assert!(named.contains("the default nope was not found"), "{named}");
        assert!(named.contains("\"nope\" not found"), "{named}");
        let server = &validate(&json!({}), "default", None, true)[0];
        assert!(
            server.contains("the server default default does not exist"),
            "{server}"
        );
    }

    #[test]
    fn fs_backup_volumes_follow_default_and_annotations() {
        let pod = json!({"metadata": {"annotations": {BACKUP_VOLUMES: "data", BACKUP_VOLUMES_EXCLUDES: "scratch"}},
            "spec": {"volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-pg-0"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "token", "projected": {}}]}});
        assert_eq!(fs_backup_volumes(&json!({}), &pod), vec!["data"]);
        assert_eq!(
            fs_backup_volumes(&json!({"defaultVolumesToFsBackup": true}), &pod),
            vec!["data"]
        );
        assert_eq!(claim_of(&pod, "data").as_deref(), Some("data-pg-0"));
        assert_eq!(quantity_bytes("1Gi"), 1 << 30);
        assert_eq!(quantity_bytes("500M"), 500_000_000);
    }
}

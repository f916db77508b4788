//! Server-side apply and managedFields bookkeeping for ordinary writes, following
//! structured-merge-diff's `Updater.Apply` / `Updater.Update` and the apiserver's fieldmanager
//! (conflict messages from `internal/conflict.go`, entry order from `sortEncodedManagedFields`).
//!
//! Simplifications: ownership is per field path (no separate API versions are converted between);
//! objects without managedFields are not given a synthetic `before-first-apply` owner; list order
//! after a merge is "live items first, new items appended"; empty maps left after pruning stay.

use serde_json::{Map, Value, json};

use super::error::{PatchError, StatusCause};
use super::fields::{FieldSet, compare, object_fields, path_string, remove_path};
use super::schema::{ListType, Schema, join};

/// Which endpoint a write came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The object itself.
    Main,
    /// The `/status` subresource.
    Status,
}

/// Who writes, and how.
#[derive(Clone, Copy, Debug)]
pub struct ApplyRequest<'a> {
    /// `?fieldManager=`; required for apply.
    pub manager: &'a str,
    /// `?force=true`: take ownership of conflicting fields instead of failing (apply only).
    pub force: bool,
    pub scope: Scope,
    /// Whether the kind has a status subresource; then the main endpoint ignores `status`, as the
    /// real registry strategies do (reset fields). The status endpoint always ignores everything
    /// but `status`.
    pub status_subresource: bool,
    /// RFC 3339 time stamped on entries whose field set changed.
    pub time: &'a str,
}

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// Server-side apply of `applied` (the decoded body) onto `live` (None when the object does not
/// exist yet). Returns the new object with `metadata.managedFields` updated; the caller sets
/// system fields (uid, resourceVersion, ...), validates and stores it.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    request: &ApplyRequest,
    schema: &Schema,
) -> Result<Value, PatchError> {
    if request.manager.is_empty() {
        return Err(PatchError::Invalid {
            message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: \
                      is required for apply patch"
                .into(),
            detail: String::new(),
            causes: vec![StatusCause {
                reason: "FieldValueRequired",
                message: "Required value: is required for apply patch".into(),
                field: "fieldManager".into(),
            }],
        });
    }
    if !applied.is_object() {
        return Err(PatchError::bad_request(
            "apply patch body must be an object",
        ));
    }
    let api_version = applied
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let config = tracked(&strip_nulls(applied), request);
    let new_set = object_fields(&config, schema)?;

    let live_obj = match live {
        Some(live) => live.clone(),
        None => skeleton(applied),
    };
    let mut entries = read_entries(&live_obj);
    let me = Identity {
        manager: request.manager,
        operation: APPLY,
        api_version,
        subresource: subresource(request),
    };
    let last_set = match entries.iter().position(|e| me.matches(e)) {
        Some(i) => {
            let previous = std::mem::replace(&mut entries[i].fields, new_set.clone());
            entries[i].api_version = api_version.to_string();
            entries[i].touched = previous != new_set;
            previous
        }
        None => {
            entries.push(me.entry(new_set.clone()));
            FieldSet::default()
        }
    };

    let mut merged = merge(live_obj.clone(), &config, schema, "");
    // Fields this applier stopped applying go away unless someone (the applier included, through
    // a parent or child it still applies) owns them.
    for path in last_set.paths() {
        if !new_set.contains(&path) && !entries.iter().any(|e| e.fields.owns_at_or_below(&path)) {
            remove_path(&mut merged, &path);
        }
    }

    let change = compare(
        &tracked(&live_obj, request),
        &tracked(&merged, request),
        schema,
    )?;
    let mut changed = change.added;
    changed.union(&change.modified);
    let mut conflicts: Vec<(usize, FieldSet)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if me.matches(entry) {
            continue;
        }
        let clash = entry.fields.intersection(&changed);
        if !clash.is_empty() {
            conflicts.push((i, clash));
        }
    }
    if !conflicts.is_empty() && !request.force {
        return Err(conflict_error(&entries, &conflicts));
    }
    for (i, clash) in &conflicts {
        entries[*i].fields.difference(clash);
        entries[*i].touched = true;
    }
    for entry in entries.iter_mut().filter(|e| !me.matches(e)) {
        let before = entry.fields.clone();
        entry.fields.difference(&change.removed);
        entry.touched |= before != entry.fields;
    }
    write_entries(&mut merged, entries, request.time);
    Ok(merged)
}

/// Records a non-apply write (create, update, any patch type) by `request.manager` with
/// operation `Update`: fields it added or changed become its own and are taken from every other
/// manager, removed fields leave every set. `old` is None on create. Returns `new` with
/// `metadata.managedFields` updated.
pub fn record_update(
    old: Option<&Value>,
    new: &Value,
    request: &ApplyRequest,
    schema: &Schema,
) -> Result<Value, PatchError> {
    let empty = Value::Object(Map::new());
    let old = old.unwrap_or(&empty);
    let api_version = new
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // The writer's view of ownership is the stored one, not whatever the body carried.
    let mut entries = read_entries(old);
    let change = compare(&tracked(old, request), &tracked(new, request), schema)?;
    let mut changed = change.added;
    changed.union(&change.modified);

    let me = Identity {
        manager: request.manager,
        operation: UPDATE,
        api_version,
        subresource: subresource(request),
    };
    for entry in entries.iter_mut().filter(|e| !me.matches(e)) {
        let before = entry.fields.clone();
        entry.fields.difference(&changed);
        entry.fields.difference(&change.removed);
        entry.touched = before != entry.fields;
    }
    let position = entries.iter().position(|e| me.matches(e));
    let entry = match position {
        Some(i) => &mut entries[i],
        None => {
            entries.push(me.entry(FieldSet::default()));
            let last = entries.len() - 1;
            &mut entries[last]
        }
    };
    let before = entry.fields.clone();
    entry.fields.difference(&change.removed);
    entry.fields.union(&changed);
    entry.touched |= before != entry.fields;

    let mut out = new.clone();
    write_entries(&mut out, entries, request.time);
    Ok(out)
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: String,
    time: Option<String>,
    fields: FieldSet,
    /// Whether the set changed in this write, so `time` moves.
    touched: bool,
}

/// What makes two writes the same manager (`BuildManagerIdentifier`): appliers are one manager
/// across API versions, updaters are not.
struct Identity<'a> {
    manager: &'a str,
    operation: &'static str,
    api_version: &'a str,
    subresource: &'a str,
}

impl Identity<'_> {
    fn matches(&self, e: &Entry) -> bool {
        e.manager == self.manager
            && e.operation == self.operation
            && e.subresource == self.subresource
            && (self.operation == APPLY || e.api_version == self.api_version)
    }

    fn entry(&self, fields: FieldSet) -> Entry {
        Entry {
            manager: self.manager.to_string(),
            operation: self.operation.to_string(),
            api_version: self.api_version.to_string(),
            subresource: self.subresource.to_string(),
            time: None,
            fields,
            touched: true,
        }
    }
}

fn subresource(request: &ApplyRequest) -> &'static str {
    match request.scope {
        Scope::Main => "",
        Scope::Status => "status",
    }
}

/// `"mgr"`, `"mgr" using apps/v1`, `"mgr" with subresource "status" using v1` (`printManager`).
fn describe(e: &Entry) -> String {
    let mut s = format!("{:?}", e.manager);
    if !e.subresource.is_empty() {
        s.push_str(&format!(" with subresource {:?}", e.subresource));
    }
    if e.operation == UPDATE {
        s.push_str(&format!(" using {}", e.api_version));
    }
    s
}

fn conflict_error(entries: &[Entry], conflicts: &[(usize, FieldSet)]) -> PatchError {
    let mut causes = Vec::new();
    let mut by_manager: Vec<(String, Vec<String>)> = Vec::new();
    for (i, clash) in conflicts {
        let who = describe(&entries[*i]);
        let paths: Vec<String> = clash.paths().iter().map(|p| path_string(p)).collect();
        for path in &paths {
            causes.push(StatusCause {
                reason: "FieldManagerConflict",
                message: format!("conflict with {who}"),
                field: path.clone(),
            });
        }
        by_manager.push((who, paths));
    }
    by_manager.sort();
    let message = if causes.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            by_manager[0].0, causes[0].field
        )
    } else {
        let lines: Vec<String> = by_manager
            .iter()
            .flat_map(|(who, paths)| {
                std::iter::once(format!("conflicts with {who}:"))
                    .chain(paths.iter().map(|p| format!("- {p}")))
            })
            .collect();
        format!(
            "Apply failed with {} conflicts: {}",
            causes.len(),
            lines.join("\n")
        )
    };
    PatchError::Conflict { message, causes }
}

fn read_entries(object: &Value) -> Vec<Entry> {
    let Some(Value::Array(raw)) = object.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    let text = |e: &Value, k: &str| {
        e.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    raw.iter()
        .filter(|e| e.get("fieldsType").and_then(Value::as_str) == Some("FieldsV1"))
        .filter_map(|e| {
            // An entry we cannot read is dropped; the real apiserver resets unreadable
            // managedFields as a whole, which is not more useful.
            let fields = FieldSet::from_fields_v1(e.get("fieldsV1")?).ok()?;
            Some(Entry {
                manager: text(e, "manager"),
                operation: text(e, "operation"),
                api_version: text(e, "apiVersion"),
                subresource: text(e, "subresource"),
                time: e.get("time").and_then(Value::as_str).map(str::to_string),
                fields,
                touched: false,
            })
        })
        .collect()
}

fn write_entries(object: &mut Value, mut entries: Vec<Entry>, now: &str) {
    entries.retain(|e| !e.fields.is_empty());
    for e in &mut entries {
        if e.touched || e.time.is_none() {
            e.time = Some(now.to_string());
        }
    }
    // sortEncodedManagedFields: operation, then time, manager, apiVersion, subresource.
    entries.sort_by(|a, b| {
        (
            &a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let encoded: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": e.fields.to_fields_v1(),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        if encoded.is_empty() {
            meta.shift_remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(encoded));
        }
    } else if !encoded.is_empty()
        && let Value::Object(map) = object
    {
        map.insert("metadata".into(), json!({ "managedFields": encoded }));
    }
}

/// The object an apply creates from: identity fields only; the configuration is merged on top.
fn skeleton(applied: &Value) -> Value {
    let mut out = Map::new();
    for key in ["apiVersion", "kind"] {
        if let Some(v) = applied.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    let mut meta = Map::new();
    for key in ["name", "namespace", "generateName"] {
        if let Some(v) = applied.pointer(&format!("/metadata/{key}")) {
            meta.insert(key.into(), v.clone());
        }
    }
    out.insert("metadata".into(), Value::Object(meta));
    Value::Object(out)
}

/// Fields nobody owns: identity and system-maintained metadata.
const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The part of an object whose ownership the write can change.
fn tracked(object: &Value, request: &ApplyRequest) -> Value {
    let Value::Object(map) = object else {
        return Value::Object(Map::new());
    };
    let mut out = map.clone();
    out.shift_remove("apiVersion");
    out.shift_remove("kind");
    if let Some(Value::Object(meta)) = out.get_mut("metadata") {
        for key in UNTRACKED_METADATA {
            meta.shift_remove(*key);
        }
        if meta.is_empty() {
            out.shift_remove("metadata");
        }
    }
    match request.scope {
        Scope::Status => out.retain(|k, _| k == "status"),
        Scope::Main if request.status_subresource => {
            out.shift_remove("status");
        }
        Scope::Main => {}
    }
    Value::Object(out)
}

/// Explicit nulls in an applied configuration set nothing.
fn strip_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Merges an applied configuration into the live object: maps recursively (unless atomic),
/// associative lists by key, sets by value, everything else replaced.
fn merge(live: Value, config: &Value, schema: &Schema, spath: &str) -> Value {
    let meta = schema.field(spath);
    match (live, config) {
        (Value::Object(mut live), Value::Object(config))
            if spath.is_empty() || !meta.atomic_map =>
        {
            for (name, value) in config {
                let child = join(spath, name);
                match live.get_mut(name) {
                    Some(slot) => *slot = merge(std::mem::take(slot), value, schema, &child),
                    None => {
                        live.insert(name.clone(), value.clone());
                    }
                }
            }
            Value::Object(live)
        }
        (Value::Array(mut live), Value::Array(config)) => match &meta.list {
            ListType::Atomic => Value::Array(config.clone()),
            ListType::Set => {
                for v in config {
                    if !live.contains(v) {
                        live.push(v.clone());
                    }
                }
                Value::Array(live)
            }
            ListType::Map(keys) => {
                let key_of = |item: &Value| -> Vec<Option<Value>> {
                    keys.iter().map(|k| item.get(k).cloned()).collect()
                };
                for item in config {
                    let wanted = key_of(item);
                    match live.iter_mut().find(|l| key_of(l) == wanted) {
                        Some(slot) => {
                            *slot = merge(std::mem::take(slot), item, schema, spath);
                        }
                        None => live.push(item.clone()),
                    }
                }
                Value::Array(live)
            }
        },
        // Containers inside list items are reached with the list's own path, so an item merge
        // lands in the object arm above with a non-atomic path.
        (_, config) => config.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2025-01-01T00:00:00Z";
    const T1: &str = "2025-01-01T00:01:00Z";

    fn schema() -> &'static Schema {
        Schema::builtin("apps/v1", "Deployment").unwrap()
    }

    fn req<'a>(manager: &'a str, force: bool, time: &'a str) -> ApplyRequest<'a> {
        ApplyRequest {
            manager,
            force,
            scope: Scope::Main,
            status_subresource: true,
            time,
        }
    }

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "app", "image": image}]}}}})
    }

    fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
        obj["metadata"]["managedFields"]
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager)
    }

    /// Created by `kubectl apply` (client side), i.e. an Update by kubectl-client-side-apply.
    fn created_by_kubectl() -> Value {
        record_update(
            None,
            &deployment(2, "nginx:1.25"),
            &req("kubectl-client-side-apply", false, T0),
            schema(),
        )
        .unwrap()
    }

    #[test]
    fn apply_creates_with_real_managed_fields() {
        let out = apply(
            None,
            &deployment(3, "nginx:1.25"),
            &req("snapdrain", false, T0),
            schema(),
        )
        .unwrap();
        assert_eq!(out["spec"]["replicas"], json!(3));
        assert_eq!(out["metadata"]["name"], "web");
        assert_eq!(
            out["metadata"]["managedFields"],
            json!([{
                "manager": "snapdrain", "operation": "Apply", "apiVersion": "apps/v1",
                "time": T0, "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                            ".": {}, "f:image": {}, "f:name": {}}}}}}}
            }])
        );
    }

    #[test]
    fn update_records_ownership_like_kubectl_create() {
        let live = created_by_kubectl();
        let e = entry(&live, "kubectl-client-side-apply").unwrap();
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["apiVersion"], "apps/v1");
        // Maps that appear in an update are owned themselves (`.`), as upstream records them.
        assert_eq!(
            e["fieldsV1"]["f:metadata"],
            json!({"f:labels": {".": {}, "f:app": {}}})
        );
        assert_eq!(e["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    }

    #[test]
    fn apply_conflicts_with_an_updater_on_a_changed_value() {
        let live = created_by_kubectl();
        let err = apply(
            Some(&live),
            &deployment(3, "nginx:1.25"),
            &req("hpa-like", false, T1),
            schema(),
        )
        .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using \
             apps/v1: .spec.replicas"
        );
        assert_eq!(
            err.causes(),
            vec![StatusCause {
                reason: "FieldManagerConflict",
                message: "conflict with \"kubectl-client-side-apply\" using apps/v1".into(),
                field: ".spec.replicas".into(),
            }]
        );
    }

    #[test]
    fn applying_the_same_value_shares_ownership() {
        let live = created_by_kubectl();
        let out = apply(
            Some(&live),
            &deployment(2, "nginx:1.25"),
            &req("second", false, T1),
            schema(),
        )
        .unwrap();
        for manager in ["kubectl-client-side-apply", "second"] {
            let e = entry(&out, manager).unwrap();
            assert_eq!(
                e["fieldsV1"]["f:spec"]["f:replicas"],
                json!({}),
                "{manager}"
            );
        }
    }

    #[test]
    fn force_moves_ownership() {
        let live = created_by_kubectl();
        let out = apply(
            Some(&live),
            &deployment(3, "nginx:1.25"),
            &req("hpa-like", true, T1),
            schema(),
        )
        .unwrap();
        assert_eq!(out["spec"]["replicas"], json!(3));
        let old = entry(&out, "kubectl-client-side-apply").unwrap();
        assert!(old["fieldsV1"]["f:spec"].get("f:replicas").is_none());
        // Fields it did not lose stay, and its time is the time of the change.
        assert_eq!(old["fieldsV1"]["f:spec"]["f:selector"], json!({}));
        assert_eq!(old["time"], T1);
        let new = entry(&out, "hpa-like").unwrap();
        assert_eq!(new["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
        // Apply entries sort before Update entries.
        assert_eq!(out["metadata"]["managedFields"][0]["operation"], "Apply");
    }

    #[test]
    fn two_appliers_conflict_without_api_version_in_message() {
        let a = apply(
            None,
            &deployment(2, "nginx:1.25"),
            &req("a", false, T0),
            schema(),
        )
        .unwrap();
        let err = apply(
            Some(&a),
            &deployment(5, "nginx:1.27"),
            &req("b", false, T1),
            schema(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.replicas\n\
             - .spec.template.spec.containers[name=\"app\"].image"
        );
        assert_eq!(err.causes().len(), 2);
    }

    #[test]
    fn fields_no_longer_applied_are_removed_unless_shared() {
        let mut first = deployment(2, "nginx:1.25");
        first["spec"]["minReadySeconds"] = json!(5);
        first["metadata"]["labels"]["team"] = json!("shop");
        first["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "envoy:1"}));
        let live = apply(None, &first, &req("a", false, T0), schema()).unwrap();
        // Manager b applies the same `team` label, so it stays when a drops it.
        let shared = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "labels": {"team": "shop"}}});
        let live = apply(Some(&live), &shared, &req("b", false, T0), schema()).unwrap();

        let out = apply(
            Some(&live),
            &deployment(2, "nginx:1.25"),
            &req("a", false, T1),
            schema(),
        )
        .unwrap();
        assert!(out["spec"].get("minReadySeconds").is_none(), "{out}");
        let containers = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0]["name"], "app");
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "team": "shop"})
        );
        let a = entry(&out, "a").unwrap();
        assert!(a["fieldsV1"]["f:spec"].get("f:minReadySeconds").is_none());
        assert!(
            a["fieldsV1"]["f:metadata"]["f:labels"]
                .get("f:team")
                .is_none()
        );
    }

    #[test]
    fn an_update_takes_ownership_from_an_applier() {
        let live = apply(
            None,
            &deployment(2, "nginx:1.25"),
            &req("a", false, T0),
            schema(),
        )
        .unwrap();
        let edited = {
            let mut v = live.clone();
            v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
            v
        };
        let live = record_update(
            Some(&live),
            &edited,
            &req("kubectl-edit", false, T1),
            schema(),
        )
        .unwrap();
        let a = entry(&live, "a").unwrap();
        let item = &a["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"];
        assert!(item.get("f:image").is_none());
        assert_eq!(item["f:name"], json!({}));
        let err = apply(
            Some(&live),
            &deployment(2, "nginx:1.25"),
            &req("a", false, T1),
            schema(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: \
             .spec.template.spec.containers[name=\"app\"].image"
        );
    }

    #[test]
    fn update_that_removes_a_field_clears_its_owners() {
        let live = apply(
            None,
            &deployment(2, "nginx:1.25"),
            &req("a", false, T0),
            schema(),
        )
        .unwrap();
        let mut edited = live.clone();
        edited["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .clear();
        let out = record_update(
            Some(&live),
            &edited,
            &req("kubectl-label", false, T1),
            schema(),
        )
        .unwrap();
        let a = entry(&out, "a").unwrap();
        assert!(a["fieldsV1"]["f:metadata"].is_null(), "{a}");
        // A write that changes nothing leaves no entry for the writer.
        assert!(entry(&out, "kubectl-label").is_none());
    }

    #[test]
    fn status_apply_touches_only_status() {
        let live = created_by_kubectl();
        let body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "web"},
                          "spec": {"replicas": 9},
                          "status": {"conditions": [{"type": "Available", "status": "True"}]}});
        let request = ApplyRequest {
            scope: Scope::Status,
            ..req("snapdrain", false, T1)
        };
        let out = apply(Some(&live), &body, &request, schema()).unwrap();
        assert_eq!(out["spec"]["replicas"], json!(2));
        assert_eq!(out["status"]["conditions"][0]["type"], "Available");
        let e = entry(&out, "snapdrain").unwrap();
        assert_eq!(e["subresource"], "status");
        assert!(e["fieldsV1"].get("f:spec").is_none());
        assert_eq!(
            e["fieldsV1"]["f:status"]["f:conditions"]["k:{\"type\":\"Available\"}"]["f:status"],
            json!({})
        );
        // Another status writer conflicts, and the message names the subresource.
        let mut other = body.clone();
        other["status"]["conditions"][0]["status"] = json!("False");
        let request = ApplyRequest {
            scope: Scope::Status,
            ..req("controller", false, T1)
        };
        let err = apply(Some(&out), &other, &request, schema()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"snapdrain\" with subresource \
             \"status\": .status.conditions[type=\"Available\"].status"
        );
        // The main endpoint ignores status in an applied body.
        let out = apply(Some(&out), &other, &req("main", false, T1), schema()).unwrap_err();
        assert_eq!(out.code(), 409); // spec.replicas 9 conflicts with kubectl
        let mut main_body = other.clone();
        main_body["spec"]["replicas"] = json!(2);
        let live2 = apply(Some(&live), &main_body, &req("main", false, T1), schema()).unwrap();
        assert!(live2.get("status").is_none());
    }

    #[test]
    fn apply_requires_a_field_manager() {
        let err = apply(None, &deployment(1, "x"), &req("", false, T0), schema()).unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(err.causes()[0].field, "fieldManager");
    }

    #[test]
    fn set_lists_are_owned_per_value() {
        let pod_schema = Schema::builtin("v1", "Pod").unwrap();
        let body = |f: &[&str]| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "finalizers": f}})
        };
        let live = apply(None, &body(&["a"]), &req("m1", false, T0), pod_schema).unwrap();
        let live = apply(
            Some(&live),
            &body(&["b"]),
            &req("m2", false, T0),
            pod_schema,
        )
        .unwrap();
        assert_eq!(live["metadata"]["finalizers"], json!(["a", "b"]));
        let e = entry(&live, "m2").unwrap();
        assert_eq!(
            e["fieldsV1"]["f:metadata"]["f:finalizers"],
            json!({"v:\"b\"": {}})
        );
        // m1 stops applying its finalizer: it is removed, m2's stays.
        let empty = json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "p", "labels": {"x": "y"}}});
        let out = apply(Some(&live), &empty, &req("m1", false, T1), pod_schema).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn custom_resource_status_conditions_keyed_by_crd_markers() {
        let crd_schema = Schema::from_openapi(&json!({"type": "object", "properties": {
            "status": {"type": "object", "properties": {
                "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                               "x-kubernetes-list-map-keys": ["type"],
                               "items": {"type": "object"}}}}}}));
        let plan = |cond: &str, status: &str| {
            json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
                   "metadata": {"name": "p"},
                   "status": {"conditions": [{"type": cond, "status": status}]}})
        };
        let status = |m| ApplyRequest {
            scope: Scope::Status,
            ..req(m, false, T0)
        };
        let live = json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
                          "metadata": {"name": "p"}, "spec": {"node": "n1"}});
        let live = apply(
            Some(&live),
            &plan("BackedUp", "True"),
            &status("backup"),
            &crd_schema,
        )
        .unwrap();
        let live = apply(
            Some(&live),
            &plan("Drained", "False"),
            &status("drain"),
            &crd_schema,
        )
        .unwrap();
        // Each manager owns its own condition; neither replaced the other's.
        assert_eq!(live["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(live["spec"], json!({"node": "n1"}));
        // Without the markers the list is atomic: the second writer conflicts over all of it.
        let fresh = json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
                           "metadata": {"name": "p"}});
        let atomic = Schema::generic();
        let live = apply(
            Some(&fresh),
            &plan("BackedUp", "True"),
            &status("backup"),
            atomic,
        )
        .unwrap();
        let err = apply(
            Some(&live),
            &plan("Drained", "False"),
            &status("drain"),
            atomic,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"backup\" with subresource \"status\": \
             .status.conditions"
        );
    }
}

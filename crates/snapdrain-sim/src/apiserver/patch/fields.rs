//! Field sets as kept in `metadata.managedFields` (`fieldsType: FieldsV1`), how an object maps to
//! one, and the comparison of two objects that decides ownership changes. Modelled on
//! sigs.k8s.io/structured-merge-diff (fieldpath.Set, typed.ToFieldSet, typed.Compare).
//!
//! A path element is stored as its FieldsV1 key: `f:<field>`, `k:<json of key fields>` for an
//! associative-list item, `v:<json>` for a set value.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::error::PatchError;
use super::schema::{ListType, Schema, join};

/// A tree of owned field paths. A node is a member when the path itself is owned (`.` in FieldsV1
/// for nodes that also have children).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    /// Decodes a `fieldsV1` object.
    pub fn from_fields_v1(value: &Value) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err(format!("fieldsV1 must be an object, got {value}"));
        };
        let mut set = FieldSet::default();
        for (key, child) in map {
            if key == "." {
                set.member = true;
                continue;
            }
            if !(key.starts_with("f:")
                || key.starts_with("k:")
                || key.starts_with("v:")
                || key.starts_with("i:"))
            {
                return Err(format!("unknown fieldsV1 path element {key:?}"));
            }
            let mut node = FieldSet::from_fields_v1(child)?;
            if node.children.is_empty() {
                // `{}` is a leaf, and a leaf is always a member.
                node.member = true;
            }
            set.children.insert(key.clone(), node);
        }
        Ok(set)
    }

    /// Encodes as a `fieldsV1` object.
    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        if self.member && !self.children.is_empty() {
            map.insert(".".into(), Value::Object(Map::new()));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.to_fields_v1());
        }
        Value::Object(map)
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for element in path {
            node = node.children.entry(element.clone()).or_default();
        }
        node.member = true;
    }

    pub fn contains(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| n.member)
    }

    /// Whether the path or anything below it is owned.
    pub fn owns_at_or_below(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| !n.is_empty())
    }

    fn node(&self, path: &[String]) -> Option<&FieldSet> {
        let mut node = self;
        for element in path {
            node = node.children.get(element)?;
        }
        Some(node)
    }

    pub fn union(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (key, child) in &other.children {
            self.children.entry(key.clone()).or_default().union(child);
        }
    }

    /// Removes every member of `other`.
    pub fn difference(&mut self, other: &FieldSet) {
        if other.member {
            self.member = false;
        }
        for (key, other_child) in &other.children {
            if let Some(child) = self.children.get_mut(key) {
                child.difference(other_child);
                if child.is_empty() {
                    self.children.remove(key);
                }
            }
        }
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            if let Some(other_child) = other.children.get(key) {
                let both = child.intersection(other_child);
                if !both.is_empty() {
                    out.children.insert(key.clone(), both);
                }
            }
        }
        out
    }

    /// Every member path, parents before children.
    pub fn paths(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (key, child) in &self.children {
            prefix.push(key.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }
}

/// A path in the notation of conflict messages: `.spec.replicas`,
/// `.spec.containers[name="app"].image`, `.metadata.finalizers[="x"]`.
pub fn path_string(path: &[String]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(name) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = element.strip_prefix("k:") {
            let fields = match serde_json::from_str::<Map<String, Value>>(key) {
                Ok(map) => map
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                Err(_) => key.to_string(),
            };
            out.push_str(&format!("[{fields}]"));
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(index) = element.strip_prefix("i:") {
            out.push_str(&format!("[{index}]"));
        }
    }
    out
}

pub(crate) fn field_element(name: &str) -> String {
    format!("f:{name}")
}

fn value_element(value: &Value) -> String {
    format!("v:{value}")
}

/// Key-field values left out of an associative-list item that the schema defaults; the only one
/// among the built-in list keys is `protocol` (ports), defaulted to TCP.
fn key_default(field: &str) -> Option<Value> {
    (field == "protocol").then(|| Value::String("TCP".into()))
}

/// The `k:` element of an associative-list item: its key fields, sorted by name.
pub(crate) fn key_element(item: &Value, keys: &[String], path: &str) -> Result<String, PatchError> {
    let Value::Object(fields) = item else {
        return Err(PatchError::bad_request(format!(
            ".{path}: associative list element is not a map: {item}"
        )));
    };
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    let mut key = Map::new();
    for name in sorted {
        let value = fields
            .get(name.as_str())
            .filter(|v| !v.is_null())
            .cloned()
            .or_else(|| key_default(name));
        let Some(value) = value else {
            return Err(PatchError::bad_request(format!(
                ".{path}: associative list with keys has an element that omits key field \
                 {name:?} (and doesn't have default value)"
            )));
        };
        key.insert(name.clone(), value);
    }
    Ok(format!("k:{}", Value::Object(key)))
}

/// Whether a list item is the one a `k:` element names (missing key fields take their default).
fn item_matches_key(item: &Value, key: &Map<String, Value>) -> bool {
    key.iter().all(|(name, wanted)| {
        item.get(name)
            .filter(|v| !v.is_null())
            .cloned()
            .or_else(|| key_default(name))
            .as_ref()
            == Some(wanted)
    })
}

/// The fields an applied configuration sets (`typed.ToFieldSet`): leaves (scalars, atomic lists
/// and maps, empty maps and lists), associative-list items and set values. Maps that merely hold
/// other fields are not members themselves.
pub(crate) fn object_fields(config: &Value, schema: &Schema) -> Result<FieldSet, PatchError> {
    let mut set = FieldSet::default();
    walk(config, schema, "", &mut Vec::new(), &mut set, true, false)?;
    Ok(set)
}

fn walk(
    value: &Value,
    schema: &Schema,
    spath: &str,
    path: &mut Vec<String>,
    set: &mut FieldSet,
    root: bool,
    every_node: bool,
) -> Result<(), PatchError> {
    match value {
        Value::Object(map) if root || !(map.is_empty() || schema.field(spath).atomic_map) => {
            if every_node && !root {
                set.insert(path);
            }
            for (name, child) in map {
                if child.is_null() {
                    continue;
                }
                path.push(field_element(name));
                walk(
                    child,
                    schema,
                    &join(spath, name),
                    path,
                    set,
                    false,
                    every_node,
                )?;
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match &schema.field(spath).list {
            ListType::Atomic => set.insert(path),
            ListType::Set => {
                for item in items {
                    path.push(value_element(item));
                    set.insert(path);
                    path.pop();
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    path.push(key_element(item, keys, spath)?);
                    set.insert(path);
                    walk(item, schema, spath, path, set, true, every_node)?;
                    path.pop();
                }
            }
        },
        _ => set.insert(path),
    }
    Ok(())
}

/// What changed between two objects (`typed.Compare`). Added and removed subtrees list the subtree
/// root and everything below it.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

pub(crate) fn compare(old: &Value, new: &Value, schema: &Schema) -> Result<Comparison, PatchError> {
    let mut c = Comparison::default();
    diff(
        Some(old),
        Some(new),
        schema,
        "",
        &mut Vec::new(),
        &mut c,
        true,
    )?;
    Ok(c)
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn subtree(
    value: &Value,
    schema: &Schema,
    spath: &str,
    path: &mut Vec<String>,
    into: &mut FieldSet,
) -> Result<(), PatchError> {
    // Every node of an appeared subtree is in it, which gives the `.` members upstream records
    // for maps an update creates. Top-level sections (metadata, spec, status) are exempt: they
    // are Go structs that always serialize, so upstream never sees them appear. (Upstream also
    // exempts nested structs such as spec.template; without Go types we cannot, which only
    // adds ownership of parents whose children are owned anyway.)
    let top_level_section = path.len() == 1 && value.is_object();
    walk(value, schema, spath, path, into, top_level_section, true)
}

fn diff(
    old: Option<&Value>,
    new: Option<&Value>,
    schema: &Schema,
    spath: &str,
    path: &mut Vec<String>,
    c: &mut Comparison,
    root: bool,
) -> Result<(), PatchError> {
    let (old, new) = match (present(old), present(new)) {
        (None, None) => return Ok(()),
        (None, Some(n)) => return subtree(n, schema, spath, path, &mut c.added),
        (Some(o), None) => return subtree(o, schema, spath, path, &mut c.removed),
        (Some(o), Some(n)) => (o, n),
    };
    let meta = schema.field(spath);
    match (old, new) {
        (Value::Object(o), Value::Object(n)) if root || !meta.atomic_map => {
            for (name, ov) in o {
                path.push(field_element(name));
                diff(
                    Some(ov),
                    n.get(name),
                    schema,
                    &join(spath, name),
                    path,
                    c,
                    false,
                )?;
                path.pop();
            }
            for (name, nv) in n.iter().filter(|(k, _)| !o.contains_key(*k)) {
                path.push(field_element(name));
                diff(None, Some(nv), schema, &join(spath, name), path, c, false)?;
                path.pop();
            }
        }
        (Value::Array(o), Value::Array(n)) if meta.list == ListType::Set => {
            for v in o.iter().filter(|v| !n.contains(v)) {
                path.push(value_element(v));
                c.removed.insert(path);
                path.pop();
            }
            for v in n.iter().filter(|v| !o.contains(v)) {
                path.push(value_element(v));
                c.added.insert(path);
                path.pop();
            }
        }
        (Value::Array(o), Value::Array(n)) if matches!(meta.list, ListType::Map(_)) => {
            let ListType::Map(keys) = &meta.list else {
                return Ok(()); // unreachable: guarded by the match arm
            };
            let keyed = |items: &[Value]| -> Result<Vec<(String, Value)>, PatchError> {
                items
                    .iter()
                    .map(|i| Ok((key_element(i, keys, spath)?, i.clone())))
                    .collect()
            };
            let (o, n) = (keyed(o)?, keyed(n)?);
            let find = |list: &[(String, Value)], k: &str| {
                list.iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            for (key, ov) in &o {
                path.push(key.clone());
                match find(&n, key) {
                    Some(nv) => diff(Some(ov), Some(&nv), schema, spath, path, c, true)?,
                    None => subtree(ov, schema, spath, path, &mut c.removed)?,
                }
                path.pop();
            }
            for (key, nv) in n.iter().filter(|(k, _)| find(&o, k).is_none()) {
                path.push(key.clone());
                subtree(nv, schema, spath, path, &mut c.added)?;
                path.pop();
            }
        }
        (o, n) => {
            if o != n {
                c.modified.insert(path);
            }
        }
    }
    Ok(())
}

/// Removes the field at `path` from `object`; a path that is already gone is not an error.
pub(crate) fn remove_path(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for element in parents {
        let Some(next) = step(node, element) else {
            return;
        };
        node = next;
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Value::Object(map) = node {
            map.shift_remove(name);
        }
    } else if let Value::Array(items) = node {
        if let Some(key) = last.strip_prefix("k:") {
            if let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) {
                items.retain(|item| !item_matches_key(item, &key));
            }
        } else if let Some(value) = last.strip_prefix("v:")
            && let Ok(value) = serde_json::from_str::<Value>(value)
        {
            items.retain(|item| *item != value);
        }
    }
}

fn step<'a>(node: &'a mut Value, element: &str) -> Option<&'a mut Value> {
    if let Some(name) = element.strip_prefix("f:") {
        return node.get_mut(name);
    }
    let key = element.strip_prefix("k:")?;
    let key: Map<String, Value> = serde_json::from_str(key).ok()?;
    node.as_array_mut()?
        .iter_mut()
        .find(|item| item_matches_key(item, &key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deploy_schema() -> &'static Schema {
        Schema::builtin("apps/v1", "Deployment").unwrap()
    }

    #[test]
    fn object_fields_match_real_fields_v1() {
        let config = json!({
            "metadata": {"labels": {"app": "web"}, "finalizers": ["x"]},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [
                         {"name": "app", "image": "nginx", "ports": [{"containerPort": 80}]}],
                         "volumes": [{"name": "d", "emptyDir": {}}]}}}});
        let set = object_fields(&config, deploy_schema()).unwrap();
        assert_eq!(
            set.to_fields_v1(),
            json!({
                "f:metadata": {"f:finalizers": {"v:\"x\"": {}}, "f:labels": {"f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:spec": {
                    "f:containers": {"k:{\"name\":\"app\"}": {
                        ".": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                            ".": {}, "f:containerPort": {}}}}},
                    "f:volumes": {"k:{\"name\":\"d\"}": {".": {}, "f:emptyDir": {}, "f:name": {}}}
                }}}
            })
        );
        // Round trip through the wire form.
        let back = FieldSet::from_fields_v1(&set.to_fields_v1()).unwrap();
        assert_eq!(back, set);
    }

    #[test]
    fn set_algebra() {
        let p = |s: &[&str]| s.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let mut a = FieldSet::default();
        a.insert(&p(&["f:spec", "f:replicas"]));
        a.insert(&p(&["f:spec", "f:paused"]));
        let mut b = FieldSet::default();
        b.insert(&p(&["f:spec", "f:replicas"]));
        assert_eq!(a.intersection(&b), b);
        a.difference(&b);
        assert!(!a.contains(&p(&["f:spec", "f:replicas"])));
        assert!(a.contains(&p(&["f:spec", "f:paused"])));
        assert!(a.owns_at_or_below(&p(&["f:spec"])));
        a.difference(&a.clone());
        assert!(a.is_empty());
        assert_eq!(a.to_fields_v1(), json!({}));
    }

    #[test]
    fn path_strings_use_the_conflict_notation() {
        let p = |s: &[&str]| s.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        assert_eq!(path_string(&p(&["f:spec", "f:replicas"])), ".spec.replicas");
        assert_eq!(
            path_string(&p(&[
                "f:spec",
                "f:containers",
                "k:{\"name\":\"app\"}",
                "f:image"
            ])),
            ".spec.containers[name=\"app\"].image"
        );
        assert_eq!(
            path_string(&p(&["f:metadata", "f:finalizers", "v:\"x\""])),
            ".metadata.finalizers[=\"x\"]"
        );
    }

    #[test]
    fn compare_reports_added_modified_removed() {
        let old = json!({"spec": {"replicas": 1, "paused": true, "template": {"spec": {
            "containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}}}});
        let new = json!({"spec": {"replicas": 2, "minReadySeconds": 5, "template": {"spec": {
            "containers": [{"name": "a", "image": "2"}, {"name": "c", "image": "1"}]}}}});
        let c = compare(&old, &new, deploy_schema()).unwrap();
        let paths = |s: &FieldSet| s.paths().iter().map(|p| path_string(p)).collect::<Vec<_>>();
        assert_eq!(
            paths(&c.modified),
            [
                ".spec.replicas",
                ".spec.template.spec.containers[name=\"a\"].image"
            ]
        );
        assert!(paths(&c.added).contains(&".spec.minReadySeconds".to_string()));
        assert!(
            paths(&c.added).contains(&".spec.template.spec.containers[name=\"c\"]".to_string())
        );
        assert!(paths(&c.removed).contains(&".spec.paused".to_string()));
        assert!(
            paths(&c.removed)
                .contains(&".spec.template.spec.containers[name=\"b\"].image".to_string())
        );
    }

    #[test]
    fn remove_path_handles_fields_items_and_values() {
        let p = |s: &[&str]| s.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let mut obj = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"containers": [
            {"name": "x", "ports": [{"containerPort": 80}]}, {"name": "y"}]}});
        remove_path(&mut obj, &p(&["f:metadata", "f:finalizers", "v:\"a\""]));
        remove_path(
            &mut obj,
            &p(&["f:spec", "f:containers", "k:{\"name\":\"y\"}"]),
        );
        remove_path(
            &mut obj,
            &p(&[
                "f:spec",
                "f:containers",
                "k:{\"name\":\"x\"}",
                "f:ports",
                "k:{\"containerPort\":80,\"protocol\":\"TCP\"}",
            ]),
        );
        remove_path(&mut obj, &p(&["f:spec", "f:nothing", "f:here"]));
        assert_eq!(
            obj,
            json!({"metadata": {"finalizers": ["b"]}, "spec": {"containers": [
                {"name": "x", "ports": []}]}})
        );
    }

    #[test]
    fn missing_list_key_is_an_error() {
        let config = json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}});
        let err = object_fields(&config, deploy_schema()).unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(
            err.to_string().contains("omits key field \"name\""),
            "{err}"
        );
    }
}

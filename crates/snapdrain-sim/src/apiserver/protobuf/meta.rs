//! apimachinery types shared by every kind: ObjectMeta, Time, LabelSelector, Quantity, IntOrString
//! (`k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`, `pkg/api/resource`, `pkg/util/intstr`).

use std::collections::BTreeMap;

use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::error::ProtobufError;
use super::fields::{Obj, Result};

pub fn object_meta(path: &str, m: ObjectMeta) -> Result<Value> {
    let ObjectMeta {
        name,
        generate_name,
        namespace,
        self_link,
        uid,
        resource_version,
        generation,
        creation_timestamp,
        deletion_timestamp,
        deletion_grace_period_seconds,
        labels,
        annotations,
        owner_references,
        finalizers,
        managed_fields,
    } = m;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.string("generateName", generate_name);
    o.string("namespace", namespace);
    o.string("selfLink", self_link);
    o.string("uid", uid);
    o.string("resourceVersion", resource_version);
    o.int("generation", generation);
    if let Some(t) = time(&o.at("creationTimestamp"), creation_timestamp)? {
        o.set("creationTimestamp", t);
    }
    if let Some(t) = time(&o.at("deletionTimestamp"), deletion_timestamp)? {
        o.set("deletionTimestamp", t);
    }
    o.ptr("deletionGracePeriodSeconds", deletion_grace_period_seconds);
    o.string_map("labels", labels);
    o.string_map("annotations", annotations);
    o.list("ownerReferences", owner_references, owner_reference)?;
    o.strings("finalizers", finalizers);
    o.unmapped_list("managedFields", &managed_fields)?;
    o.done()
}

fn owner_reference(path: &str, r: OwnerReference) -> Result<Value> {
    let OwnerReference {
        api_version,
        kind,
        name,
        uid,
        controller,
        block_owner_deletion,
    } = r;
    let mut o = Obj::new(path);
    o.string("apiVersion", api_version);
    o.string("kind", kind);
    o.string("name", name);
    o.string("uid", uid);
    o.ptr("controller", controller);
    o.ptr("blockOwnerDeletion", block_owner_deletion);
    o.done()
}

/// `metav1.Time` as JSON writes it: RFC 3339 in UTC, whole seconds. Go marshals the zero time as an
/// empty message (`Time.Marshal` in `meta/v1/time_proto.go`), which JSON writes as null: omitted.
pub fn time(path: &str, t: Option<Time>) -> Result<Option<Value>> {
    let Some(seconds) = t.and_then(|t| t.seconds) else {
        return Ok(None);
    };
    let ts = jiff::Timestamp::from_second(seconds)
        .map_err(|e| ProtobufError::invalid(path, format!("time out of range: {e}")))?;
    Ok(Some(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into()))
}

pub fn label_selector(path: &str, s: LabelSelector) -> Result<Value> {
    let LabelSelector {
        match_labels,
        match_expressions,
    } = s;
    let mut o = Obj::new(path);
    o.string_map("matchLabels", match_labels);
    o.list("matchExpressions", match_expressions, requirement)?;
    o.done()
}

fn requirement(path: &str, r: LabelSelectorRequirement) -> Result<Value> {
    let LabelSelectorRequirement {
        key,
        operator,
        values,
    } = r;
    let mut o = Obj::new(path);
    o.string("key", key);
    o.string("operator", operator);
    o.strings("values", values);
    o.done()
}

/// A Quantity is its canonical string in both encodings (`resource/generated.proto`).
pub fn quantities(path: &str, m: BTreeMap<String, Quantity>) -> Result<Value> {
    m.into_iter()
        .map(|(k, q)| {
            q.string
                .map(|s| (k.clone(), Value::String(s)))
                .ok_or_else(|| {
                    ProtobufError::invalid(&format!("{path}.{k}"), "quantity with no value")
                })
        })
        .collect::<Result<serde_json::Map<_, _>>>()
        .map(Value::Object)
}

/// IntOrString as its JSON form: a number for type 0 (Int), a string for type 1 (String)
/// (`util/intstr/intstr.go` `MarshalJSON`).
pub fn int_or_string(path: &str, v: IntOrString) -> Result<Value> {
    match v.r#type.unwrap_or(0) {
        0 => Ok(v.int_val.unwrap_or(0).into()),
        1 => Ok(v.str_val.unwrap_or_default().into()),
        t => Err(ProtobufError::invalid(
            path,
            format!("IntOrString type {t} is neither 0 (int) nor 1 (string)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn meta_maps_names_labels_and_owners_and_omits_the_zero_time() {
        let m = ObjectMeta {
            name: Some("web".into()),
            namespace: Some(String::new()),
            generation: Some(0),
            creation_timestamp: Some(Time::default()),
            labels: [("app".to_string(), "web".to_string())].into(),
            owner_references: vec![OwnerReference {
                api_version: Some("batch/v1".into()),
                kind: Some("CronJob".into()),
                name: Some("nightly".into()),
                uid: Some("u-1".into()),
                controller: Some(true),
                block_owner_deletion: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            object_meta("metadata", m).unwrap(),
            json!({"name": "web", "labels": {"app": "web"}, "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u-1",
                 "controller": true}]})
        );
    }

    #[test]
    fn time_int_or_string_and_quantity_as_json_writes_them() {
        let t = Time {
            seconds: Some(1_764_630_000),
            nanos: Some(5),
        };
        assert_eq!(
            time("t", Some(t)).unwrap(),
            Some(json!("2025-12-01T23:00:00Z"))
        );
        let int = IntOrString {
            r#type: Some(0),
            int_val: Some(8080),
            str_val: Some(String::new()),
        };
        assert_eq!(int_or_string("p", int).unwrap(), json!(8080));
        let s = IntOrString {
            r#type: Some(1),
            int_val: Some(0),
            str_val: Some("25%".into()),
        };
        assert_eq!(int_or_string("p", s).unwrap(), json!("25%"));
        let q = [(
            "cpu".to_string(),
            Quantity {
                string: Some("500m".into()),
            },
        )]
        .into();
        assert_eq!(quantities("r", q).unwrap(), json!({"cpu": "500m"}));
    }

    #[test]
    fn managed_fields_are_refused_by_name() {
        let m = ObjectMeta {
            managed_fields: vec![Default::default()],
            ..Default::default()
        };
        let err = object_meta("metadata", m).unwrap_err();
        assert!(err.to_string().contains("metadata.managedFields"), "{err}");
    }
}

//! Which objects a list or watch request selects: namespace, label selector, field selector.

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::request::Query;
use super::resources::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};

#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub namespace: Option<String>,
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
}

/// Field labels each kind supports besides `metadata.name` and `metadata.namespace`.
pub fn field_labels(def: &ResourceDef) -> &'static [&'static str] {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => &[
            "spec.nodeName",
            "status.phase",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.podIP",
            "spec.restartPolicy",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        _ => &[],
    }
}

impl ListFilter {
    pub fn from_query(
        def: &ResourceDef,
        namespace: Option<String>,
        query: &Query,
    ) -> ApiResult<Self> {
        let labels = query
            .get("labelSelector")
            .map(LabelSelector::parse)
            .transpose()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = query
            .get("fieldSelector")
            .map(|s| FieldSelector::parse(s, field_labels(def)))
            .transpose()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(Self {
            namespace,
            labels,
            fields,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        if let Some(l) = &self.labels
            && !l.matches_object(obj)
        {
            return false;
        }
        if let Some(f) = &self.fields
            && !f.matches(obj)
        {
            return false;
        }
        true
    }
}

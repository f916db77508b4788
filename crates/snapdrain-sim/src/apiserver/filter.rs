//! Which objects a list or watch request selects: namespace, label selector, field selector.

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::request::Query;
use super::resources::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector, field_labels};

#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub namespace: Option<String>,
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
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
            .map(|s| FieldSelector::parse(s, field_labels(&def.plural)))
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

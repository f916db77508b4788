//! Karpenter NodeClaims as the cache keeps them: what the signal watcher, the hold keeper, the drain's
//! release and the gate read (`signals::detect`, `signals::let_go`), and nothing else. A NodeClaim
//! decoded as a `DynamicObject` keeps its labels, annotations, finalizers and owner in `ObjectMeta` and
//! B-tree maps, kilobytes each; 5,000 of them were about 15 MiB, and every look of the signal watcher
//! serialized them all again.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::intern::intern;
use crate::signals::detect::TERMINATION_TIMESTAMP_ANNOTATION;

#[derive(Clone, Debug, Default)]
pub struct CachedNodeClaim {
    name: Arc<str>,
    deletion_timestamp: Option<Time>,
    /// Karpenter's `karpenter.sh/nodeclaim-termination-timestamp`, as written.
    termination_timestamp: Option<Box<str>>,
    /// `status.nodeName`: the Node the claim launched.
    node_name: Option<Arc<str>>,
    /// `status.conditions`' `type` and `status` (the only parts a decision reads), interned.
    conditions: Box<[(Arc<str>, Arc<str>)]>,
}

impl From<DynamicObject> for CachedNodeClaim {
    fn from(o: DynamicObject) -> Self {
        let status = &o.data["status"];
        Self {
            name: Arc::from(o.metadata.name.as_deref().unwrap_or_default()),
            deletion_timestamp: o.metadata.deletion_timestamp,
            termination_timestamp: o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TERMINATION_TIMESTAMP_ANNOTATION))
                .map(|t| t.as_str().into()),
            node_name: status["nodeName"].as_str().map(intern),
            conditions: status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| Some((intern(c["type"].as_str()?), intern(c["status"].as_str()?))))
                .collect(),
        }
    }
}

impl CachedNodeClaim {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Node the claim launched (`status.nodeName`).
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    pub fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// The claim as the JSON the signal decisions read: the same answers as from the whole object.
    pub fn to_value(&self) -> Value {
        let mut metadata = json!({"name": &*self.name});
        if let Some(t) = &self.deletion_timestamp {
            metadata["deletionTimestamp"] = json!(t);
        }
        if let Some(t) = &self.termination_timestamp {
            metadata["annotations"] = json!({TERMINATION_TIMESTAMP_ANNOTATION: &**t});
        }
        let conditions: Vec<Value> = self
            .conditions
            .iter()
            .map(|(t, s)| json!({"type": &**t, "status": &**s}))
            .collect();
        let mut status = json!({"conditions": conditions});
        if let Some(n) = &self.node_name {
            status["nodeName"] = json!(&**n);
        }
        json!({"metadata": metadata, "status": status})
    }
}

/// Cluster-scoped: keyed by name alone.
impl super::store::Stored for CachedNodeClaim {
    fn namespace_name(&self) -> (&str, &str) {
        ("", &self.name)
    }

    fn key(&self) -> (Arc<str>, Arc<str>) {
        (intern(""), self.name.clone())
    }
}

//! StatefulSets as the cache keeps them: the name and `spec.selector`, which is all any decision reads
//! of one (planning's and the backup step's StatefulSet scope, the warm Schedules' selectors). A
//! trimmed `StatefulSet` was about 7 KiB on the heap (its inline pod template and claim templates, and
//! the maps under them): at scale-5k the 3,000 sets were about 20 MiB of the controller's heap
//! (heaptrack over `bench --only soak --scenario scale-5k`).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::intern::intern;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedStatefulSet {
    /// Interned: a namespace's sets share it.
    namespace: Arc<str>,
    name: Arc<str>,
    /// `spec.selector`; `None` for a set without a spec (the API requires one; a stored object has it).
    selector: Option<LabelSelector>,
}

impl From<StatefulSet> for CachedStatefulSet {
    fn from(s: StatefulSet) -> Self {
        Self {
            namespace: intern(s.metadata.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(s.metadata.name.as_deref().unwrap_or_default()),
            selector: s.spec.map(|spec| spec.selector),
        }
    }
}

impl CachedStatefulSet {
    pub fn selector(&self) -> Option<&LabelSelector> {
        self.selector.as_ref()
    }

    /// The set as a `StatefulSet` with the fields kept (planning is written against the API type):
    /// planning gives the same answers as from the whole set.
    pub fn to_stateful_set(&self) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                namespace: Some(self.namespace.to_string()),
                name: Some(self.name.to_string()),
                ..ObjectMeta::default()
            },
            spec: self.selector.as_ref().map(|selector| StatefulSetSpec {
                selector: selector.clone(),
                ..StatefulSetSpec::default()
            }),
            status: None,
        }
    }
}

impl super::store::Stored for CachedStatefulSet {
    fn namespace_name(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }

    fn key(&self) -> (Arc<str>, Arc<str>) {
        (self.namespace.clone(), self.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::cache::Stored;
    use serde_json::json;

    #[test]
    fn the_compact_form_keeps_the_sets_name_and_selector() {
        let full: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "pg", "namespace": "db", "uid": "u", "labels": {"app": "pg"}},
            "spec": {"selector": {"matchLabels": {"app": "pg"},
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]},
                     "serviceName": "pg", "replicas": 3,
                     "template": {"metadata": {"labels": {"app": "pg"}},
                                  "spec": {"containers": [{"name": "pg", "image": "postgres:17"}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                               "spec": {"resources": {"requests": {"storage": "10Gi"}}}}]},
            "status": {"replicas": 3}
        }))
        .expect("a StatefulSet");
        let selector = full.spec.as_ref().map(|s| s.selector.clone());
        let cached = CachedStatefulSet::from(full);
        assert_eq!(cached.namespace_name(), ("db", "pg"));
        assert_eq!(cached.selector(), selector.as_ref());
        let back = cached.to_stateful_set();
        assert_eq!(back.metadata.namespace.as_deref(), Some("db"));
        assert_eq!(back.metadata.name.as_deref(), Some("pg"));
        assert_eq!(back.spec.map(|s| s.selector), selector);

        let without_spec = CachedStatefulSet::from(StatefulSet {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("db".into()),
                ..ObjectMeta::default()
            },
            ..StatefulSet::default()
        });
        assert_eq!(without_spec.selector(), None);
        assert!(without_spec.to_stateful_set().spec.is_none());
    }
}

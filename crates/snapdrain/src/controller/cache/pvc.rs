//! PersistentVolumeClaims as the cache keeps them: the claim's name and the PersistentVolume it is
//! bound to (`spec.volumeName`), which is all planning reads of a claim (`planning::node`: a claim's PV,
//! for its volume's class and the detach wait); the PV itself is read by name when needed. A whole
//! `PersistentVolumeClaim` is about 1 KiB inline plus its label, annotation, request and capacity maps:
//! at scale-5k the 9,000 claims were about 25 MiB of the controller's heap (heaptrack, `bench --only
//! scale`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::intern::intern;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPvc {
    /// Interned: a namespace's claims share it.
    namespace: Arc<str>,
    name: Arc<str>,
    /// `spec.volumeName`: the bound PersistentVolume.
    volume_name: Option<Arc<str>>,
}

impl From<PersistentVolumeClaim> for CachedPvc {
    fn from(c: PersistentVolumeClaim) -> Self {
        Self {
            namespace: intern(c.metadata.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(c.metadata.name.as_deref().unwrap_or_default()),
            volume_name: c
                .spec
                .and_then(|s| s.volume_name)
                .map(|v| Arc::from(v.as_str())),
        }
    }
}

impl CachedPvc {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn volume_name(&self) -> Option<&str> {
        self.volume_name.as_deref()
    }

    /// The claim as a `PersistentVolumeClaim` with the fields kept (planning is written against the API
    /// type): planning gives the same answers as from the whole claim.
    pub fn to_pvc(&self) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some(self.namespace.to_string()),
                name: Some(self.name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: self.volume_name.as_deref().map(str::to_owned),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }
    }
}

impl super::store::Stored for CachedPvc {
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
    fn the_compact_form_keeps_the_claims_name_and_volume() {
        let full: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data-pg-0", "namespace": "db", "uid": "u",
                         "labels": {"app": "pg"}, "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1", "storageClassName": "gp3",
                     "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}}
        }))
        .expect("a claim");
        let cached = CachedPvc::from(full);
        assert_eq!(cached.namespace_name(), ("db", "data-pg-0"));
        assert_eq!(cached.volume_name(), Some("pv-1"));
        let back = cached.to_pvc();
        assert_eq!(back.metadata.namespace.as_deref(), Some("db"));
        assert_eq!(
            back.spec.and_then(|s| s.volume_name).as_deref(),
            Some("pv-1")
        );
        let unbound = CachedPvc::from(PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("db".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        });
        assert_eq!(unbound.volume_name(), None);
    }
}

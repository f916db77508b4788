//! VolumeAttachments as the cache keeps them: what the drain's detach wait and the emergency snapshots
//! read (`controller::step::attachments_left`, `planning::ebs_volumes::attached_ebs_volumes`), and
//! nothing else. A `VolumeAttachment` is 3,600 bytes before any of its strings (its `spec.source` holds a
//! whole inline `PersistentVolumeSpec`): at scale-5k the 9,000 attachments were 30 MiB of the
//! controller's heap (heaptrack, `bench --only scale`).

use std::sync::Arc;

use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::intern::intern;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedVolumeAttachment {
    name: Arc<str>,
    /// `spec.nodeName`, interned (a node's attachments share it).
    node_name: Arc<str>,
    /// `spec.attacher`: the CSI driver, interned.
    attacher: Arc<str>,
    /// `spec.source.persistentVolumeName`.
    persistent_volume: Option<Arc<str>>,
    /// `status.attached`.
    attached: bool,
}

impl From<VolumeAttachment> for CachedVolumeAttachment {
    fn from(v: VolumeAttachment) -> Self {
        Self {
            name: Arc::from(v.metadata.name.as_deref().unwrap_or_default()),
            node_name: intern(&v.spec.node_name),
            attacher: intern(&v.spec.attacher),
            persistent_volume: v
                .spec
                .source
                .persistent_volume_name
                .as_deref()
                .map(Arc::from),
            attached: v.status.is_some_and(|s| s.attached),
        }
    }
}

impl CachedVolumeAttachment {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn attacher(&self) -> &str {
        &self.attacher
    }

    pub fn persistent_volume(&self) -> Option<&str> {
        self.persistent_volume.as_deref()
    }

    pub fn attached(&self) -> bool {
        self.attached
    }

    /// The attachment as a `VolumeAttachment` with the fields kept (for code written against the API
    /// type): the same answers as from the whole object.
    pub fn to_volume_attachment(&self) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                ..ObjectMeta::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: self.attacher.to_string(),
                node_name: self.node_name.to_string(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: self.persistent_volume.as_deref().map(str::to_owned),
                    ..VolumeAttachmentSource::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached: self.attached,
                ..VolumeAttachmentStatus::default()
            }),
        }
    }
}

/// Cluster-scoped: keyed by name alone.
impl super::store::Stored for CachedVolumeAttachment {
    fn namespace_name(&self) -> (&str, &str) {
        ("", &self.name)
    }

    fn key(&self) -> (Arc<str>, Arc<str>) {
        (intern(""), self.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field a decision reads survives the compact form, and a real attachment's other fields
    /// (an inline volume spec, errors, metadata) are what it drops.
    #[test]
    fn the_compact_form_keeps_what_decisions_read() {
        let full: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": "csi-abc", "uid": "u", "resourceVersion": "7",
                         "annotations": {"csi.alpha.kubernetes.io/node-id": "i-0abc"},
                         "finalizers": ["external-attacher/ebs-csi-aws-com"]},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1",
                     "source": {"persistentVolumeName": "pv-1"}},
            "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdaa"}}
        }))
        .expect("a VolumeAttachment");
        let cached = CachedVolumeAttachment::from(full.clone());
        assert_eq!(cached.name(), "csi-abc");
        assert_eq!(cached.node_name(), "n1");
        assert_eq!(cached.attacher(), "ebs.csi.aws.com");
        assert_eq!(cached.persistent_volume(), Some("pv-1"));
        assert!(cached.attached());
        let back = cached.to_volume_attachment();
        assert_eq!(back.spec, full.spec);
        assert_eq!(
            back.status.map(|s| s.attached),
            full.status.map(|s| s.attached)
        );
        // Not attached yet (no status) reads as not attached, as before.
        let pending: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": "csi-def"},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "n1", "source": {}}
        }))
        .expect("a VolumeAttachment");
        let cached = CachedVolumeAttachment::from(pending);
        assert!(!cached.attached() && cached.persistent_volume().is_none());
    }
}

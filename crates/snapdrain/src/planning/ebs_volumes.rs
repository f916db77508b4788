//! Reads what the emergency EBS path needs from the cluster's objects: each protected claim's EC2 volume
//! id and size (its PersistentVolume's CSI `volumeHandle` and `capacity.storage`), and the EBS volumes
//! attached to the node (its VolumeAttachments of the EBS CSI driver), as
//! [`super::ebs_snapshots::ProtectedVolume`]s and volume ids. Pure: the caller fetched the objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use thiserror::Error;

use super::ebs_snapshots::{EBS_CSI_DRIVER, ProtectedVolume};
use crate::api::volume::VolumeRecord;

/// A protected volume whose size cannot be read: the estimate against the deadline needs it.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "PersistentVolume {pv}: capacity.storage {value:?} is not a storage quantity ({why}); give it a Kubernetes quantity such as 500Gi"
)]
pub struct BadCapacity {
    pub pv: String,
    pub value: String,
    pub why: &'static str,
}

/// Bytes of a Kubernetes storage quantity: a non-negative decimal number and an optional binary (`Ki`..
/// `Ei`) or decimal (`k`..`E`) suffix (apimachinery `resource.Quantity`; exponent forms are not used for
/// storage and are refused).
pub fn storage_bytes(q: &str) -> Result<u64, &'static str> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => return Err("unknown suffix"),
    };
    let value: f64 = number.parse().map_err(|_| "not a number")?;
    let bytes = (value * factor).ceil();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("too large");
    }
    Ok(bytes as u64)
}

/// The protected volumes of one namespace's backup record, with their PVs' handles and sizes. A claim
/// whose PV is not among `pvs` (unbound, gone) keeps no handle and size 0: it is not an EBS volume EC2
/// can cut, and the decision names it.
pub fn protected_volumes(
    namespace: &str,
    records: &[VolumeRecord],
    pvs: &BTreeMap<String, PersistentVolume>,
) -> Result<Vec<ProtectedVolume>, BadCapacity> {
    records
        .iter()
        .map(|r| {
            let pv = r.pv.as_ref().and_then(|name| pvs.get(name));
            let spec = pv.and_then(|p| p.spec.as_ref());
            let handle = spec
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.volume_handle.clone());
            let size_bytes = match spec
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
            {
                Some(q) => storage_bytes(&q.0).map_err(|why| BadCapacity {
                    pv: r.pv.clone().unwrap_or_default(),
                    value: q.0.clone(),
                    why,
                })?,
                None => 0,
            };
            Ok(ProtectedVolume {
                claim: format!("{namespace}/{}", r.pvc),
                class: r.class,
                source: r.source.clone(),
                volume_handle: handle,
                size_bytes,
            })
        })
        .collect()
}

/// EC2 volume ids of the EBS CSI volumes attached to `node` now.
pub fn attached_ebs_volumes(
    node: &str,
    attachments: &[VolumeAttachment],
    pvs: &BTreeMap<String, PersistentVolume>,
) -> Vec<String> {
    let mut ids: Vec<String> = attachments
        .iter()
        .filter(|va| {
            va.spec.node_name == node
                && va.spec.attacher == EBS_CSI_DRIVER
                && va.status.as_ref().is_some_and(|s| s.attached)
        })
        .filter_map(|va| va.spec.source.persistent_volume_name.as_ref())
        .filter_map(|pv| pvs.get(pv)?.spec.as_ref()?.csi.as_ref())
        .filter(|csi| csi.driver == EBS_CSI_DRIVER)
        .map(|csi| csi.volume_handle.clone())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::volume::{VolumeClass, VolumeMethod};
    use serde_json::json;

    fn pv(name: &str, driver: &str, handle: &str, size: &str) -> (String, PersistentVolume) {
        let pv = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "csi": {"driver": driver, "volumeHandle": handle}},
        }))
        .expect("a PV");
        (name.to_string(), pv)
    }

    fn va(node: &str, pv: &str, attached: bool) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": format!("csi-{pv}-{node}")},
            "spec": {"attacher": EBS_CSI_DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}},
            "status": {"attached": attached},
        }))
        .expect("a VolumeAttachment")
    }

    fn record(pvc: &str, pv: Option<&str>, class: VolumeClass, source: &str) -> VolumeRecord {
        VolumeRecord {
            pvc: pvc.into(),
            pv: pv.map(str::to_string),
            class,
            source: Some(source.into()),
            reason: String::new(),
            method: VolumeMethod::CsiDataMover,
            snapshot_class: None,
            release_at: crate::api::plan::ReleasePoint::Verified,
            snapshot: None,
            size_bytes: None,
            expected_seconds: None,
        }
    }

    #[test]
    fn storage_quantities_read_as_bytes() {
        assert_eq!(storage_bytes("500Gi"), Ok(500 << 30));
        assert_eq!(storage_bytes("1Ti"), Ok(1 << 40));
        assert_eq!(storage_bytes("10G"), Ok(10_000_000_000));
        assert_eq!(storage_bytes("1.5Ki"), Ok(1536));
        assert_eq!(storage_bytes("42"), Ok(42));
        assert_eq!(storage_bytes("5Qi"), Err("unknown suffix"));
        assert_eq!(storage_bytes("Gi"), Err("not a number"));
        assert_eq!(storage_bytes("1e3"), Err("unknown suffix"));
        assert_eq!(storage_bytes("99999999999Ei"), Err("too large"));
    }

    #[test]
    fn protected_volumes_carry_their_pvs_handle_and_size() {
        let pvs = BTreeMap::from([
            pv("pv-a", EBS_CSI_DRIVER, "vol-0a", "500Gi"),
            pv("pv-l", "topolvm.io", "lv-1", "10Gi"),
        ]);
        let got = protected_volumes(
            "db",
            &[
                record("data-0", Some("pv-a"), VolumeClass::Network, EBS_CSI_DRIVER),
                record(
                    "scratch",
                    Some("pv-l"),
                    VolumeClass::NodeLocal,
                    "topolvm.io",
                ),
                record("pending", None, VolumeClass::Unknown, "unknown"),
            ],
            &pvs,
        )
        .unwrap();
        assert_eq!(got[0].claim, "db/data-0");
        assert_eq!(got[0].volume_handle.as_deref(), Some("vol-0a"));
        assert_eq!(got[0].size_bytes, 500 << 30);
        assert_eq!(got[1].class, VolumeClass::NodeLocal);
        assert_eq!(got[2].volume_handle, None);
        assert_eq!(got[2].size_bytes, 0);
    }

    #[test]
    fn a_pv_with_a_bad_capacity_is_named_with_the_fix() {
        let pvs = BTreeMap::from([pv("pv-a", EBS_CSI_DRIVER, "vol-0a", "lots")]);
        let err = protected_volumes(
            "db",
            &[record(
                "data-0",
                Some("pv-a"),
                VolumeClass::Network,
                EBS_CSI_DRIVER,
            )],
            &pvs,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("pv-a") && text.contains("500Gi"), "{text}");
    }

    #[test]
    fn attached_volumes_are_the_nodes_attached_ebs_ones() {
        let pvs = BTreeMap::from([
            pv("pv-a", EBS_CSI_DRIVER, "vol-0a", "1Gi"),
            pv("pv-b", EBS_CSI_DRIVER, "vol-0b", "1Gi"),
            pv("pv-c", EBS_CSI_DRIVER, "vol-0c", "1Gi"),
            pv("pv-e", "efs.csi.aws.com", "fs-1", "1Gi"),
        ]);
        let vas = [
            va("n1", "pv-a", true),
            va("n1", "pv-b", false),
            va("n2", "pv-c", true),
            va("n1", "pv-e", true),
            va("n1", "pv-gone", true),
        ];
        assert_eq!(attached_ebs_volumes("n1", &vas, &pvs), ["vol-0a"]);
    }
}

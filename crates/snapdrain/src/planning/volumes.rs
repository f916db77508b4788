//! What each protected volume is (network or node-local) and how it is backed up.
//!
//! The class comes from the PersistentVolume alone:
//! - a `local` PV (kubernetes-sigs/sig-storage-local-static-provisioner makes these, pinned to their node by a
//!   required `kubernetes.io/hostname` affinity) and a `hostPath` PV are node-local;
//! - a CSI PV is node-local when its required node affinity pins it to one node: TopoLVM's driver `topolvm.io`
//!   answers CreateVolume with the accessible topology `topology.topolvm.io/node: <node>`
//!   (topolvm/topolvm `constants.go` `TopologyNodeKey`), which the external-provisioner writes into the PV's
//!   required node affinity; OpenEBS LocalPV uses `openebs.io/nodename`, local-path-provisioner and the
//!   local static provisioner `kubernetes.io/hostname`. Any other CSI PV (EBS's `topology.kubernetes.io/zone`
//!   affinity, EFS with none) is reachable from other nodes: network;
//! - the in-tree network volume types (awsElasticBlockStore, nfs, iscsi, ...) are network;
//! - anything else, or a PV that cannot be read, is [`VolumeClass::Unknown`], backed up as node-local.
//!
//! The method: the plan's `backup.method` for every volume, or, under `Auto` (the default), one per volume
//! (see [`choose_method`] and [`settle_methods`]).

use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolume};

use crate::api::plan::BackupMethod;
use crate::api::volume::{VolumeClass, VolumeMethod, VolumeRecord};

/// Label Velero looks for on the VolumeSnapshotClass of a driver (velero `pkg/apis/velero/v1/labels_annotations.go`
/// `VolumeSnapshotClassSelectorLabel`).
pub const VELERO_SNAPSHOT_CLASS_LABEL: &str = "velero.io/csi-volumesnapshot-class";
/// The external-snapshotter's default-class annotation (`VolumeSnapshotClassKubernetesAnnotation` in Velero).
pub const DEFAULT_SNAPSHOT_CLASS_ANNOTATION: &str =
    "snapshot.storage.kubernetes.io/is-default-class";

/// A PV's class, with its source and the reason, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub class: VolumeClass,
    /// The CSI driver or the in-tree volume type.
    pub source: Option<String>,
    pub reason: String,
}

/// Classifies one PersistentVolume (`None`: the claim is unbound or its PV could not be read).
pub fn classify_pv(pv: Option<&PersistentVolume>) -> Classified {
    let Some(spec) = pv.and_then(|p| p.spec.as_ref()) else {
        return Classified {
            class: VolumeClass::Unknown,
            source: None,
            reason:
                "the claim is not bound to a readable PersistentVolume; backed up as node-local"
                    .into(),
        };
    };
    let pinned = pv.and_then(pinned_node);
    if spec.local.is_some() {
        return node_local("local", "a local PersistentVolume", pinned);
    }
    if spec.host_path.is_some() {
        return node_local("hostPath", "a hostPath PersistentVolume", pinned);
    }
    if let Some(csi) = &spec.csi {
        let driver = csi.driver.clone();
        return match pinned {
            Some((key, node)) => Classified {
                class: VolumeClass::NodeLocal,
                source: Some(driver.clone()),
                reason: format!(
                    "CSI driver {driver} pins it to node {node} (required node affinity {key})"
                ),
            },
            None => Classified {
                class: VolumeClass::Network,
                source: Some(driver.clone()),
                reason: format!("CSI driver {driver}, reachable from other nodes"),
            },
        };
    }
    let in_tree = [
        (
            "awsElasticBlockStore",
            spec.aws_elastic_block_store.is_some(),
        ),
        ("nfs", spec.nfs.is_some()),
        ("iscsi", spec.iscsi.is_some()),
        ("rbd", spec.rbd.is_some()),
        ("cephfs", spec.cephfs.is_some()),
        ("glusterfs", spec.glusterfs.is_some()),
        ("azureDisk", spec.azure_disk.is_some()),
        ("azureFile", spec.azure_file.is_some()),
        ("gcePersistentDisk", spec.gce_persistent_disk.is_some()),
        ("fc", spec.fc.is_some()),
        ("cinder", spec.cinder.is_some()),
        ("vsphereVolume", spec.vsphere_volume.is_some()),
    ];
    if let Some((kind, _)) = in_tree.iter().find(|(_, set)| *set) {
        return Classified {
            class: VolumeClass::Network,
            source: Some((*kind).to_owned()),
            reason: format!("in-tree {kind} volume, reachable from other nodes"),
        };
    }
    Classified {
        class: VolumeClass::Unknown,
        source: None,
        reason: "volume type not recognised; backed up as node-local".into(),
    }
}

fn node_local(source: &str, what: &str, pinned: Option<(String, String)>) -> Classified {
    let on = match pinned {
        Some((_, node)) => format!(" on node {node}"),
        None => String::new(),
    };
    Classified {
        class: VolumeClass::NodeLocal,
        source: Some(source.to_owned()),
        reason: format!("{what}: its data is{on} and dies with the node"),
    }
}

/// Whether a node-selector key names one node: `kubernetes.io/hostname`, or a driver's per-node topology key
/// (`topology.topolvm.io/node`, `topology.lvms.io/node`, `openebs.io/nodename`).
fn names_a_node(key: &str) -> bool {
    let last = key.rsplit('/').next().unwrap_or(key);
    let last = last.rsplit('.').next().unwrap_or(last);
    key == "kubernetes.io/hostname"
        || matches!(last, "node" | "nodename" | "hostname" | "node-name")
}

/// The node a term pins to: an `In` with one value on a key that names a node, or on the field `metadata.name`.
fn term_node(term: &NodeSelectorTerm) -> Option<(String, String)> {
    let exprs = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    exprs
        .filter(|e| names_a_node(&e.key))
        .chain(fields.filter(|f| f.key == "metadata.name"))
        .find_map(|e| match (e.operator.as_str(), e.values.as_deref()) {
            ("In", Some([one])) => Some((e.key.clone(), one.clone())),
            _ => None,
        })
}

/// `(key, node)` when every term of the PV's required node affinity pins it to the same single node.
pub fn pinned_node(pv: &PersistentVolume) -> Option<(String, String)> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let mut pins = terms.iter().map(term_node);
    let first = pins.next()??;
    pins.all(|p| p.as_ref().is_some_and(|(_, n)| *n == first.1))
        .then_some(first)
}

/// A VolumeSnapshotClass as far as Velero's choice of class goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotClass {
    pub name: String,
    pub driver: String,
    /// Labelled [`VELERO_SNAPSHOT_CLASS_LABEL`].
    pub velero_label: bool,
    /// Annotated [`DEFAULT_SNAPSHOT_CLASS_ANNOTATION`] `"true"`.
    pub default: bool,
}

/// The VolumeSnapshotClass Velero's CSI support uses for `driver`, as velero `pkg/util/csi/volume_snapshot.go`
/// `GetVolumeSnapshotClassForStorageClass` picks it: the one labelled `velero.io/csi-volumesnapshot-class`,
/// else the one annotated as the default class, else the only one of the driver. None: Velero fails the
/// volume's snapshot ("failed to get VolumeSnapshotClass for provisioner ...").
pub fn snapshot_class_for<'a>(driver: &str, classes: &'a [SnapshotClass]) -> Option<&'a str> {
    let of_driver: Vec<&SnapshotClass> = classes.iter().filter(|c| c.driver == driver).collect();
    of_driver
        .iter()
        .find(|c| c.velero_label)
        .or_else(|| of_driver.iter().find(|c| c.default))
        .or_else(|| (of_driver.len() == 1).then(|| &of_driver[0]))
        .map(|c| c.name.as_str())
}

/// The method for one volume under `method`, with the VolumeSnapshotClass for the CSI methods.
///
/// `Auto`: a network CSI volume whose driver has a VolumeSnapshotClass Velero would use gets a CSI snapshot
/// (moved to the bucket by the data mover when `move_data`); every other volume (node-local, unknown, in-tree,
/// or a driver without a class) gets a file-system backup, which works on any storage.
pub fn choose_method(
    method: BackupMethod,
    volume: &Classified,
    classes: &[SnapshotClass],
    move_data: bool,
) -> (VolumeMethod, Option<String>) {
    let class_of = || {
        volume
            .source
            .as_deref()
            .and_then(|d| snapshot_class_for(d, classes))
            .map(str::to_owned)
    };
    match method {
        BackupMethod::FileSystem => (VolumeMethod::FileSystem, None),
        BackupMethod::CsiDataMover => (VolumeMethod::CsiDataMover, class_of()),
        BackupMethod::Snapshot => (VolumeMethod::CsiSnapshot, class_of()),
        BackupMethod::Auto => match (volume.class, class_of()) {
            (VolumeClass::Network, Some(class)) if move_data => {
                (VolumeMethod::CsiDataMover, Some(class))
            }
            (VolumeClass::Network, Some(class)) => (VolumeMethod::CsiSnapshot, Some(class)),
            _ => (VolumeMethod::FileSystem, None),
        },
    }
}

/// The Velero VolumePolicy condition that selects a volume: its CSI driver, or its in-tree volume type
/// (velero `internal/resourcepolicies/volume_resources.go`: `csi: {driver}`, `volumeTypes`). None when the
/// volume's kind is unknown.
fn policy_condition(v: &VolumeRecord) -> Option<serde_json::Value> {
    let source = v.source.as_deref()?;
    Some(match source {
        "local"
        | "hostPath"
        | "awsElasticBlockStore"
        | "nfs"
        | "iscsi"
        | "rbd"
        | "cephfs"
        | "glusterfs"
        | "azureDisk"
        | "azureFile"
        | "gcePersistentDisk"
        | "fc"
        | "cinder"
        | "vsphereVolume" => serde_json::json!({"volumeTypes": [source]}),
        driver => serde_json::json!({"csi": {"driver": driver}}),
    })
}

/// Makes one namespace's per-volume methods expressible in one Velero Backup: Velero picks a volume's method
/// from the Backup's VolumePolicy by the volume's CSI driver or volume type, so two volumes of one driver
/// (or type) cannot take different methods, and a volume no condition can select would fall to the Backup's
/// defaults. Either case turns the volumes concerned to a file-system backup, which works on any storage;
/// a volume whose kind is unknown turns them all. Pure; run on the merged volumes of a namespace.
pub fn settle_methods(volumes: &mut [VolumeRecord]) {
    let csi = |m: VolumeMethod| m != VolumeMethod::FileSystem;
    let to_fs = |v: &mut VolumeRecord| {
        v.method = VolumeMethod::FileSystem;
        v.snapshot_class = None;
    };
    if !volumes.iter().any(|v| csi(v.method)) {
        return;
    }
    if volumes.iter().any(|v| policy_condition(v).is_none()) {
        volumes.iter_mut().for_each(to_fs);
        return;
    }
    let mixed: Vec<serde_json::Value> = volumes
        .iter()
        .filter_map(policy_condition)
        .filter(|c| {
            let methods: std::collections::BTreeSet<bool> = volumes
                .iter()
                .filter(|v| policy_condition(v).as_ref() == Some(c))
                .map(|v| csi(v.method))
                .collect();
            methods.len() > 1
        })
        .collect();
    for v in volumes.iter_mut() {
        if policy_condition(v).is_some_and(|c| mixed.contains(&c)) {
            to_fs(v);
        }
    }
}

/// Whether a Backup of `volumes` needs a VolumePolicy (some volume takes a CSI method while the plan's
/// method is `Auto`).
pub fn needs_volume_policy(method: BackupMethod, volumes: &[VolumeRecord]) -> bool {
    method == BackupMethod::Auto && volumes.iter().any(|v| v.method != VolumeMethod::FileSystem)
}

/// The Velero resource-policies document for `volumes` (already [`settle_methods`]-ed): one volume policy
/// per driver or volume type, action `snapshot` for the CSI methods and `fs-backup` for the rest, as
/// velero `internal/resourcepolicies/resource_policies.go` reads it (version v1; the first policy whose
/// conditions all match decides). `skip_drivers` come first with action `skip`: the volumes of those CSI
/// drivers that EC2 snapshots of the plan already hold (velero `internal/volumehelper`
/// `ShouldPerformSnapshot` and `ShouldPerformFSBackup` both honour `skip`).
pub fn volume_policy_yaml(volumes: &[VolumeRecord], skip_drivers: &[String]) -> String {
    let mut seen = Vec::new();
    let mut out = String::from("version: v1\nvolumePolicies:\n");
    for driver in skip_drivers {
        let condition = serde_json::json!({"csi": {"driver": driver}});
        out.push_str(&format!(
            "- conditions: {condition}\n  action:\n    type: skip\n"
        ));
        seen.push(condition);
    }
    for v in volumes {
        let Some(condition) = policy_condition(v) else {
            continue;
        };
        if seen.contains(&condition) {
            continue;
        }
        let action = if v.method == VolumeMethod::FileSystem {
            "fs-backup"
        } else {
            "snapshot"
        };
        // JSON is YAML: the condition is written inline.
        out.push_str(&format!(
            "- conditions: {condition}\n  action:\n    type: {action}\n"
        ));
        seen.push(condition);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": spec})).expect("pv")
    }

    fn affinity(key: &str, values: &[&str]) -> serde_json::Value {
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": values}]}]}})
    }

    #[test]
    fn ebs_and_efs_are_network() {
        let ebs = pv(json!({
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
            "nodeAffinity": affinity("topology.kubernetes.io/zone", &["eu-west-1a"]),
        }));
        let c = classify_pv(Some(&ebs));
        assert_eq!(c.class, VolumeClass::Network, "{c:?}");
        assert_eq!(c.source.as_deref(), Some("ebs.csi.aws.com"));
        // The EBS driver's own topology key names a zone, not a node.
        let ebs_topology = pv(json!({
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
            "nodeAffinity": affinity("topology.ebs.csi.aws.com/zone", &["eu-west-1a"]),
        }));
        assert_eq!(classify_pv(Some(&ebs_topology)).class, VolumeClass::Network);
        let efs = pv(json!({"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1::fsap-1"}}));
        assert_eq!(classify_pv(Some(&efs)).class, VolumeClass::Network);
        let in_tree = pv(json!({"awsElasticBlockStore": {"volumeID": "vol-1"}}));
        assert_eq!(classify_pv(Some(&in_tree)).class, VolumeClass::Network);
        let nfs = pv(json!({"nfs": {"server": "10.0.0.1", "path": "/x"}}));
        assert_eq!(classify_pv(Some(&nfs)).class, VolumeClass::Network);
    }

    #[test]
    fn local_hostpath_and_pinned_csi_are_node_local() {
        let local = pv(json!({
            "local": {"path": "/mnt/disks/nvme0"},
            "nodeAffinity": affinity("kubernetes.io/hostname", &["ip-10-0-1-5"]),
        }));
        let c = classify_pv(Some(&local));
        assert_eq!(c.class, VolumeClass::NodeLocal);
        assert_eq!(c.source.as_deref(), Some("local"));
        assert!(c.reason.contains("ip-10-0-1-5"), "{}", c.reason);
        let host = pv(json!({"hostPath": {"path": "/data"}}));
        assert_eq!(classify_pv(Some(&host)).class, VolumeClass::NodeLocal);
        for (driver, key) in [
            ("topolvm.io", "topology.topolvm.io/node"),
            ("topolvm.io", "topology.lvms.io/node"),
            ("local.csi.openebs.io", "openebs.io/nodename"),
            ("rancher.io/local-path", "kubernetes.io/hostname"),
        ] {
            let p = pv(json!({
                "csi": {"driver": driver, "volumeHandle": "h"},
                "nodeAffinity": affinity(key, &["n1"]),
            }));
            let c = classify_pv(Some(&p));
            assert_eq!(c.class, VolumeClass::NodeLocal, "{driver} {key}: {c:?}");
            assert!(
                c.reason.contains("node n1") && c.reason.contains(key),
                "{c:?}"
            );
        }
        // Pinned by the node's name field.
        let by_field = pv(json!({
            "csi": {"driver": "x.csi", "volumeHandle": "h"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
        }));
        assert_eq!(classify_pv(Some(&by_field)).class, VolumeClass::NodeLocal);
    }

    #[test]
    fn csi_reachable_from_several_nodes_is_network() {
        // Two nodes in one term, two terms naming different nodes, NotIn: not pinned to one node.
        let two = pv(json!({
            "csi": {"driver": "x.csi", "volumeHandle": "h"},
            "nodeAffinity": affinity("kubernetes.io/hostname", &["n1", "n2"]),
        }));
        assert_eq!(classify_pv(Some(&two)).class, VolumeClass::Network);
        let terms = pv(json!({
            "csi": {"driver": "x.csi", "volumeHandle": "h"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]},
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}},
        }));
        assert_eq!(classify_pv(Some(&terms)).class, VolumeClass::Network);
        let not_in = pv(json!({
            "csi": {"driver": "x.csi", "volumeHandle": "h"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}},
        }));
        assert_eq!(classify_pv(Some(&not_in)).class, VolumeClass::Network);
        // One term pinned, the other open: some other node can reach it.
        let mixed = pv(json!({
            "csi": {"driver": "x.csi", "volumeHandle": "h"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]},
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}},
        }));
        assert_eq!(classify_pv(Some(&mixed)).class, VolumeClass::Network);
    }

    #[test]
    fn unreadable_or_unknown_is_unknown() {
        assert_eq!(classify_pv(None).class, VolumeClass::Unknown);
        let odd = pv(json!({"flexVolume": {"driver": "vendor/x"}}));
        assert_eq!(classify_pv(Some(&odd)).class, VolumeClass::Unknown);
    }

    fn vsc(name: &str, driver: &str, label: bool, default: bool) -> SnapshotClass {
        SnapshotClass {
            name: name.into(),
            driver: driver.into(),
            velero_label: label,
            default,
        }
    }

    #[test]
    fn snapshot_class_is_picked_as_velero_picks_it() {
        let classes = [
            vsc("ebs-default", "ebs.csi.aws.com", false, true),
            vsc("ebs-velero", "ebs.csi.aws.com", true, false),
            vsc("efs-only", "efs.csi.aws.com", false, false),
            vsc("x-a", "x.csi", false, false),
            vsc("x-b", "x.csi", false, false),
        ];
        assert_eq!(
            snapshot_class_for("ebs.csi.aws.com", &classes),
            Some("ebs-velero")
        );
        assert_eq!(
            snapshot_class_for("ebs.csi.aws.com", &classes[..1]),
            Some("ebs-default")
        );
        assert_eq!(
            snapshot_class_for("efs.csi.aws.com", &classes),
            Some("efs-only")
        );
        // Two unmarked classes: Velero cannot choose.
        assert_eq!(snapshot_class_for("x.csi", &classes), None);
        assert_eq!(snapshot_class_for("topolvm.io", &classes), None);
    }

    #[test]
    fn auto_snapshots_network_volumes_with_a_class_and_copies_the_rest() {
        let classes = [vsc("ebs", "ebs.csi.aws.com", true, false)];
        let network = |driver: &str| Classified {
            class: VolumeClass::Network,
            source: Some(driver.into()),
            reason: String::new(),
        };
        let local = Classified {
            class: VolumeClass::NodeLocal,
            source: Some("local".into()),
            reason: String::new(),
        };
        let topolvm = Classified {
            class: VolumeClass::NodeLocal,
            source: Some("topolvm.io".into()),
            reason: String::new(),
        };
        let ebs = network("ebs.csi.aws.com");
        let auto =
            |v: &Classified, move_data| choose_method(BackupMethod::Auto, v, &classes, move_data);
        assert_eq!(
            auto(&ebs, true),
            (VolumeMethod::CsiDataMover, Some("ebs".into()))
        );
        assert_eq!(
            auto(&ebs, false),
            (VolumeMethod::CsiSnapshot, Some("ebs".into()))
        );
        // No class for the driver, node-local, unknown: file system.
        assert_eq!(
            auto(&network("efs.csi.aws.com"), true).0,
            VolumeMethod::FileSystem
        );
        assert_eq!(auto(&local, true).0, VolumeMethod::FileSystem);
        assert_eq!(auto(&topolvm, true).0, VolumeMethod::FileSystem);
        assert_eq!(auto(&classify_pv(None), true).0, VolumeMethod::FileSystem);
        // A node-local volume whose driver has a class still gets a copy: its snapshot dies with the node.
        let topolvm_classes = [vsc("lvm", "topolvm.io", true, false)];
        assert_eq!(
            choose_method(BackupMethod::Auto, &topolvm, &topolvm_classes, true).0,
            VolumeMethod::FileSystem
        );
        // Explicit methods apply to every volume, as before.
        assert_eq!(
            choose_method(BackupMethod::FileSystem, &ebs, &classes, true),
            (VolumeMethod::FileSystem, None)
        );
        assert_eq!(
            choose_method(BackupMethod::CsiDataMover, &local, &classes, false),
            (VolumeMethod::CsiDataMover, None)
        );
        assert_eq!(
            choose_method(BackupMethod::Snapshot, &ebs, &classes, true),
            (VolumeMethod::CsiSnapshot, Some("ebs".into()))
        );
    }

    fn rec(pvc: &str, source: Option<&str>, method: VolumeMethod) -> VolumeRecord {
        VolumeRecord {
            pvc: pvc.into(),
            pv: None,
            class: VolumeClass::Network,
            source: source.map(str::to_owned),
            reason: String::new(),
            method,
            snapshot_class: (method != VolumeMethod::FileSystem).then(|| "c".to_owned()),
            release_at: crate::api::plan::ReleasePoint::Verified,
            snapshot: None,
            size_bytes: None,
            expected_seconds: None,
        }
    }

    #[test]
    fn one_backup_expresses_the_choice_or_falls_back_to_file_system() {
        // EBS snapshot, local copy: expressible as it is.
        let mut both = vec![
            rec("a", Some("ebs.csi.aws.com"), VolumeMethod::CsiDataMover),
            rec("b", Some("local"), VolumeMethod::FileSystem),
        ];
        let before = both.clone();
        settle_methods(&mut both);
        assert_eq!(both, before);
        assert_eq!(
            volume_policy_yaml(&both, &[]),
            "version: v1\nvolumePolicies:\n\
             - conditions: {\"csi\":{\"driver\":\"ebs.csi.aws.com\"}}\n  action:\n    type: snapshot\n\
             - conditions: {\"volumeTypes\":[\"local\"]}\n  action:\n    type: fs-backup\n"
        );
        assert!(needs_volume_policy(BackupMethod::Auto, &both));
        assert!(!needs_volume_policy(BackupMethod::CsiDataMover, &both));
        // One driver, two methods (a pinned and a reachable volume of one driver): that driver is copied.
        let mut mixed = vec![
            rec("a", Some("x.csi"), VolumeMethod::CsiSnapshot),
            rec("b", Some("x.csi"), VolumeMethod::FileSystem),
            rec("c", Some("ebs.csi.aws.com"), VolumeMethod::CsiSnapshot),
        ];
        settle_methods(&mut mixed);
        assert_eq!(mixed[0].method, VolumeMethod::FileSystem);
        assert_eq!(mixed[0].snapshot_class, None);
        assert_eq!(mixed[2].method, VolumeMethod::CsiSnapshot);
        // A volume of unknown kind: no condition selects it, so everything is copied.
        let mut unknown = vec![
            rec("a", Some("ebs.csi.aws.com"), VolumeMethod::CsiSnapshot),
            rec("b", None, VolumeMethod::FileSystem),
        ];
        settle_methods(&mut unknown);
        assert!(unknown.iter().all(|v| v.method == VolumeMethod::FileSystem));
        assert!(!needs_volume_policy(BackupMethod::Auto, &unknown));
    }
}

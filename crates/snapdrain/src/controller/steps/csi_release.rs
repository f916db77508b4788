//! The release at the CSI snapshot, during BackingUp and Verifying, for plans with
//! `spec.backup.releaseNetworkVolumesAt: Snapshot` ([`crate::planning::csi_release`] says when a snapshot
//! counts as cut and why). Each pass reads the VolumeSnapshots Velero's CSI plugin made for the plan's
//! live Backups (by their `velero.io/backup-name` label) and their contents, records each cut on its
//! volume, and in Release mode releases the holds of the pods whose every claim is cut or verified,
//! loudly (a Warning Event and the `ReleasedAtSnapshot` condition). The eviction gate lets those pods
//! through on the same records, confirmed with Velero's Backup (`webhook::confirm`). Execute mode still
//! drains once the backups are verified: its own drain waits, other drainers pass the gate at the cut.
//!
//! VolumeSnapshots have no watch here: a plan awaiting a cut looks again every [`RECHECK`]. Velero's data
//! mover deletes its snapshot once the data moved, so a cut missed in between leaves the pod to the
//! verified release, the safe side.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::Value;

use crate::api::plan::{PlanMode, ReleasePoint};
use crate::api::status::BackupRecord;
use crate::controller::error::ControllerError;
use crate::controller::step::{Io, Outcome, PlanView};
use crate::planning::csi_release::{
    BACKUP_NAME_LABEL, PodClaims, SeenContent, SeenSnapshot, awaiting_cut, record_cuts, releasable,
};
use crate::planning::inventory::pvc_claims;

/// How often a plan awaiting a cut reads the snapshots again (Velero's own poll is 5 s).
const RECHECK: Duration = Duration::from_secs(1);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn read_error(what: String, source: kube::Error) -> ControllerError {
    ControllerError::Read { what, source }
}

/// The VolumeSnapshots Velero made for `record`'s Backup, with their bound contents.
async fn seen_snapshots(
    io: &Io<'_>,
    record: &BackupRecord,
) -> Result<Vec<SeenSnapshot>, ControllerError> {
    let vs_api: Api<DynamicObject> = Api::namespaced_with(
        io.client.clone(),
        &record.namespace,
        &resource("VolumeSnapshot", "volumesnapshots"),
    );
    let vsc_api: Api<DynamicObject> = Api::all_with(
        io.client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let selector = format!("{BACKUP_NAME_LABEL}={}", record.name);
    let list = vs_api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            read_error(
                format!(
                    "the VolumeSnapshots of Backup {} in namespace {}",
                    record.name, record.namespace
                ),
                e,
            )
        })?;
    let mut out = Vec::new();
    for vs in list.items {
        let bound = text(&vs.data, "/status/boundVolumeSnapshotContentName");
        let content = match bound {
            None => None,
            Some(name) => vsc_api
                .get_opt(&name)
                .await
                .map_err(|e| read_error(format!("VolumeSnapshotContent {name}"), e))?
                .map(|c| SeenContent {
                    name: c.name_any(),
                    bound_to: (
                        text(&c.data, "/spec/volumeSnapshotRef/namespace").unwrap_or_default(),
                        text(&c.data, "/spec/volumeSnapshotRef/name").unwrap_or_default(),
                    ),
                    handle: text(&c.data, "/status/snapshotHandle"),
                    // int64 nanoseconds since the epoch (external-snapshotter's v1 API).
                    creation_time: c
                        .data
                        .pointer("/status/creationTime")
                        .and_then(Value::as_i64)
                        .and_then(|n| jiff::Timestamp::from_nanosecond(i128::from(n)).ok())
                        .map(Time),
                    ready: c
                        .data
                        .pointer("/status/readyToUse")
                        .and_then(Value::as_bool)
                        == Some(true),
                    error: text(&c.data, "/status/error/message"),
                }),
        };
        out.push(SeenSnapshot {
            namespace: vs.namespace().unwrap_or_default(),
            name: vs.name_any(),
            backup: vs.labels().get(BACKUP_NAME_LABEL).cloned(),
            pvc: text(&vs.data, "/spec/source/persistentVolumeClaimName"),
            error: text(&vs.data, "/status/error/message"),
            content,
        });
    }
    Ok(out)
}

/// Records the cuts of the plan's live attempts and releases the pods they save (Release mode). Returns
/// when to look again (None: nothing awaits a cut).
pub async fn advance(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
) -> Result<Option<Duration>, ControllerError> {
    if v.plan.spec.backup.release_network_volumes_at != ReleasePoint::Snapshot {
        return Ok(None);
    }
    let mut wait = None;
    let latest: Vec<usize> = super::backups::latest_records(&out.status.backups)
        .iter()
        .filter_map(|r| super::backups::latest_index(&out.status.backups, &r.namespace))
        .collect();
    for i in latest {
        let record = &out.status.backups[i];
        // Velero has not started it (no uid yet), or it no longer matters.
        let live = record.uid.is_some() && !record.verified && record.abandoned.is_none();
        let wanted = record.volumes.iter().any(|v| {
            v.release_at == ReleasePoint::Snapshot && !v.snapshot.as_ref().is_some_and(|s| s.ready)
        });
        if !live || !wanted {
            continue;
        }
        let seen = seen_snapshots(io, record).await?;
        let record = &mut out.status.backups[i];
        record_cuts(record, &seen);
        if awaiting_cut(record) {
            wait = Some(RECHECK);
        }
    }
    release(v, io, out).await?;
    Ok(wait)
}

async fn release(v: &PlanView<'_>, io: &Io<'_>, out: &mut Outcome) -> Result<(), ControllerError> {
    if v.plan.spec.mode != PlanMode::Release {
        return Ok(());
    }
    let pods: Vec<_> = out
        .status
        .nodes
        .iter()
        .flat_map(|n| super::inventory::pods_on_node(io.caches, &n.name))
        .collect();
    let names: Vec<(String, String)> = pods
        .iter()
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    let claims: Vec<PodClaims<'_>> = pods
        .iter()
        .zip(&names)
        .map(|(p, (ns, name))| PodClaims {
            namespace: ns,
            name,
            claims: pvc_claims(p).collect(),
        })
        .collect();
    let pods: BTreeSet<(String, String)> = releasable(&out.status.backups, &claims);
    let handles: Vec<String> = out
        .status
        .backups
        .iter()
        .flat_map(|b| &b.volumes)
        .filter_map(|v| v.snapshot.as_ref())
        .map(|s| s.handle.clone())
        .collect();
    super::emergency::release_loudly(v, io, out, pods, |names| {
        format!(
            "released {names} at their CSI snapshot(s) {} (releaseNetworkVolumesAt: Snapshot), NOT at a verified copy in the bucket: the data is the volumes' state at the cut, crash-consistent unless a backup hook quiesced the application; the volumes themselves outlive the node; the plan completes once the backup is verified",
            handles.join(", ")
        )
    })
    .await
}

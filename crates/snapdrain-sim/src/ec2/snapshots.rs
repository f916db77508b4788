//! EBS snapshots: `CreateSnapshots` (every volume attached to an instance, at one point in time),
//! `CreateSnapshot` (one volume) and `DescribeSnapshots`, in the shapes of the EC2 API reference and the
//! aws-sdk-ec2 model (`SnapshotInfo` answers CreateSnapshots with `<state>`; `Snapshot` answers
//! CreateSnapshot and DescribeSnapshots with `<status>`).
//!
//! A snapshot is `pending` from its start time until its volume's size has been read at the configured
//! rate ([`super::Ec2SimConfig::snapshot_mib_per_second`]), then `completed` (or `error`, for a volume a
//! test made fail); `progress` is `NN%` of that time. Real EBS speed depends on the blocks written; the
//! simulator's rate is a stand-in.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Shared;
use super::actions::{ApiError, tag_specs, value_matches, write_tags};
use super::params::Params;
use super::state::{self, Snapshot, World};
use super::xml::Xml;
use super::{AttachedVolume, InstanceState, SnapshotRecord, SnapshotState};

/// EC2 API reference, "Error codes": `SnapshotCreationPerVolumeRateExceeded`, "Wait at least 15 seconds
/// between concurrent volume snapshots" (the EBS CSI driver keeps the same 15 s apart, kubernetes-sigs/
/// aws-ebs-csi-driver PR #1659).
pub const PER_VOLUME_INTERVAL: Duration = Duration::from_secs(15);

/// State and whole percent of a snapshot `elapsed` into a copy that takes `total`.
pub(super) fn progress(elapsed: Duration, total: Duration, fails: bool) -> (SnapshotState, u8) {
    if elapsed >= total {
        let end = if fails {
            SnapshotState::Error
        } else {
            SnapshotState::Completed
        };
        return (end, 100);
    }
    let pct = (elapsed.as_secs_f64() / total.as_secs_f64() * 100.0).floor();
    (SnapshotState::Pending, (pct as u8).min(99))
}

/// How long reading `size_gib` takes at `mib_per_second` (0: at once).
pub(super) fn copy_time(size_gib: u64, mib_per_second: f64) -> Duration {
    if mib_per_second <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(size_gib as f64 * 1024.0 / mib_per_second)
}

impl Snapshot {
    pub(super) fn record(&self, now: Instant) -> SnapshotRecord {
        let (state, pct) = progress(now.duration_since(self.started), self.duration, self.fails);
        SnapshotRecord {
            id: self.id.clone(),
            volume_id: self.volume_id.clone(),
            volume_size_gib: self.volume_size_gib,
            start_time: self.start_time,
            state,
            progress: pct,
            tags: self.tags.clone(),
            description: self.description.clone(),
            action: self.action,
        }
    }
}

fn check_instance_id(id: &str) -> Result<(), ApiError> {
    if !id.starts_with("i-") {
        return Err(ApiError::new(
            400,
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{id}\" (expecting \"i-...\")"),
        ));
    }
    Ok(())
}

/// The volumes attached to `instance_id` now: its root volume, those attached in-process and those the
/// cluster's VolumeAttachments name. None when EC2 does not know the instance.
pub(super) fn attached_volumes(shared: &Shared, instance_id: &str) -> Option<Vec<AttachedVolume>> {
    let (state, mut volumes) = {
        let world = shared.world();
        let inst = world.instances.get(instance_id)?;
        let mut v = Vec::new();
        v.extend(world.boot_volumes.get(instance_id).cloned());
        v.extend(world.attached.get(instance_id).cloned().unwrap_or_default());
        (inst.state, v)
    };
    // A terminated instance's volumes are detached and its root volume deleted (DeleteOnTermination):
    // EC2 user guide, "Terminate Amazon EC2 instances", what happens to the instance's volumes.
    if state == InstanceState::Terminated {
        return Some(Vec::new());
    }
    // Outside the world lock: the source reads the cluster's store.
    if let Some(source) = shared.volume_source.get() {
        for v in source(instance_id) {
            if !volumes.iter().any(|o| o.volume_id == v.volume_id) {
                volumes.push(v);
            }
        }
    }
    Some(volumes)
}

/// Refuses a new snapshot of a volume within `interval` (EC2: [`PER_VOLUME_INTERVAL`]) of the last one's
/// start.
fn check_rate(
    world: &World,
    volume_id: &str,
    now: Instant,
    interval: Duration,
) -> Result<(), ApiError> {
    let recent = world
        .snapshots
        .iter()
        .any(|s| s.volume_id == volume_id && now.duration_since(s.started) < interval);
    if recent {
        return Err(ApiError::new(
            400,
            "SnapshotCreationPerVolumeRateExceeded",
            format!(
                "The maximum per volume CreateSnapshot request rate has been exceeded for volume '{volume_id}'. Use an increasing or variable sleep interval between requests."
            ),
        ));
    }
    Ok(())
}

fn start_snapshot(
    shared: &Shared,
    world: &mut World,
    volume: &AttachedVolume,
    tags: BTreeMap<String, String>,
    description: &str,
    action: &'static str,
    (now, wall): (Instant, jiff::Timestamp),
) -> Snapshot {
    let snap = Snapshot {
        id: state::random_id("snap-"),
        volume_id: volume.volume_id.clone(),
        volume_size_gib: volume.size_gib,
        start_time: wall,
        started: now,
        duration: copy_time(volume.size_gib, shared.config.snapshot_mib_per_second),
        fails: world.failing_volumes.contains(&volume.volume_id),
        tags,
        description: description.to_string(),
        action,
    };
    world.snapshots.push(snap.clone());
    snap
}

/// The snapshot's tags: `CopyTagsFromSource=volume` first, then the request's (a request tag wins).
fn snapshot_tags(
    p: &Params,
    volume: &AttachedVolume,
    requested: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut tags = match p.get("CopyTagsFromSource") {
        None => BTreeMap::new(),
        Some("volume") => volume.tags.clone(),
        Some(other) => {
            return Err(ApiError::new(
                400,
                "InvalidParameterValue",
                format!("Value ({other}) for parameter CopyTagsFromSource is invalid (use volume)"),
            ));
        }
    };
    tags.extend(requested.clone());
    Ok(tags)
}

/// CreateSnapshots: `InstanceSpecification.{InstanceId, ExcludeBootVolume, ExcludeDataVolumeId.N}`,
/// `TagSpecification.N` (ResourceType `snapshot`), `CopyTagsFromSource`, `Description`. One call cuts
/// every chosen volume at the same instant (crash-consistent across the instance).
pub(super) fn create_snapshots(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let spec = p.nested("InstanceSpecification");
    let instance_id = spec
        .get("InstanceId")
        .ok_or_else(|| ApiError::missing("InstanceSpecification.InstanceId"))?;
    check_instance_id(instance_id)?;
    let exclude_boot = spec.flag("ExcludeBootVolume");
    let excluded = spec.list("ExcludeDataVolumeId");
    let requested = tag_specs(p, "TagSpecification", "snapshot")?;
    let description = p.get("Description").unwrap_or_default();
    let volumes = attached_volumes(shared, instance_id).ok_or_else(|| {
        ApiError::new(
            400,
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{instance_id}' does not exist"),
        )
    })?;
    let chosen: Vec<&AttachedVolume> = volumes
        .iter()
        .filter(|v| !(excluded.contains(&v.volume_id) || v.boot && exclude_boot))
        .collect();
    let mut world = shared.world();
    let now = Instant::now();
    // One instant for the whole set: the snapshots are crash-consistent across the instance.
    let wall = jiff::Timestamp::now();
    // All or nothing: the set is checked before any snapshot starts.
    for v in &chosen {
        check_rate(
            &world,
            &v.volume_id,
            now,
            shared.config.snapshot_per_volume_interval,
        )?;
    }
    let mut made = Vec::new();
    for v in chosen {
        let tags = snapshot_tags(p, v, &requested)?;
        made.push(start_snapshot(
            shared,
            &mut world,
            v,
            tags,
            description,
            "CreateSnapshots",
            (now, wall),
        ));
    }
    x.open("snapshotSet");
    for s in &made {
        let r = s.record(now);
        x.open("item")
            .leaf("description", &r.description)
            .leaf("encrypted", "false");
        write_tags(&r.tags, x);
        x.leaf("volumeId", &r.volume_id)
            .leaf("state", r.state.name())
            .leaf("volumeSize", r.volume_size_gib.to_string())
            .leaf("startTime", r.start_time.to_string())
            .leaf("progress", format!("{}%", r.progress))
            .leaf("ownerId", &shared.config.account_id)
            .leaf("snapshotId", &r.id)
            .close("item");
    }
    x.close("snapshotSet");
    Ok(())
}

/// CreateSnapshot: `VolumeId`, `TagSpecification.N`, `Description`. The volume must be one EC2 knows:
/// attached to an instance (`InvalidVolume.NotFound` otherwise).
pub(super) fn create_snapshot(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let volume_id = p
        .get("VolumeId")
        .ok_or_else(|| ApiError::missing("VolumeId"))?;
    if !volume_id.starts_with("vol-") {
        return Err(ApiError::new(
            400,
            "InvalidVolumeID.Malformed",
            format!("Invalid id: \"{volume_id}\" (expecting \"vol-...\")"),
        ));
    }
    let requested = tag_specs(p, "TagSpecification", "snapshot")?;
    let description = p.get("Description").unwrap_or_default();
    let ids: Vec<String> = shared.world().instances.keys().cloned().collect();
    let volume = ids
        .iter()
        .filter_map(|id| attached_volumes(shared, id))
        .flatten()
        .find(|v| v.volume_id == volume_id)
        .ok_or_else(|| {
            ApiError::new(
                400,
                "InvalidVolume.NotFound",
                format!("The volume '{volume_id}' does not exist."),
            )
        })?;
    let mut world = shared.world();
    let now = Instant::now();
    check_rate(
        &world,
        volume_id,
        now,
        shared.config.snapshot_per_volume_interval,
    )?;
    let s = start_snapshot(
        shared,
        &mut world,
        &volume,
        requested,
        description,
        "CreateSnapshot",
        (now, jiff::Timestamp::now()),
    );
    write_snapshot_fields(&s.record(now), &shared.config.account_id, x);
    Ok(())
}

/// The members of a `Snapshot` (CreateSnapshot's answer, DescribeSnapshots' items).
fn write_snapshot_fields(r: &SnapshotRecord, owner: &str, x: &mut Xml) {
    x.leaf("snapshotId", &r.id)
        .leaf("volumeId", &r.volume_id)
        .leaf("status", r.state.name());
    if r.state == SnapshotState::Error {
        x.leaf(
            "statusMessage",
            "The snapshot could not be created (failure injected by the simulator)",
        );
    }
    x.leaf("startTime", r.start_time.to_string())
        .leaf("progress", format!("{}%", r.progress))
        .leaf("ownerId", owner)
        .leaf("volumeSize", r.volume_size_gib.to_string())
        .leaf("description", &r.description)
        .leaf("encrypted", "false");
    write_tags(&r.tags, x);
}

/// A DescribeSnapshots filter the simulator understands.
enum Filter {
    Status(Vec<String>),
    VolumeId(Vec<String>),
    SnapshotId(Vec<String>),
    OwnerId(Vec<String>),
    TagKey(Vec<String>),
    Tag(String, Vec<String>),
}

fn parse_filters(p: &Params) -> Result<Vec<Filter>, ApiError> {
    p.structs("Filter")
        .into_iter()
        .map(|f| {
            let name = f.get("Name").ok_or_else(|| ApiError::missing("Filter.Name"))?;
            let values = f.list("Value");
            Ok(match name {
                "status" => Filter::Status(values),
                "volume-id" => Filter::VolumeId(values),
                "snapshot-id" => Filter::SnapshotId(values),
                "owner-id" => Filter::OwnerId(values),
                "tag-key" => Filter::TagKey(values),
                n if n.starts_with("tag:") => Filter::Tag(n["tag:".len()..].to_string(), values),
                other => {
                    return Err(ApiError::new(
                        400,
                        "InvalidParameterValue",
                        format!("The filter '{other}' is invalid (the simulator supports status, volume-id, snapshot-id, owner-id, tag-key, tag:<key>)"),
                    ));
                }
            })
        })
        .collect()
}

fn filter_matches(f: &Filter, r: &SnapshotRecord, owner: &str) -> bool {
    match f {
        Filter::Status(v) => value_matches(v, r.state.name()),
        Filter::VolumeId(v) => value_matches(v, &r.volume_id),
        Filter::SnapshotId(v) => value_matches(v, &r.id),
        Filter::OwnerId(v) => value_matches(v, owner),
        Filter::TagKey(v) => r.tags.keys().any(|k| value_matches(v, k)),
        Filter::Tag(key, v) => r.tags.get(key).is_some_and(|val| value_matches(v, val)),
    }
}

/// DescribeSnapshots: `SnapshotId.N` (an unknown one is `InvalidSnapshot.NotFound`), `Owner.N` (`self`
/// or the account id: every simulated snapshot is the account's; `amazon` and other owners have none
/// here), `Filter.N`.
pub(super) fn describe_snapshots(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let ids = p.list("SnapshotId");
    let owners = p.list("Owner");
    let filters = parse_filters(p)?;
    let account = &shared.config.account_id;
    let world = shared.world();
    let now = Instant::now();
    let unknown: Vec<&str> = ids
        .iter()
        .filter(|id| !world.snapshots.iter().any(|s| &s.id == *id))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::new(
            400,
            "InvalidSnapshot.NotFound",
            format!("The snapshot '{}' does not exist.", unknown.join(", ")),
        ));
    }
    let own = owners.is_empty() || owners.iter().any(|o| o == "self" || o == account);
    x.open("snapshotSet");
    if own {
        for s in &world.snapshots {
            let r = s.record(now);
            if !ids.is_empty() && !ids.contains(&r.id) {
                continue;
            }
            if !filters.iter().all(|f| filter_matches(f, &r, account)) {
                continue;
            }
            x.open("item");
            write_snapshot_fields(&r, account, x);
            x.close("item");
        }
    }
    x.close("snapshotSet");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_runs_from_pending_to_completed_or_error() {
        let total = Duration::from_secs(10);
        assert_eq!(
            progress(Duration::ZERO, total, false),
            (SnapshotState::Pending, 0)
        );
        assert_eq!(
            progress(Duration::from_millis(4_999), total, false),
            (SnapshotState::Pending, 49)
        );
        assert_eq!(
            progress(Duration::from_secs(10), total, false),
            (SnapshotState::Completed, 100)
        );
        assert_eq!(
            progress(Duration::from_secs(11), total, true),
            (SnapshotState::Error, 100)
        );
        assert_eq!(
            progress(Duration::ZERO, Duration::ZERO, false),
            (SnapshotState::Completed, 100),
            "no copy time: completed at once"
        );
    }

    #[test]
    fn copy_time_follows_size_and_rate() {
        assert_eq!(copy_time(500, 0.0), Duration::ZERO);
        assert_eq!(copy_time(1, 1024.0), Duration::from_secs(1));
        assert_eq!(copy_time(500, 102_400.0), Duration::from_secs(5));
    }
}

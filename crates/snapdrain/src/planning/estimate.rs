//! What a plan expects its backups to take, per volume: its bytes (the PV's capacity) at Velero's copy rate
//! (the controller's `--velero-mib-per-second`, measured by the operator). A first backup of a volume moves
//! all of it; a later one moves only what changed (kopia stores content by hash), which nothing in the
//! cluster says in advance, so the figure is an upper bound. Under a deadline, the volumes that cannot be
//! protected in time are named when the plan is made, not after the deadline. Pure.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;

use super::ebs_volumes::storage_bytes;
use crate::api::plan::ReleasePoint;
use crate::api::volume::{VolumeClass, VolumeRecord};

/// Velero's copy rate when the operator measured none (`--velero-mib-per-second`'s default): a
/// conservative figure for kopia through the node-agent on general-purpose instances.
pub const DEFAULT_MIB_PER_SECOND: f64 = 100.0;
/// Velero's fixed cost per Backup when none is configured (queue, tarball, upload).
pub const DEFAULT_OVERHEAD: Duration = Duration::from_secs(5);

/// Velero's copy rate and fixed cost per Backup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub mib_per_second: f64,
    pub overhead: Duration,
}

/// Time to copy `bytes` at `mib_per_second` (zero when the rate is unknown): the one conversion of
/// bytes and Velero's rate into time, for the status's estimates and the emergency decision alike.
pub fn copy_time(bytes: u64, mib_per_second: f64) -> Duration {
    if mib_per_second <= 0.0 {
        return Duration::ZERO;
    }
    // A rate so small the time overflows is "longer than anything": never a panic.
    Duration::try_from_secs_f64(bytes as f64 / (mib_per_second * 1024.0 * 1024.0))
        .unwrap_or(Duration::MAX)
}

/// Seconds to copy `bytes` at `rate` (rounded up; 0 when the rate is unknown).
pub fn copy_seconds(bytes: u64, rate: Rate) -> u64 {
    // `as` saturates: Duration::MAX's seconds stay u64::MAX.
    copy_time(bytes, rate.mib_per_second).as_secs_f64().ceil() as u64
}

/// Fills each volume's size (its PV's `capacity.storage`) and expected copy time. A volume whose PV is
/// not among `pvs` or has no readable capacity keeps neither.
pub fn annotate<'a>(
    volumes: impl IntoIterator<Item = &'a mut VolumeRecord>,
    pvs: &[PersistentVolume],
    rate: Rate,
) {
    for v in volumes {
        let size = v.pv.as_deref().and_then(|name| {
            let pv = pvs
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))?;
            let q = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
            storage_bytes(&q.0).ok()
        });
        v.size_bytes = size;
        // No rate, no estimate (a world or a controller told nothing about Velero's speed).
        v.expected_seconds = size
            .filter(|_| rate.mib_per_second > 0.0)
            .map(|b| copy_seconds(b, rate));
    }
}

/// A volume that will not be protected before the deadline, with why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Late {
    /// `namespace/claim`.
    pub claim: String,
    pub message: String,
}

fn human(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s.div_ceil(60)),
        s => format!("{:.1}h", s as f64 / 3600.0),
    }
}

/// The volumes of `backups` (namespace → its volumes, copied one after another within a Backup, and the
/// Backups one after another in Velero's queue, the worst case) whose copy would end after `time_left`
/// and that no snapshot saves first: a network volume released at its CSI snapshot is cut at the start of
/// its Backup, and an EBS volume may be cut by EC2 at once when `ebs_emergency` (the plan allows emergency
/// snapshots); those are left out of the count. A volume of unknown size (or with no rate) is named too:
/// whether it fits cannot be told.
pub fn late_volumes(
    backups: &[(String, Vec<VolumeRecord>)],
    rate: Rate,
    time_left: Duration,
    ebs_emergency: bool,
) -> Vec<Late> {
    let mut out = Vec::new();
    let mut elapsed = 0u64;
    let left = time_left.as_secs();
    for (ns, volumes) in backups {
        elapsed += rate.overhead.as_secs();
        for v in volumes {
            let saved_by_snapshot = v.class == VolumeClass::Network
                && (v.release_at == ReleasePoint::Snapshot
                    || (ebs_emergency
                        && v.source.as_deref() == Some(super::ebs_snapshots::EBS_CSI_DRIVER)));
            if saved_by_snapshot {
                // Saved at the cut; its copy (if any) does not decide this plan's deadline.
                continue;
            }
            let Some(secs) = v.expected_seconds else {
                out.push(Late {
                    claim: format!("{ns}/{}", v.pvc),
                    message: format!(
                        "{ns}/{}: its size or Velero's rate is unknown, so whether Velero copies it before the deadline cannot be told",
                        v.pvc
                    ),
                });
                continue;
            };
            elapsed += secs;
            if elapsed > left {
                let gib = v.size_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64;
                out.push(Late {
                    claim: format!("{ns}/{}", v.pvc),
                    message: format!(
                        "{ns}/{} ({:?}, {gib:.1} GiB) would be copied by about {} at {} MiB/s, after the deadline in {}: it will not be protected in time{}",
                        v.pvc,
                        v.class,
                        human(elapsed),
                        rate.mib_per_second,
                        human(left),
                        if v.class == VolumeClass::NodeLocal {
                            " and dies with the node"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::volume::VolumeMethod;

    fn vol(pvc: &str, class: VolumeClass, source: &str, gib: Option<u64>) -> VolumeRecord {
        let rate = Rate {
            mib_per_second: 100.0,
            overhead: Duration::from_secs(5),
        };
        let size = gib.map(|g| g << 30);
        VolumeRecord {
            pvc: pvc.into(),
            pv: Some(format!("pv-{pvc}")),
            class,
            source: Some(source.into()),
            reason: String::new(),
            method: VolumeMethod::FileSystem,
            snapshot_class: None,
            release_at: ReleasePoint::Verified,
            snapshot: None,
            size_bytes: size,
            expected_seconds: size.map(|b| copy_seconds(b, rate)),
        }
    }

    fn rate() -> Rate {
        Rate {
            mib_per_second: 100.0,
            overhead: Duration::from_secs(5),
        }
    }

    #[test]
    fn copy_time_is_bytes_over_the_rate_and_never_panics() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(copy_time(10 * gib, 1024.0), Duration::from_secs(10));
        assert_eq!(copy_time(gib, 0.0), Duration::ZERO);
        assert_eq!(copy_time(gib, f64::MIN_POSITIVE), Duration::MAX);
        assert_eq!(
            copy_seconds(
                gib + 1,
                Rate {
                    mib_per_second: 1024.0,
                    overhead: Duration::ZERO
                }
            ),
            2
        );
        assert_eq!(
            copy_seconds(
                gib,
                Rate {
                    mib_per_second: f64::MIN_POSITIVE,
                    overhead: Duration::ZERO
                }
            ),
            u64::MAX
        );
    }

    #[test]
    fn each_volume_gets_its_pvs_size_and_copy_time() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-a"}, "spec": {"capacity": {"storage": "500Gi"}}
        }))
        .expect("a PV");
        let mut volumes = vec![
            vol("a", VolumeClass::Network, "ebs.csi.aws.com", None),
            vol("b", VolumeClass::NodeLocal, "local", None),
        ];
        annotate(&mut volumes, &[pv], rate());
        assert_eq!(volumes[0].size_bytes, Some(500 << 30));
        assert_eq!(
            volumes[0].expected_seconds,
            Some(5120),
            "500 GiB at 100 MiB/s"
        );
        assert_eq!(
            (volumes[1].size_bytes, volumes[1].expected_seconds),
            (None, None)
        );
    }

    #[test]
    fn under_a_deadline_the_volumes_copied_too_late_are_named_unless_a_snapshot_saves_them() {
        let two_minutes = Duration::from_secs(120);
        let local = vol("scratch", VolumeClass::NodeLocal, "local", Some(500));
        let ebs = vol("data", VolumeClass::Network, "ebs.csi.aws.com", Some(500));
        let small = vol("small", VolumeClass::NodeLocal, "local", Some(1));
        // The small local volume first fits (5 s + 11 s); the EBS one after it does not, nor the big local one.
        let backups = vec![(
            "db".to_string(),
            vec![small.clone(), ebs.clone(), local.clone()],
        )];
        let late = late_volumes(&backups, rate(), two_minutes, false);
        let claims: Vec<&str> = late.iter().map(|l| l.claim.as_str()).collect();
        assert_eq!(claims, ["db/data", "db/scratch"]);
        assert!(
            late[1].message.contains("dies with the node"),
            "{}",
            late[1].message
        );
        assert!(
            late[1].message.contains("after the deadline in 2m"),
            "{}",
            late[1].message
        );
        // EC2 may cut the EBS volume at once; the local one stays late.
        let late = late_volumes(&backups, rate(), two_minutes, true);
        assert_eq!(
            late.iter().map(|l| l.claim.as_str()).collect::<Vec<_>>(),
            ["db/scratch"]
        );
        // Released at its CSI snapshot, the EBS volume is saved at the cut.
        let mut cut = ebs.clone();
        cut.release_at = ReleasePoint::Snapshot;
        let late = late_volumes(&[("db".into(), vec![cut])], rate(), two_minutes, false);
        assert!(late.is_empty(), "{late:?}");
        // Plenty of time: nothing is late. An unknown size is named.
        assert!(late_volumes(&backups, rate(), Duration::from_secs(86_400), false).is_empty());
        let unknown = vol("u", VolumeClass::NodeLocal, "local", None);
        let late = late_volumes(&[("db".into(), vec![unknown])], rate(), two_minutes, false);
        assert!(
            late[0].message.contains("size or Velero's rate is unknown"),
            "{late:?}"
        );
    }
}

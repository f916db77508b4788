//! EBS snapshots of a node's instance through EC2: `CreateSnapshots` (every attached data volume at one
//! instant) and `DescribeSnapshots` by the plan's tag, for the emergency path of a forceful plan
//! ([`crate::planning::ebs_snapshots`]).
//!
//! Crash safety comes from the tag: [`ensure_instance_snapshots`] looks for the plan's snapshots before it
//! cuts any, so a pass resumed after a crash finds the set the last pass made instead of cutting another.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{
    Filter, InstanceSpecification, ResourceType, Snapshot, Tag, TagSpecification,
};

use super::ec2::{CloudError, Ec2Cloud};
use crate::planning::ebs_snapshots::{FoundSnapshot, SnapshotState};
use crate::planning::snapshot_window::LastSnapshot;

/// One CreateSnapshots call for an instance's data volumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSnapshotRequest {
    pub instance_id: String,
    /// Attached data volumes to leave out (`ExcludeDataVolumeId`).
    pub exclude: Vec<String>,
    /// Tags on every snapshot; the plan's uid tag is what finds them again.
    pub tags: BTreeMap<String, String>,
    pub description: String,
}

/// The outcome of [`ensure_instance_snapshots`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnsuredSnapshots {
    /// The plan's snapshots of the wanted volumes.
    Found {
        snapshots: Vec<FoundSnapshot>,
        /// False when the plan's snapshots already existed (a resumed pass).
        created: bool,
    },
    /// EC2 refused the cut (`SnapshotCreationPerVolumeRateExceeded`) and holds none under the plan's
    /// tag: a wanted volume was snapshotted less than 15 s ago by someone else. The newest snapshot of
    /// each wanted volume, to wait out the window ([`crate::planning::snapshot_window`]).
    TooSoon { newest: Vec<LastSnapshot> },
}

fn state_of(s: Option<&aws_sdk_ec2::types::SnapshotState>, message: Option<&str>) -> SnapshotState {
    use aws_sdk_ec2::types::SnapshotState as S;
    match s {
        Some(S::Pending) => SnapshotState::Pending,
        Some(S::Completed) => SnapshotState::Completed,
        Some(S::Error) => SnapshotState::Error(
            message
                .filter(|m| !m.is_empty())
                .unwrap_or("EC2 reported the snapshot in state error")
                .to_string(),
        ),
        Some(other) => SnapshotState::Other(other.as_str().to_string()),
        None => SnapshotState::Other("unknown".into()),
    }
}

impl Ec2Cloud {
    /// CreateSnapshots of the instance's data volumes (`ExcludeBootVolume`: the root volume holds no pod
    /// data), tagged at creation. Answers one `pending` snapshot per volume.
    pub async fn create_instance_snapshots(
        &self,
        req: &InstanceSnapshotRequest,
    ) -> Result<Vec<FoundSnapshot>, CloudError> {
        let spec = InstanceSpecification::builder()
            .instance_id(&req.instance_id)
            .exclude_boot_volume(true)
            .set_exclude_data_volume_ids((!req.exclude.is_empty()).then(|| req.exclude.clone()))
            .build();
        let tags: Vec<Tag> = req
            .tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        let out = self
            .client()
            .create_snapshots()
            .instance_specification(spec)
            .description(&req.description)
            .set_tag_specifications(Some(vec![
                TagSpecification::builder()
                    .resource_type(ResourceType::Snapshot)
                    .set_tags(Some(tags))
                    .build(),
            ]))
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("CreateSnapshots", Some(&req.instance_id), e))?;
        out.snapshots()
            .iter()
            .map(|s| {
                Ok(FoundSnapshot {
                    snapshot_id: s
                        .snapshot_id()
                        .ok_or(CloudError::UnexpectedResponse {
                            operation: "CreateSnapshots",
                            missing: "snapshotId",
                        })?
                        .to_string(),
                    volume_id: s
                        .volume_id()
                        .ok_or(CloudError::UnexpectedResponse {
                            operation: "CreateSnapshots",
                            missing: "volumeId",
                        })?
                        .to_string(),
                    state: state_of(s.state(), None),
                    progress: s.progress().map(str::to_string),
                })
            })
            .collect()
    }

    /// The account's snapshots (DescribeSnapshots, `Owner=self`) that `filter` selects, every page.
    async fn describe_own_snapshots(&self, filter: Filter) -> Result<Vec<Snapshot>, CloudError> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client()
                .describe_snapshots()
                .owner_ids("self")
                .filters(filter.clone())
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| CloudError::from_sdk("DescribeSnapshots", None, e))?;
            all.extend(out.snapshots().iter().cloned());
            match out.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(all),
            }
        }
    }

    /// The account's snapshots tagged `key=value` (a `tag:` filter).
    pub async fn snapshots_tagged(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<FoundSnapshot>, CloudError> {
        let filter = Filter::builder()
            .name(format!("tag:{key}"))
            .values(value)
            .build();
        self.describe_own_snapshots(filter)
            .await?
            .iter()
            .map(|s| {
                let (Some(id), Some(volume)) = (s.snapshot_id(), s.volume_id()) else {
                    return Err(CloudError::UnexpectedResponse {
                        operation: "DescribeSnapshots",
                        missing: "snapshotId or volumeId",
                    });
                };
                Ok(FoundSnapshot {
                    snapshot_id: id.to_string(),
                    volume_id: volume.to_string(),
                    state: state_of(s.state(), s.state_message()),
                    progress: s.progress().map(str::to_string),
                })
            })
            .collect()
    }

    /// The newest snapshot of each of `volume_ids` (a `volume-id` filter), whoever made it: what holds
    /// EC2's per-volume window. Snapshots without a start time are skipped (EC2 always sets one).
    pub async fn newest_snapshots(
        &self,
        volume_ids: &[String],
    ) -> Result<Vec<LastSnapshot>, CloudError> {
        let filter = Filter::builder()
            .name("volume-id")
            .set_values(Some(volume_ids.to_vec()))
            .build();
        let mut newest: BTreeMap<String, LastSnapshot> = BTreeMap::new();
        for s in self.describe_own_snapshots(filter).await? {
            let (Some(id), Some(volume), Some(start)) =
                (s.snapshot_id(), s.volume_id(), s.start_time())
            else {
                continue;
            };
            let Ok(started) = jiff::Timestamp::new(
                start.secs(),
                i32::try_from(start.subsec_nanos()).unwrap_or(0),
            ) else {
                continue;
            };
            if newest.get(volume).is_none_or(|seen| seen.started < started) {
                newest.insert(
                    volume.to_string(),
                    LastSnapshot {
                        volume_id: volume.to_string(),
                        snapshot_id: id.to_string(),
                        started,
                    },
                );
            }
        }
        Ok(newest.into_values().collect())
    }
}

/// The plan's snapshots of `wanted` volumes: those EC2 already has under the tag `key=value`, else a new
/// CreateSnapshots set. Only snapshots of `wanted` count, so one plan's sets for two nodes (same tag) do
/// not stand for each other. A `SnapshotCreationPerVolumeRateExceeded` answer (a volume snapshotted
/// less than 15 s ago, EC2 API reference "Error codes") may mean an earlier call of this plan got
/// through: the tag lookup is asked again instead of cutting; if it finds nothing, someone else cut a
/// wanted volume moments ago and the answer says when ([`EnsuredSnapshots::TooSoon`]).
pub async fn ensure_instance_snapshots(
    cloud: &Ec2Cloud,
    req: &InstanceSnapshotRequest,
    wanted: &[String],
    key: &str,
    value: &str,
) -> Result<EnsuredSnapshots, CloudError> {
    let of_wanted = |mut found: Vec<FoundSnapshot>| {
        found.retain(|s| wanted.contains(&s.volume_id));
        found
    };
    let existing = of_wanted(cloud.snapshots_tagged(key, value).await?);
    if !existing.is_empty() {
        return Ok(EnsuredSnapshots::Found {
            snapshots: existing,
            created: false,
        });
    }
    match cloud.create_instance_snapshots(req).await {
        Ok(snapshots) => Ok(EnsuredSnapshots::Found {
            snapshots,
            created: true,
        }),
        Err(e) if e.code() == Some("SnapshotCreationPerVolumeRateExceeded") => {
            let again = of_wanted(cloud.snapshots_tagged(key, value).await?);
            if again.is_empty() {
                return Ok(EnsuredSnapshots::TooSoon {
                    newest: cloud.newest_snapshots(wanted).await?,
                });
            }
            Ok(EnsuredSnapshots::Found {
                snapshots: again,
                created: false,
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_with_their_message() {
        use aws_sdk_ec2::types::SnapshotState as S;
        assert_eq!(state_of(Some(&S::Pending), None), SnapshotState::Pending);
        assert_eq!(
            state_of(Some(&S::Completed), None),
            SnapshotState::Completed
        );
        assert_eq!(
            state_of(Some(&S::Error), Some("disk gone")),
            SnapshotState::Error("disk gone".into())
        );
        assert!(matches!(
            state_of(Some(&S::Error), Some("")),
            SnapshotState::Error(m) if m.contains("state error")
        ));
        assert_eq!(
            state_of(Some(&S::Recovering), None),
            SnapshotState::Other("recovering".into())
        );
        assert_eq!(state_of(None, None), SnapshotState::Other("unknown".into()));
    }
}

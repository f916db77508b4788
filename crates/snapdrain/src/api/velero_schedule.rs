//! Velero's `velero.io/v1` Schedule, as snapdrain writes it for warm backups (velero
//! `pkg/apis/velero/v1/schedule_types.go`). The spec snapdrain writes is typed ([`ScheduleSpec`]); what it
//! reads keeps the spec and status as JSON, so a replace carries every field Velero wrote (status has no
//! subresource on this CRD) and a comparison sees every field someone else changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::velero::BackupSpec;

/// A Velero Schedule as read and replaced.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

/// `spec` as snapdrain writes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// The Backup each run creates (velero `pkg/builder/backup_builder.go` `FromSchedule` copies it).
    pub template: BackupSpec,
    /// robfig/cron, as `cron.ParseStandard` reads it (`@every 6h` included).
    pub schedule: String,
    /// Written as false: with owner references, deleting the Schedule would have the garbage collector
    /// delete its Backup objects, which Velero's sync controller re-creates from the bucket.
    pub use_owner_references_in_backup: bool,
    /// Written as false so the server's `--schedule-skip-immediately` does not decide, and Velero's own
    /// write of the field (it sets an absent one) leaves the spec as snapdrain wrote it.
    pub skip_immediately: bool,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta::default(),
            spec: Value::Null,
            status: None,
        }
    }
}

fn api_version() -> String {
    super::velero::API_VERSION.to_owned()
}

fn kind() -> String {
    "Schedule".to_owned()
}

impl kube::Resource for Schedule {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Schedule".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "velero.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "schedules".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

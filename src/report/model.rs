//! What a report is made from: plain data, so rendering is a pure function of it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use snapdrain::api::DisruptionPlan;

/// An Event about the plan (the controller records one per step and per notable action).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanEvent {
    pub time: jiff::Timestamp,
    /// `Normal` or `Warning`.
    pub type_: String,
    pub reason: String,
    pub note: String,
}

/// The times of one Velero Backup as Velero recorded them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VeleroBackupTimes {
    pub name: String,
    pub created: Option<jiff::Timestamp>,
    pub started: Option<jiff::Timestamp>,
    pub completed: Option<jiff::Timestamp>,
    pub phase: Option<String>,
    /// Items backed up of those found.
    pub items: Option<(u64, u64)>,
}

/// One entry of the simulated cluster's audit log (`GET /sim/audit`); absent on a real cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub seq: u64,
    pub time: String,
    pub source: String,
    pub verb: String,
    pub resource: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub user_agent: Option<String>,
    #[serde(default)]
    pub code: Option<u16>,
    #[serde(default)]
    pub detail: Value,
}

impl AuditRecord {
    pub fn at(&self) -> Option<jiff::Timestamp> {
        self.time.parse().ok()
    }
}

/// Everything one report shows.
#[derive(Clone, Debug)]
pub struct ReportData {
    pub plan: DisruptionPlan,
    pub events: Vec<PlanEvent>,
    pub backups: Vec<VeleroBackupTimes>,
    /// The simulator's audit log, when the cluster is the simulated one.
    pub audit: Option<Vec<AuditRecord>>,
    pub generated_at: jiff::Timestamp,
}

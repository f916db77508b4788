//! The audit log: every mutating API request and every event of the simulated world, in order, so tests
//! can check from the outside what clients and controllers did (e.g. that no protected pod was evicted
//! before a verified backup covered it).

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Position in the log, from 1.
    pub seq: u64,
    /// RFC 3339 with milliseconds.
    pub time: String,
    /// `api` for requests, `world` for the simulated cluster's own events.
    pub source: String,
    pub verb: String,
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub detail: Value,
}

pub struct Audit {
    entries: Mutex<Vec<AuditEntry>>,
    tx: broadcast::Sender<AuditEntry>,
}

impl Default for Audit {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self {
            entries: Mutex::new(Vec::new()),
            tx,
        }
    }
}

fn now_millis() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// A request or world event about to be recorded.
pub struct Record<'a> {
    pub source: &'a str,
    pub verb: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub code: Option<u16>,
    pub detail: Value,
}

impl Audit {
    pub fn record(&self, r: Record<'_>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = AuditEntry {
            seq: entries.len() as u64 + 1,
            time: now_millis(),
            source: r.source.to_string(),
            verb: r.verb.to_string(),
            resource: r.resource.to_string(),
            namespace: r.namespace.map(str::to_string),
            name: r.name.map(str::to_string),
            user_agent: r.user_agent.map(str::to_string),
            code: r.code,
            detail: r.detail,
        };
        entries.push(entry.clone());
        // Nobody following the log is normal.
        let _ = self.tx.send(entry);
    }

    /// A world event (pod evicted, backup phase, bucket write, instance launch, ...).
    pub fn world(
        &self,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        detail: Value,
    ) {
        self.record(Record {
            source: "world",
            verb,
            resource,
            namespace,
            name,
            user_agent: None,
            code: None,
            detail,
        });
    }

    /// Entries with `seq > since`.
    pub fn since(&self, since: u64) -> Vec<AuditEntry> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().skip(since as usize).cloned().collect()
    }

    pub fn follow(&self) -> broadcast::Receiver<AuditEntry> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_numbered_in_order() {
        let a = Audit::default();
        a.world(
            "evicted",
            "pods",
            Some("db"),
            Some("pg-0"),
            serde_json::json!({"node": "n1"}),
        );
        a.world(
            "phase",
            "backups.velero.io",
            Some("velero"),
            Some("b1"),
            serde_json::json!({"phase": "Completed"}),
        );
        let all = a.since(0);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(a.since(1)[0].name.as_deref(), Some("b1"));
    }
}

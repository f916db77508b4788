//! Notifications: every plan Event, also POSTed as JSON to the DisruptionPolicy's
//! `notifications.webhook.url` (Kubernetes Events are always written; this is for a chat or paging
//! system). Delivery is best effort and never slows a plan: Events are queued and sent by one task, each
//! retried with exponential backoff (1 s doubling, at most 5 min apart) up to `retries` times; a full
//! queue drops the newest and counts it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::mpsc;

use super::Metrics;
use crate::api::policy::WebhookNotification;

/// How many notifications wait for delivery before new ones are dropped.
const QUEUE: usize = 512;

/// What the webhook receives, one JSON object per plan Event.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Always `DisruptionPlanEvent`, so a receiver can tell these from other senders.
    pub kind: &'static str,
    pub plan: String,
    /// `Normal` or `Warning`, as on the Kubernetes Event.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub phase: String,
    pub nodes: Vec<String>,
    /// RFC 3339.
    pub time: String,
}

impl Notification {
    pub fn new(
        plan: &str,
        type_: &str,
        reason: &str,
        message: &str,
        phase: &str,
        nodes: &[String],
    ) -> Self {
        Self {
            kind: "DisruptionPlanEvent",
            plan: plan.to_owned(),
            type_: type_.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            phase: phase.to_owned(),
            nodes: nodes.to_vec(),
            time: jiff::Timestamp::now().to_string(),
        }
    }
}

/// True when `webhook` wants a notification with `reason` (no `reasons` listed: every one).
pub fn wanted(webhook: &WebhookNotification, reason: &str) -> bool {
    webhook.reasons.is_empty() || webhook.reasons.iter().any(|r| r == reason)
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error(
        "cannot reach the notification webhook {url}: {source} (check notifications.webhook.url in the DisruptionPolicy and that snapdrain may reach it)"
    )]
    Send {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the notification webhook {url} answered {status}")]
    Status { url: String, status: u16 },
}

impl NotifyError {
    /// 4xx other than 408/429 will not change on a retry.
    fn retryable(&self) -> bool {
        match self {
            Self::Send { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
        }
    }
}

/// The sending side, shared by every plan's reconcile. The webhook in force is set by whoever follows the
/// policy ([`Notifier::configure`]); without one, nothing is queued.
#[derive(Clone)]
pub struct Notifier {
    webhook: Arc<RwLock<Option<WebhookNotification>>>,
    tx: mpsc::Sender<(WebhookNotification, Notification)>,
    metrics: Metrics,
}

impl Notifier {
    /// A notifier and its delivery task (which ends when every notifier is dropped).
    pub fn start(metrics: Metrics, first_retry: Duration) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(rx, metrics.clone(), first_retry));
        Self {
            webhook: Arc::new(RwLock::new(None)),
            tx,
            metrics,
        }
    }

    pub fn configure(&self, webhook: Option<WebhookNotification>) {
        *self.webhook.write().unwrap_or_else(|e| e.into_inner()) = webhook;
    }

    /// Queues `n` for the webhook in force, if it wants it. Never waits.
    pub fn send(&self, n: Notification) {
        let webhook = self
            .webhook
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(webhook) = webhook.filter(|w| wanted(w, &n.reason)) else {
            return;
        };
        if self.tx.try_send((webhook, n)).is_err() {
            self.metrics.notification("dropped");
        }
    }
}

async fn deliver_all(
    mut rx: mpsc::Receiver<(WebhookNotification, Notification)>,
    metrics: Metrics,
    first_retry: Duration,
) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the notification client; notifications are off");
            return;
        }
    };
    // In order, one at a time: a receiver sees a plan's Events as they happened.
    while let Some((webhook, n)) = rx.recv().await {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(first_retry)
            .with_max_delay(Duration::from_secs(300))
            .with_max_times(webhook.retries as usize);
        let sent = (|| post(&client, &webhook.url, &n))
            .retry(backoff)
            .when(NotifyError::retryable)
            .notify(|e, wait| {
                tracing::debug!(error = %e, ?wait, "notification not delivered yet; retrying");
            })
            .await;
        match sent {
            Ok(()) => metrics.notification("sent"),
            Err(e) => {
                tracing::warn!(plan = %n.plan, reason = %n.reason, error = %e, "notification not delivered");
                metrics.notification("failed");
            }
        }
    }
}

async fn post(client: &reqwest::Client, url: &str, n: &Notification) -> Result<(), NotifyError> {
    let answer = client
        .post(url)
        .json(n)
        .send()
        .await
        .map_err(|source| NotifyError::Send {
            url: url.to_owned(),
            source,
        })?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(NotifyError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(reasons: &[&str]) -> WebhookNotification {
        WebhookNotification {
            url: "https://hooks.example/x".into(),
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            retries: 5,
        }
    }

    #[test]
    fn reasons_filter_what_is_sent() {
        assert!(wanted(&hook(&[]), "PlanCompleted"));
        assert!(wanted(
            &hook(&["PlanFailed", "DeadlineMissed"]),
            "DeadlineMissed"
        ));
        assert!(!wanted(&hook(&["PlanFailed"]), "BackingUp"));
    }

    #[test]
    fn only_answers_that_can_change_are_retried() {
        let status = |s| NotifyError::Status {
            url: "u".into(),
            status: s,
        };
        assert!(status(503).retryable());
        assert!(status(429).retryable());
        assert!(!status(404).retryable());
        assert!(!status(400).retryable());
    }

    #[test]
    fn the_payload_names_the_plan_and_what_happened() {
        let n = Notification::new(
            "p1",
            "Warning",
            "PlanFailed",
            "backup failed",
            "Failed",
            &["n1".into()],
        );
        let v = serde_json::to_value(&n).expect("serializes");
        assert_eq!(v["kind"], "DisruptionPlanEvent");
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["nodes"][0], "n1");
        assert!(
            v["time"]
                .as_str()
                .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok())
        );
    }
}

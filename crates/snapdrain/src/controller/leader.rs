//! Leader election on a coordination.k8s.io Lease (kube-lease-manager): every replica serves metrics and
//! health, only the holder reconciles plans.
//!
//! The library says "leader" until it itself sees otherwise, and a failed renewal only makes it retry
//! (kube-lease-manager 0.13 `watch`: an error from `changed()` is logged and backed off, nothing is
//! sent). Meanwhile a standby takes the Lease once `renewTime + leaseDurationSeconds` has passed, as the
//! library computes expiry from the written renewTime. So this replica also fences itself, as client-go's
//! `RenewDeadline` does: it acts only while the Lease, as last read, names it holder with a renewTime
//! recent enough that no standby can have taken over, whatever the library believes.

use std::time::Duration;

use backon::Retryable;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

use super::error::ControllerError;

pub const LEASE_NAME: &str = "snapdrain-controller";

/// The Lease task: it renews while any receiver lives and releases the Lease when the last one goes.
pub type LeaseTask = tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>;

/// Starts contending for the Lease; the receiver says whether this replica may act right now: it holds
/// the Lease and its last renewal keeps every standby off it (see the module docs).
pub async fn contend(
    client: Client,
    namespace: &str,
    identity: &str,
    duration_secs: u64,
) -> Result<(watch::Receiver<bool>, LeaseTask), ControllerError> {
    let grace = (duration_secs / 3).max(1);
    // Reads or creates the Lease: a transient API error is retried, not a replica that stops.
    let manager = (|| {
        LeaseManagerBuilder::new(client.clone(), LEASE_NAME)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(duration_secs)
            .with_grace(grace)
            .build()
    })
    .retry(crate::api_errors::startup_backoff())
    .when(|e| matches!(e, LeaseManagerError::KubeError(k) if !crate::api_errors::is_permanent(k)))
    .notify(
        |e, wait| tracing::warn!(error = %e, ?wait, "cannot set up leader election yet; retrying"),
    )
    .await
    .map_err(|e| {
        ControllerError::Config(format!(
            "cannot set up leader election on Lease {namespace}/{LEASE_NAME}: {e}"
        ))
    })?;
    let (granted, task) = manager.watch().await;
    let (acting_tx, acting) = watch::channel(false);
    let fence = Fence {
        identity: identity.to_owned(),
        duration: Duration::from_secs(duration_secs),
        // The library renews `grace` before expiry; half of it is left for that renewal to land.
        margin: Duration::from_millis(grace * 500),
    };
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    tokio::spawn(fence.run(leases, granted, acting_tx));
    Ok((acting, task))
}

struct Fence {
    identity: String,
    duration: Duration,
    margin: Duration,
}

impl Fence {
    /// Follows the library's answer and the Lease object until every receiver of `acting` is gone
    /// (then drops `granted`, so the library releases the Lease).
    async fn run(
        self,
        leases: Api<Lease>,
        mut granted: watch::Receiver<bool>,
        acting: watch::Sender<bool>,
    ) {
        let config = watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}"));
        let stream = watcher(leases, config).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        let mut until: Option<Timestamp> = None;
        loop {
            let now = Timestamp::now();
            let act = *granted.borrow() && may_act(until, now);
            acting.send_if_modified(|a| std::mem::replace(a, act) != act);
            // Wake when the renewal would run out, to stop acting then if none was seen.
            let wake = until
                .and_then(|u| Duration::try_from(u.duration_since(now)).ok())
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                () = acting.closed() => return,
                r = granted.changed() => if r.is_err() {
                    acting.send_replace(false);
                    return;
                },
                event = stream.next() => match event {
                    Some(Ok(lease)) => until = acting_until(&lease, &self.identity, self.duration, self.margin),
                    Some(Err(e)) => tracing::debug!(error = %e, "Lease watch"),
                    None => return,
                },
                () = tokio::time::sleep(wake) => {}
            }
        }
    }
}

/// Whether a replica whose renewal keeps standbys off until `until` may act at `now`.
fn may_act(until: Option<Timestamp>, now: Timestamp) -> bool {
    until.is_some_and(|u| now < u)
}

/// Until when `lease` lets `identity` act: its renewTime plus its duration, less `margin`; `None` when it
/// names another holder or no renewal.
fn acting_until(
    lease: &Lease,
    identity: &str,
    default_duration: Duration,
    margin: Duration,
) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(default_duration, Duration::from_secs);
    let left = jiff::SignedDuration::try_from(duration.saturating_sub(margin)).ok()?;
    renewed.checked_add(left).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(holder: &str, renewed: &str, seconds: i32) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": LEASE_NAME},
            "spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": seconds}
        }))
        .expect("a Lease")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn a_holder_acts_until_its_renewal_runs_out_less_the_margin() {
        let l = lease("a", "2026-12-03T12:00:00.000000Z", 15);
        let until = acting_until(
            &l,
            "a",
            Duration::from_secs(99),
            Duration::from_millis(2500),
        );
        assert_eq!(until, Some(at("2026-12-03T12:00:12.5Z")));
        assert!(may_act(until, at("2026-12-03T12:00:12Z")));
        // A standby takes the Lease at 12:00:15; this replica has stopped 2.5 s before.
        assert!(!may_act(until, at("2026-12-03T12:00:12.5Z")));
    }

    #[test]
    fn another_holder_or_no_renewal_means_no_acting() {
        let other = lease("b", "2026-12-03T12:00:00.000000Z", 15);
        assert_eq!(
            acting_until(&other, "a", Duration::from_secs(15), Duration::ZERO),
            None
        );
        let unrenewed: Lease = serde_json::from_value(json!({
            "metadata": {"name": LEASE_NAME}, "spec": {"holderIdentity": "a"}
        }))
        .expect("a Lease");
        assert_eq!(
            acting_until(&unrenewed, "a", Duration::from_secs(15), Duration::ZERO),
            None
        );
        assert!(!may_act(None, at("2026-12-03T12:00:00Z")));
    }
}

//! What `/healthz` answers: whether this replica's controller still works, not merely that the process
//! is up. The kubelet restarts a replica whose liveness probe fails, and a standby then takes the Lease,
//! so a wedged leader (its plan loop gone, or one reconcile stuck on a request that never returns) must
//! say so here instead of renewing its Lease and doing nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared between the lead loop, the reconciles and the HTTP endpoint. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    /// A reconcile in flight longer than this makes the replica unhealthy.
    stuck_after: Duration,
    /// Set while the lead loop task runs (standing by counts: it waits for the Lease).
    lead_loop: AtomicBool,
    next_id: AtomicU64,
    /// Start of every reconcile in flight, by a per-reconcile id, with its plan's name.
    in_flight: Mutex<BTreeMap<u64, (Instant, String)>>,
}

/// Why `/healthz` fails.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    #[error(
        "the plan loop has stopped (a task ended or panicked); restart this replica so a standby takes the Lease"
    )]
    LeadLoopStopped,
    #[error(
        "the reconcile of plan {plan} has been running for {secs} s (limit {limit} s): a request it waits on never returned"
    )]
    ReconcileStuck { plan: String, secs: u64, limit: u64 },
}

impl Health {
    pub fn new(stuck_after: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                stuck_after,
                lead_loop: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                in_flight: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Marks the lead loop as running until the returned guard drops, however the task ends (return,
    /// panic unwinding, abort).
    pub fn lead_loop_running(&self) -> LeadLoopGuard {
        self.inner.lead_loop.store(true, Ordering::SeqCst);
        LeadLoopGuard(self.clone())
    }

    /// Counts a reconcile of `plan` as in flight until the returned guard drops.
    pub fn reconcile_started(&self, plan: &str) -> ReconcileGuard {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, (Instant::now(), plan.to_owned()));
        ReconcileGuard {
            health: self.clone(),
            id,
        }
    }

    /// `Ok` while the lead loop runs and no reconcile has been in flight for longer than the limit.
    pub fn check(&self) -> Result<(), Unhealthy> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), Unhealthy> {
        if !self.inner.lead_loop.load(Ordering::SeqCst) {
            return Err(Unhealthy::LeadLoopStopped);
        }
        let oldest = self
            .lock()
            .values()
            .min_by_key(|(started, _)| *started)
            .map(|(started, plan)| (now.saturating_duration_since(*started), plan.clone()));
        match oldest {
            Some((age, plan)) if age > self.inner.stuck_after => Err(Unhealthy::ReconcileStuck {
                plan,
                secs: age.as_secs(),
                limit: self.inner.stuck_after.as_secs(),
            }),
            _ => Ok(()),
        }
    }

    // A poisoned lock only means a panic while it was held; the map itself is still consistent (each
    // operation is a single insert or remove), so keep using it.
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (Instant, String)>> {
        self.inner
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub struct LeadLoopGuard(Health);

impl Drop for LeadLoopGuard {
    fn drop(&mut self) {
        self.0.inner.lead_loop.store(false, Ordering::SeqCst);
    }
}

pub struct ReconcileGuard {
    health: Health,
    id: u64,
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        self.health.lock().remove(&self.id);
    }
}

/// Makes any panic end the process (exit code 70, EX_SOFTWARE) after it is logged. A panic inside one
/// task would otherwise end only that task: the Lease renewal, the gate and `/metrics` keep running
/// while no plan moves, and the standby never takes over (security review C-2). Installed by
/// `snapdrain controller` only; tests that run the controller in-process keep the default hook.
pub fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(panic = %info, "a task panicked: exiting so that a standby takes over");
        default(info);
        std::process::exit(70);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_while_the_lead_loop_runs() {
        let h = Health::new(Duration::from_secs(60));
        assert_eq!(h.check(), Err(Unhealthy::LeadLoopStopped));
        let guard = h.lead_loop_running();
        assert_eq!(h.check(), Ok(()));
        drop(guard);
        assert_eq!(h.check(), Err(Unhealthy::LeadLoopStopped));
    }

    #[test]
    fn a_reconcile_in_flight_past_the_limit_is_named() {
        let h = Health::new(Duration::from_secs(60));
        let _lead = h.lead_loop_running();
        let started = Instant::now();
        let slow = h.reconcile_started("drain-a");
        let _fresh = h.reconcile_started("drain-b");
        assert_eq!(h.check_at(started + Duration::from_secs(59)), Ok(()));
        let err = h
            .check_at(started + Duration::from_secs(61))
            .expect_err("stuck");
        assert!(
            matches!(&err, Unhealthy::ReconcileStuck { plan, .. } if plan == "drain-a" || plan == "drain-b"),
            "{err}"
        );
        drop(slow);
        drop(_fresh);
        assert_eq!(h.check_at(started + Duration::from_secs(600)), Ok(()));
    }

    #[test]
    fn a_panicking_task_clears_the_lead_loop_flag() {
        let h = Health::new(Duration::from_secs(60));
        let h2 = h.clone();
        let joined = std::thread::spawn(move || {
            let _guard = h2.lead_loop_running();
            panic!("a bug in a step");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(h.check(), Err(Unhealthy::LeadLoopStopped));
    }

    /// Set in the child process [`a_panic_in_a_spawned_task_ends_the_process`] runs.
    const PANIC_CHILD: &str = "SNAPDRAIN_TEST_EXIT_ON_PANIC_CHILD";

    /// The hook ends the whole process when a spawned task panics, as the controller runs its loops
    /// (tokio otherwise keeps the panic inside the task's JoinHandle and the process lives on). Run
    /// in a child process of this test binary: the hook is process-wide and exits. Without the hook
    /// the child outlives the panic and exits 0 after its bound.
    #[test]
    fn a_panic_in_a_spawned_task_ends_the_process() {
        if std::env::var_os(PANIC_CHILD).is_some() {
            exit_on_panic();
            let rt = tokio::runtime::Runtime::new()
                .unwrap_or_else(|e| unreachable!("a test runtime starts: {e}"));
            rt.block_on(async {
                let _task = tokio::spawn(async { panic!("a bug in a step") });
                // What the controller's other loops do meanwhile: keep running. Bounded, so that a
                // hook that does not exit fails the parent instead of hanging it.
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
            std::process::exit(0);
        }
        let exe = std::env::current_exe()
            .unwrap_or_else(|e| unreachable!("a running test knows its binary: {e}"));
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "controller::health::tests::a_panic_in_a_spawned_task_ends_the_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PANIC_CHILD, "1")
            .output()
            .expect("the child test process runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(70), "{stderr}");
        assert!(stderr.contains("a bug in a step"), "{stderr}");
    }
}

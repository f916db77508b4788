//! One reconcile pass over a DisruptionPlan: validate, then drive the phase machine
//! ([`crate::planning::next_phase`]) as far as the cluster allows right now, persisting status after every
//! step so that a restarted controller resumes exactly where this one stopped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::error::ControllerError;
use super::steps;
use crate::api::status::{DisruptionPlanStatus, PlanPhase, StatusSummary, condition};
use crate::api::{DisruptionPlan, ValidSpec, problems_message, validate};
use crate::planning::phase::{abort_requested, deadline_passed};
use crate::planning::{PhaseDecision, PhaseFacts, next_phase};
use crate::telemetry::metrics::{PhaseLabel, ReasonLabel};

pub const FIELD_MANAGER: &str = "snapdrain";
/// Annotation a person sets to stop a plan; it rolls back what snapdrain did.
pub const ABORT_ANNOTATION: &str = "snapdrain.io/abort";

/// A plan being driven in this pass.
pub struct PlanRun {
    pub plan: Arc<DisruptionPlan>,
    pub ctx: Arc<Context>,
    pub status: DisruptionPlanStatus,
    pub valid: ValidSpec,
    /// When the current phase began in this process (status keeps the persisted time).
    phase_clock: Instant,
    /// Set by a step that hit a problem no retry can fix: the plan fails (and rolls back) with this.
    pub fail: Option<String>,
    /// The plan's resourceVersion this pass works from: a status write from a stale copy (a reconcile
    /// that started before our own last write reached the cache) is refused instead of undoing progress.
    resource_version: Option<String>,
}

impl PlanRun {
    fn new(
        plan: Arc<DisruptionPlan>,
        ctx: Arc<Context>,
        status: DisruptionPlanStatus,
        valid: ValidSpec,
    ) -> Self {
        let resource_version = plan.metadata.resource_version.clone();
        Self {
            plan,
            ctx,
            status,
            valid,
            phase_clock: Instant::now(),
            fail: None,
            resource_version,
        }
    }

    pub fn name(&self) -> String {
        self.plan.name_any()
    }

    pub fn uid(&self) -> String {
        self.plan.uid().unwrap_or_default()
    }

    pub fn now() -> Timestamp {
        Timestamp::now()
    }

    /// Writes the whole status with server-side apply: one owner, so `force` only guards against stale
    /// managers from older versions.
    pub async fn save(&mut self) -> Result<(), ControllerError> {
        self.status.summary = Some(StatusSummary::of(&self.status));
        self.status.observed_generation = self.plan.metadata.generation;
        let api: Api<DisruptionPlan> = Api::all(self.ctx.client.clone());
        let body = json!({
            "apiVersion": DisruptionPlan::api_version(&()),
            "kind": DisruptionPlan::kind(&()),
            "metadata": {"resourceVersion": self.resource_version},
            "status": self.status,
        });
        let written = api
            .patch_status(
                &self.name(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
            .map_err(|source| ControllerError::WriteStatus {
                plan: self.name(),
                source,
            })?;
        self.resource_version = written.metadata.resource_version;
        Ok(())
    }

    fn completion_message(&self) -> String {
        let nodes: Vec<&str> = self.status.nodes.iter().map(|n| n.name.as_str()).collect();
        let evicted: u32 = self.status.nodes.iter().map(|n| n.pods_evicted).sum();
        let verified = self.status.backups.iter().filter(|b| b.verified).count();
        let replacements: Vec<&str> = self
            .status
            .nodes
            .iter()
            .filter_map(|n| n.replacement.as_ref().and_then(|r| r.node_name.as_deref()))
            .collect();
        let mut m = format!(
            "completed: {} handled, {evicted} pod(s) evicted, {verified} backup(s) verified",
            nodes.join(", ")
        );
        if !replacements.is_empty() {
            m.push_str(&format!(", replacement Ready: {}", replacements.join(", ")));
        }
        m
    }

    pub async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let type_name = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let nodes: Vec<String> = if self.status.nodes.is_empty() {
            self.plan.spec.nodes.clone()
        } else {
            self.status.nodes.iter().map(|n| n.name.clone()).collect()
        };
        self.ctx.notifier.send(crate::telemetry::Notification::new(
            &self.name(),
            type_name,
            reason,
            &note,
            self.status.phase.as_str(),
            &nodes,
        ));
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        // Events are best-effort: losing one must not stop the plan.
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&event, &self.plan.object_ref(&()))
            .await
        {
            tracing::warn!(plan = %self.name(), error = %e, "cannot publish event");
        }
    }

    /// Shows a retried error in `status.message` and the Progressing condition, so `kubectl get`
    /// says why the plan is not moving. Best effort: the error itself is what the caller returns.
    async fn record_retrying(&mut self, phase: PlanPhase, error: &ControllerError) {
        let message = format!("{} is retrying: {error}", phase.as_str());
        self.set_condition(condition::PROGRESSING, false, "Retrying", message.clone());
        self.status.message = Some(message);
        if let Err(e) = self.save().await {
            tracing::debug!(plan = %self.name(), error = %e, "could not record the retried error");
        }
    }

    fn clear_retrying(&mut self) {
        if self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::PROGRESSING && c.status == "False")
        {
            self.set_condition(
                condition::PROGRESSING,
                true,
                "Progressing",
                "the last pass succeeded".into(),
            );
        }
    }

    pub fn set_condition(&mut self, type_: &str, ok: bool, reason: &str, message: String) {
        let status = if ok { "True" } else { "False" };
        let now = Time(Self::now());
        match self.status.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) if c.status == status && c.reason == reason && c.message == message => {}
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message;
                c.observed_generation = self.plan.metadata.generation;
            }
            None => self.status.conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                last_transition_time: now,
                observed_generation: self.plan.metadata.generation,
            }),
        }
    }

    /// Moves to the decided phase: timings, message, rollback, then (once the new phase is written)
    /// the log line, Event and metrics.
    async fn transition(&mut self, decision: PhaseDecision) -> Result<(), ControllerError> {
        let from = self.status.phase;
        let to = decision.phase;
        // From the persisted start of the phase: a phase usually spans several reconciles (and restarts).
        let seconds = match &self.status.phase_started_at {
            Some(start) => Self::now().duration_since(start.0).as_secs_f64().max(0.0),
            None => self.phase_clock.elapsed().as_secs_f64(),
        };
        *self
            .status
            .step_timings
            .entry(from.as_str().to_string())
            .or_insert(0.0) += seconds;
        self.phase_clock = Instant::now();
        if decision.rollback {
            steps::rollback::run(self).await;
        }
        self.status.phase = to;
        self.status.phase_started_at = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Self::now()),
        );
        match decision.message.clone() {
            Some(m) => self.status.message = Some(m),
            None if to == PlanPhase::Completed => {
                self.status.message = Some(self.completion_message())
            }
            None => {}
        }
        let note = decision
            .message
            .clone()
            .unwrap_or_else(|| format!("{from} → {to}"));
        match to {
            PlanPhase::Failed | PlanPhase::Aborted => {
                self.set_condition(condition::DONE, false, to.as_str(), note.clone())
            }
            PlanPhase::Completed => {
                self.set_condition(condition::DONE, true, "Completed", note.clone())
            }
            _ => {}
        }
        // Reported only once written: a pass that started from a stale copy of the plan (the cache
        // behind this controller's own last write) is refused with a 409 and retried, and must not log,
        // count or announce the same transition a second time.
        self.save().await?;
        self.ctx.metrics.observe_step(from.as_str(), seconds);
        // Not a field named `message`: it would replace the event's own text in the JSON logs.
        tracing::info!(plan = %self.name(), from = %from, to = %to, detail = decision.message.as_deref().unwrap_or(""), "plan phase changed");
        match to {
            PlanPhase::Failed | PlanPhase::Aborted => {
                // An aborted plan was stopped on purpose: counted apart, so the failure rate (and
                // anything alerting on it) sees only plans that went wrong.
                let counter = if to == PlanPhase::Failed {
                    &self.ctx.metrics.plans_failed
                } else {
                    &self.ctx.metrics.plans_aborted
                };
                counter
                    .get_or_create(&ReasonLabel {
                        reason: format!("from_{from}"),
                    })
                    .inc();
                self.event(EventType::Warning, &format!("Plan{to}"), "Finish", note)
                    .await;
            }
            PlanPhase::Completed => {
                self.event(EventType::Normal, "PlanCompleted", "Finish", note)
                    .await;
            }
            _ => {
                self.event(EventType::Normal, to.as_str(), "Progress", note)
                    .await
            }
        }
        Ok(())
    }
}

/// Finalizer that holds a deleted plan until its rollback ran.
pub const FINALIZER: &str = "snapdrain.io/rollback";

/// Adds or removes [`FINALIZER`] (a no-op when it is already as wanted). `resource_version` is the
/// newest this controller knows of the plan (after its own status writes, newer than `plan`'s).
async fn set_finalizer(
    plan: &DisruptionPlan,
    ctx: &Context,
    present: bool,
    resource_version: Option<String>,
) -> Result<(), ControllerError> {
    let mut finalizers = plan.finalizers().to_vec();
    if finalizers.iter().any(|f| f == FINALIZER) == present {
        return Ok(());
    }
    if present {
        finalizers.push(FINALIZER.to_string());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    let api: Api<DisruptionPlan> = Api::all(ctx.client.clone());
    // The resourceVersion makes this a compare-and-swap: finalizers of others are never lost.
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
    match api
        .patch(
            &plan.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(ControllerError::WriteStatus {
            plan: plan.name_any(),
            source,
        }),
    }
}

/// Reconciles one plan.
pub async fn reconcile(
    plan: Arc<DisruptionPlan>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let status = plan.status.clone().unwrap_or_default();
    if status.phase.is_terminal() {
        // Nothing left to undo: a finished plan can be deleted at once.
        set_finalizer(&plan, &ctx, false, plan.resource_version()).await?;
        return Ok(Action::await_change());
    }
    if plan.meta().deletion_timestamp.is_none() {
        // Deleting a plan mid-way must not leave a node cordoned: the finalizer gives the controller
        // the chance to roll back first (the deletion then aborts the plan).
        set_finalizer(&plan, &ctx, true, plan.resource_version()).await?;
    }
    let valid = match validate(&plan.spec) {
        Ok(v) => v,
        Err(problems) => return mark_invalid(plan, ctx, status, problems_message(&problems)).await,
    };
    let mut run = PlanRun::new(plan, ctx, status, valid);
    let result = drive(&mut run).await;
    if let Ok(mut failures) = run.ctx.failures.lock() {
        failures.remove(&run.name());
    }
    result
}

/// An invalid spec is recorded once and waits for a change (no hot loop).
async fn mark_invalid(
    plan: Arc<DisruptionPlan>,
    ctx: Arc<Context>,
    status: DisruptionPlanStatus,
    message: String,
) -> Result<Action, ControllerError> {
    let already = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::VALID && c.status == "False" && c.message == message)
        && status.observed_generation == plan.metadata.generation;
    if already {
        return Ok(Action::await_change());
    }
    let valid = ValidSpec::default();
    let mut run = PlanRun::new(plan, ctx, status, valid);
    run.set_condition(condition::VALID, false, "InvalidSpec", message.clone());
    run.status.phase = PlanPhase::Failed;
    run.status.message = Some(format!("invalid spec: {message}"));
    run.save().await?;
    run.event(EventType::Warning, "InvalidSpec", "Validate", message)
        .await;
    Ok(Action::await_change())
}

async fn drive(run: &mut PlanRun) -> Result<Action, ControllerError> {
    if run.status.decided_at.is_none() {
        run.status.decided_at = Some(Time(PlanRun::now()));
        run.set_condition(condition::VALID, true, "Valid", "spec is valid".into());
    }
    // Each loop performs the current phase's work, then asks the phase machine where to go.
    for _ in 0..16 {
        let phase = run.status.phase;
        let mut facts = PhaseFacts {
            abort_requested: abort_requested(
                run.plan
                    .annotations()
                    .get(ABORT_ANNOTATION)
                    .map(String::as_str),
                run.plan.meta().deletion_timestamp.is_some(),
            ),
            deadline_passed: deadline_passed(
                run.plan.spec.deadline.as_ref().map(|d| d.0),
                PlanRun::now(),
            ),
            ..PhaseFacts::default()
        };
        let wait = if facts.abort_requested {
            None
        } else {
            match steps::run_phase(run, phase, &mut facts).await {
                Ok(wait) => {
                    run.clear_retrying();
                    wait
                }
                // No retry fixes RBAC, a missing Secret or a refused EC2 request: fail with the message.
                Err(e) if e.is_permanent() => {
                    run.fail = Some(format!("{} failed: {e}", phase.as_str()));
                    None
                }
                // Past the deadline the phase machine decides, whatever the step's error.
                Err(e) if facts.deadline_passed => {
                    tracing::warn!(plan = %run.name(), error = %e, "step failed after the deadline");
                    None
                }
                Err(e) => {
                    run.record_retrying(phase, &e).await;
                    return Err(e);
                }
            }
        };
        let decision = match run.fail.take() {
            Some(message) => PhaseDecision {
                phase: PlanPhase::Failed,
                rollback: true,
                message: Some(message),
            },
            None => next_phase(phase, &run.plan.spec, &facts),
        };
        if decision.phase != phase {
            let missed = facts.deadline_passed && decision.phase == PlanPhase::Failed;
            if missed {
                run.ctx.metrics.deadlines_missed.inc();
                run.event(
                    EventType::Warning,
                    "DeadlineMissed",
                    "Deadline",
                    format!(
                        "spec.deadline passed in {}: {}",
                        phase.as_str(),
                        decision.message.clone().unwrap_or_default()
                    ),
                )
                .await;
            }
            run.transition(decision).await?;
            if run.status.phase.is_terminal() {
                set_finalizer(&run.plan, &run.ctx, false, run.resource_version.clone()).await?;
                return Ok(Action::await_change());
            }
            continue;
        }
        // A deadline is shown while it runs, and the plan is looked at again no later than it.
        let left = run
            .plan
            .spec
            .deadline
            .as_ref()
            .filter(|_| !run.status.phase.is_terminal())
            .map(|d| d.0.duration_since(PlanRun::now()).unsigned_abs());
        if let Some(left) = left {
            let base = run.status.message.clone().unwrap_or_default();
            let base = base
                .split(" (deadline in ")
                .next()
                .unwrap_or_default()
                .to_owned();
            run.status.message = Some(format!("{base} (deadline in {}s)", left.as_secs()));
        }
        run.save().await?;
        let wait = wait.unwrap_or(Duration::from_secs(30));
        return Ok(Action::requeue(match left {
            Some(left) => wait.min(left + Duration::from_millis(100)),
            None => wait,
        }));
    }
    run.save().await?;
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// Error policy: back off per plan, growing with consecutive failures (kube-runtime keeps no such state).
pub fn error_policy(
    plan: Arc<DisruptionPlan>,
    error: &ControllerError,
    ctx: Arc<Context>,
) -> Action {
    let name = plan.name_any();
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ReasonLabel {
            reason: error.kind().into(),
        })
        .inc();
    let attempts = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(name.clone()).or_insert(0);
            *n += 1;
            *n
        }
        Err(_) => 1,
    };
    // A stale copy (409 on the status write) only needs the cache to catch up.
    let stale = matches!(error, ControllerError::WriteStatus { source: kube::Error::Api(e), .. } if e.code == 409);
    let delay = if stale {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(500u64.saturating_mul(1 << attempts.min(7)))
    };
    if matches!(error, ControllerError::NotLeading) {
        tracing::debug!(plan = %name, "pass cancelled: no longer leading");
    } else if stale {
        tracing::debug!(plan = %name, retry_in = ?delay, "plan changed since this pass read it; retrying on a fresh copy");
    } else {
        tracing::warn!(plan = %name, error = %error, retry_in = ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

/// Sets `snapdrain_plans{phase}` from a list of plans.
pub fn record_phases(ctx: &Context, plans: &[Arc<DisruptionPlan>]) {
    let mut counts = std::collections::BTreeMap::new();
    for p in plans {
        let phase = p.status.as_ref().map(|s| s.phase).unwrap_or_default();
        *counts.entry(phase.as_str()).or_insert(0i64) += 1;
    }
    for phase in PlanPhase::ALL {
        let n = counts.get(phase.as_str()).copied().unwrap_or(0);
        ctx.metrics
            .plans
            .get_or_create(&PhaseLabel {
                phase: phase.as_str().into(),
            })
            .set(n);
    }
}

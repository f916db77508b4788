//! The plan driver: one reconcile pass over a DisruptionPlan. Validate, then call the current phase's
//! step ([`super::steps`]) and apply its [`Outcome`]: write the status, announce what the write carries,
//! let the phase machine ([`crate::planning::next_phase`]) decide from the written status, and wait on
//! the caches when the step asks. This is the only code that writes a plan's status, publishes its
//! Events, reads the clock or waits, so a restarted controller resumes exactly where this one stopped and
//! a refused write repeats no announcement.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::context::Context;
use super::error::ControllerError;
use super::report::{About, Note, What};
use super::step::{Next, Outcome, PlanView, Wake};
use super::steps;
use crate::api::status::{DisruptionPlanStatus, PlanPhase, StatusSummary, condition};
use crate::api::{DisruptionPlan, ValidSpec, problems_message, validate};
use crate::planning::{PhaseDecision, PhaseFacts, launch_policy, next_phase};
use crate::telemetry::metrics::{PhaseLabel, ReasonLabel};

pub const FIELD_MANAGER: &str = "snapdrain";

/// Finalizer that holds a deleted plan until its rollback ran.
pub const FINALIZER: &str = "snapdrain.io/rollback";

/// Step calls per pass at most: checkpoints and fired waits call the step again within the pass.
const MAX_CALLS: usize = 16;
/// After a wait on the caches that did not fire within its slice, the plan is looked at again this soon.
const POLL: Duration = Duration::from_secs(1);
/// A phase that stays with nothing to wait for is looked at again after this (watches usually wake it).
const IDLE: Duration = Duration::from_secs(30);
/// Superseded resourceVersions remembered per plan.
const SUPERSEDED_KEPT: usize = 16;

/// The plan this pass drives, and its status as this pass knows it.
struct Pass {
    plan: Arc<DisruptionPlan>,
    valid: ValidSpec,
    status: DisruptionPlanStatus,
    /// The status as last written (or read): a write of an unchanged status is skipped.
    written: DisruptionPlanStatus,
    /// The resourceVersion the next write is made over: a write from a stale copy is refused (409).
    resource_version: Option<String>,
}

impl Pass {
    fn new(plan: Arc<DisruptionPlan>, valid: ValidSpec) -> Self {
        let status = plan.status.clone().unwrap_or_default();
        Self {
            resource_version: plan.metadata.resource_version.clone(),
            written: status.clone(),
            status,
            valid,
            plan,
        }
    }

    /// A pass that goes on from `patched`, the resourceVersion this controller's own metadata patch
    /// (the finalizer) made of `plan`, when it made one: `plan`'s own version is then superseded.
    fn after(
        plan: Arc<DisruptionPlan>,
        valid: ValidSpec,
        patched: Option<String>,
        ctx: &Context,
    ) -> Self {
        let mut pass = Self::new(plan, valid);
        if let Some(rv) = patched {
            let old = pass.resource_version.replace(rv);
            pass.supersede(ctx, old);
        }
        pass
    }

    /// Remembers that `old` is a version of this plan the controller has written over.
    fn supersede(&self, ctx: &Context, old: Option<String>) {
        if let (Some(old), Ok(mut superseded)) = (old, ctx.superseded.lock()) {
            let kept = superseded.entry(self.name()).or_insert_with(VecDeque::new);
            kept.push_back(old);
            if kept.len() > SUPERSEDED_KEPT {
                kept.pop_front();
            }
        }
    }

    fn name(&self) -> String {
        self.plan.name_any()
    }

    /// What the phase machine decides from the status as this pass knows it.
    fn decide(&self, phase: PlanPhase, now: Timestamp) -> PhaseDecision {
        let facts = PhaseFacts::of(&self.plan, &self.valid, &self.status, now);
        next_phase(phase, &self.plan.spec, &facts)
    }

    fn view(&self, now: Timestamp) -> PlanView<'_> {
        PlanView {
            plan: &self.plan,
            valid: &self.valid,
            // What the driver set since the last write (decided_at on the first pass) and progress without
            // news ride along with the next write ([`stay`]); intents are always written first.
            status: &self.status,
            now,
        }
    }

    /// Writes the status with server-side apply (one owner, so `force` only guards against stale
    /// managers of older versions), over the resourceVersion this pass works from.
    async fn write(&mut self, ctx: &Context) -> Result<(), ControllerError> {
        // Every text at its bound, so the status keeps within what planning judged it may grow to.
        crate::planning::status_size::bound_texts(&mut self.status);
        self.status.summary = Some(StatusSummary::of(&self.status));
        self.status.observed_generation = self.plan.metadata.generation;
        if self.status == self.written {
            return Ok(());
        }
        let api: Api<DisruptionPlan> = Api::all(ctx.client.clone());
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
        let old = self.resource_version.take();
        self.supersede(ctx, old);
        self.resource_version = written.metadata.resource_version;
        self.written = self.status.clone();
        Ok(())
    }

    /// Writes, then announces what the write carries (nothing when it is refused).
    async fn write_and_publish(
        &mut self,
        ctx: &Context,
        notes: Vec<Note>,
    ) -> Result<(), ControllerError> {
        self.write(ctx).await?;
        if !notes.is_empty() {
            ctx.report.publish(&self.about(), notes);
        }
        Ok(())
    }

    fn about(&self) -> About<'_> {
        About {
            plan: self.plan.meta().name.as_deref().unwrap_or_default(),
            reference: self.plan.object_ref(&()),
            phase: self.status.phase,
            nodes: if self.status.nodes.is_empty() {
                self.plan.spec.nodes.clone()
            } else {
                self.status.nodes.iter().map(|n| n.name.clone()).collect()
            },
        }
    }

    fn set_condition(
        &mut self,
        type_: &str,
        ok: bool,
        reason: &str,
        message: String,
        now: Timestamp,
    ) {
        set_condition(
            &mut self.status.conditions,
            self.plan.metadata.generation,
            Condition {
                type_: type_.into(),
                status: if ok { "True" } else { "False" }.into(),
                reason: reason.into(),
                message,
                last_transition_time: Time(now),
                observed_generation: self.plan.metadata.generation,
            },
        );
    }

    /// Shows a retried error in `status.message` and the Progressing condition, so `kubectl get` says
    /// why the plan is not moving.
    fn record_retrying(&mut self, phase: PlanPhase, error: &ControllerError, now: Timestamp) {
        let message = format!("{} is retrying: {error}", phase.as_str());
        self.set_condition(
            condition::PROGRESSING,
            false,
            "Retrying",
            message.clone(),
            now,
        );
        self.status.message = Some(message);
    }

    fn clear_retrying(&mut self, now: Timestamp) {
        let retrying = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::PROGRESSING && c.status == "False");
        if retrying {
            self.set_condition(
                condition::PROGRESSING,
                true,
                "Progressing",
                "the last pass succeeded".into(),
                now,
            );
        }
    }

    /// Moves to the decided phase (rolling back first when it says so); returns what to announce once
    /// the new phase is written.
    async fn transition(
        &mut self,
        ctx: &Context,
        decision: PhaseDecision,
        now: Timestamp,
    ) -> Vec<Note> {
        let from = self.status.phase;
        let to = decision.phase;
        // From the persisted start of the phase: a phase usually spans several passes (and restarts).
        let seconds = self.status.phase_started_at.as_ref().map_or(0.0, |start| {
            now.duration_since(start.0).as_secs_f64().max(0.0)
        });
        *self
            .status
            .step_timings
            .entry(from.as_str().to_string())
            .or_insert(0.0) += seconds;
        let mut notes = Vec::new();
        if decision.rollback {
            let view = PlanView {
                plan: &self.plan,
                valid: &self.valid,
                status: &self.status,
                now,
            };
            let undone = steps::rollback::run(&view, &ctx.io(&ctx.caches)).await;
            self.status = undone.status;
            notes = undone.notes;
        }
        self.status.phase = to;
        self.status.phase_started_at = Some(MicroTime(now));
        match &decision.message {
            Some(m) => self.status.message = Some(m.clone()),
            None if to == PlanPhase::Completed => {
                self.status.message = Some(completion_message(&self.status))
            }
            None => {}
        }
        let note = decision
            .message
            .clone()
            .unwrap_or_else(|| format!("{from} → {to}"));
        match to {
            PlanPhase::Failed | PlanPhase::Aborted => {
                self.set_condition(condition::DONE, false, to.as_str(), note.clone(), now)
            }
            PlanPhase::Completed => {
                self.set_condition(condition::DONE, true, "Completed", note.clone(), now)
            }
            _ => {}
        }
        notes.push(Note {
            what: What::PhaseChanged { from, to, seconds },
            text: note,
        });
        notes
    }
}

/// Sets a metav1 Condition, keeping its transition time unless its status changes.
fn set_condition(conditions: &mut Vec<Condition>, generation: Option<i64>, new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(c) if c.status == new.status && c.reason == new.reason && c.message == new.message => {
        }
        Some(c) => {
            if c.status != new.status {
                c.last_transition_time = new.last_transition_time;
            }
            c.status = new.status;
            c.reason = new.reason;
            c.message = new.message;
            c.observed_generation = generation;
        }
        None => conditions.push(new),
    }
}

fn completion_message(status: &DisruptionPlanStatus) -> String {
    let nodes: Vec<&str> = status.nodes.iter().map(|n| n.name.as_str()).collect();
    let evicted: u32 = status.nodes.iter().map(|n| n.pods_evicted).sum();
    let verified = status.backups.iter().filter(|b| b.verified).count();
    let replacements: Vec<&str> = status
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

/// Adds or removes [`FINALIZER`] (a no-op when it is already as wanted). `resource_version` is the
/// newest this controller knows of the plan (after its own status writes, newer than `plan`'s). Returns
/// the resourceVersion its patch made, when it patched: the pass goes on from that one, so its status
/// write does not go over the finalizer (kube-apiserver refuses a stale resourceVersion with 409) and a
/// copy from before the patch is known to be superseded.
async fn set_finalizer(
    plan: &DisruptionPlan,
    ctx: &Context,
    present: bool,
    resource_version: Option<String>,
) -> Result<Option<String>, ControllerError> {
    let mut finalizers = plan.finalizers().to_vec();
    if finalizers.iter().any(|f| f == FINALIZER) == present {
        return Ok(None);
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
        Ok(patched) => Ok(patched.metadata.resource_version),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(source) => Err(ControllerError::WriteStatus {
            plan: plan.name_any(),
            source,
        }),
    }
}

/// True when `plan` is a copy this controller has already written over: the cache has not caught up
/// with our own last write, and acting on it would redo work and end in a 409.
fn superseded(ctx: &Context, plan: &DisruptionPlan) -> bool {
    let (Some(rv), Ok(superseded)) = (plan.resource_version(), ctx.superseded.lock()) else {
        return false;
    };
    superseded
        .get(&plan.name_any())
        .is_some_and(|kept| kept.contains(&rv))
}

/// Reconciles one plan.
pub async fn reconcile(
    plan: Arc<DisruptionPlan>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if superseded(&ctx, &plan) {
        return Ok(Action::requeue(Duration::from_millis(50)));
    }
    let status = plan.status.clone().unwrap_or_default();
    if status.phase.is_terminal() {
        // Nothing left to undo: a finished plan can be deleted at once.
        set_finalizer(&plan, &ctx, false, plan.resource_version()).await?;
        return Ok(Action::await_change());
    }
    let mut finalized = None;
    if plan.meta().deletion_timestamp.is_none() {
        // Deleting a plan mid-way must not leave a node cordoned: the finalizer gives the controller
        // the chance to roll back first (the deletion then aborts the plan).
        finalized = set_finalizer(&plan, &ctx, true, plan.resource_version()).await?;
    }
    let valid = match validate(&plan.spec) {
        Ok(v) => v,
        Err(problems) => {
            let message = problems_message(&problems);
            return mark_invalid(
                Pass::after(plan, ValidSpec::default(), finalized, &ctx),
                &ctx,
                "InvalidSpec",
                message,
            )
            .await;
        }
    };
    // Judged by the policy while nothing is touched yet; once decided, spec.replacement is immutable
    // and the launch is judged again right before it. The backup and drain settings stay editable, so
    // they are judged on every pass (a terminal plan returned above).
    {
        let Some(policy) = ctx.policy.get() else {
            // The policy follower has not read the cluster's policy yet (at most FIRST_POLICY_WAIT).
            return Ok(Action::requeue(Duration::from_millis(200)));
        };
        let (problems, untouched) = if status.phase == PlanPhase::Pending {
            let caches = ctx.synced_caches().await?;
            let selected = match &plan.spec.node_selector {
                Some(sel) if plan.spec.nodes.is_empty() => {
                    steps::inventory::select_nodes(caches, sel)?
                }
                _ => plan.spec.nodes.clone(),
            };
            let mut problems = launch_policy::check_plan(&plan.spec, &policy, selected.len());
            let own = steps::inventory::controller_pods_on(caches, &ctx.settings, &selected);
            problems.extend(launch_policy::check_controller_pods(&plan.spec, &own));
            (problems, true)
        } else {
            (
                launch_policy::check_settings(&plan.spec, &policy.plan_settings),
                false,
            )
        };
        if !problems.is_empty() && untouched {
            let message = format!(
                "{} (no node was cordoned, backed up, drained or terminated)",
                launch_policy::refusal_message(&problems)
            );
            return mark_invalid(
                Pass::after(plan, valid, finalized, &ctx),
                &ctx,
                "RefusedByPolicy",
                message,
            )
            .await;
        }
        if !problems.is_empty() {
            // Refused mid-plan: fail through the phase machine's rollback (the cordon undone, holds
            // restored), not where it stands, which could leave its nodes cordoned for good.
            let message = format!(
                "{} (set while the plan was {}; the plan failed and rolled back)",
                launch_policy::refusal_message(&problems),
                status.phase
            );
            let mut pass = Pass::after(plan, valid, finalized, &ctx);
            let now = ctx.clock.now();
            pass.set_condition(
                condition::VALID,
                false,
                "RefusedByPolicy",
                message.clone(),
                now,
            );
            let note = Note {
                what: What::InvalidSpec,
                text: message.clone(),
            };
            return match move_on(&mut pass, &ctx, failed(message), vec![note], false, now).await? {
                Then::Done(action) => Ok(action),
                Then::Again => Ok(Action::await_change()),
            };
        }
    }
    let name = plan.name_any();
    let mut pass = Pass::after(plan, valid, finalized, &ctx);
    let span = tracing::info_span!("plan", plan = %name);
    let result = drive(&mut pass, &ctx).instrument(span).await;
    // Only a pass that succeeded resets the error policy's count: consecutive failures back off longer.
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&name);
    }
    result
}

/// An invalid spec is recorded once and waits for a change (no hot loop).
async fn mark_invalid(
    mut pass: Pass,
    ctx: &Context,
    reason: &str,
    message: String,
) -> Result<Action, ControllerError> {
    let already = pass
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::VALID && c.status == "False" && c.message == message)
        && pass.status.observed_generation == pass.plan.metadata.generation;
    if already {
        return Ok(Action::await_change());
    }
    let now = ctx.clock.now();
    pass.set_condition(condition::VALID, false, reason, message.clone(), now);
    pass.status.phase = PlanPhase::Failed;
    pass.status.message = Some(if message.starts_with("invalid spec") {
        message.clone()
    } else {
        format!("invalid spec: {message}")
    });
    let note = Note {
        what: What::InvalidSpec,
        text: message,
    };
    pass.write_and_publish(ctx, vec![note]).await?;
    Ok(Action::await_change())
}

/// What the driver does with a step's answer.
enum Then {
    /// Call the step again at once (a checkpoint was written, or a wait fired).
    Again,
    /// End the pass.
    Done(Action),
}

async fn drive(pass: &mut Pass, ctx: &Context) -> Result<Action, ControllerError> {
    if pass.status.decided_at.is_none() {
        let now = ctx.clock.now();
        pass.status.decided_at = Some(Time(now));
        pass.set_condition(condition::VALID, true, "Valid", "spec is valid".into(), now);
    }
    for _ in 0..MAX_CALLS {
        match call(pass, ctx).await? {
            Then::Again => continue,
            Then::Done(action) => return Ok(action),
        }
    }
    pass.write(ctx).await?;
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// One step call: run the phase's step, write, announce, decide, and wait when asked.
async fn call(pass: &mut Pass, ctx: &Context) -> Result<Then, ControllerError> {
    let now = ctx.clock.now();
    let phase = pass.status.phase;
    let facts = PhaseFacts::of(&pass.plan, &pass.valid, &pass.status, now);
    let (next, notes) = run_step(pass, ctx, phase, now, facts.abort_requested).await;
    let (decision, next) = match next {
        Next::Checkpoint => {
            pass.write_and_publish(ctx, notes).await?;
            return Ok(Then::Again);
        }
        // No retry fixes RBAC, a missing Secret or a refused EC2 request: fail with the message.
        Next::Retry(e) if e.is_permanent() => (
            failed(format!("{} failed: {e}", phase.as_str())),
            Next::Decide,
        ),
        // Past the deadline the phase machine decides, whatever the step's error.
        Next::Retry(e) if facts.deadline_passed => {
            tracing::warn!(error = %e, "step failed after the deadline");
            (pass.decide(phase, now), Next::Decide)
        }
        Next::Retry(e) => {
            pass.record_retrying(phase, &e, now);
            // Best effort: the error itself is what the pass returns.
            if let Err(w) = pass.write_and_publish(ctx, notes).await {
                tracing::debug!(error = %w, "could not record the retried error");
            }
            return Err(e);
        }
        Next::Fail(why) => (failed(why), Next::Decide),
        next => (pass.decide(phase, now), next),
    };
    pass.clear_retrying(now);
    if decision.phase != phase {
        return move_on(pass, ctx, decision, notes, facts.deadline_passed, now).await;
    }
    stay(pass, ctx, next, notes, now).await
}

/// Runs the phase's step over the plan as this pass knows it (nothing when a stop was asked for: the
/// phase machine aborts). The step's status becomes the pass's.
async fn run_step(
    pass: &mut Pass,
    ctx: &Context,
    phase: PlanPhase,
    now: Timestamp,
    abort: bool,
) -> (Next, Vec<Note>) {
    if abort {
        return (Next::Decide, Vec::new());
    }
    let result = match ctx.synced_caches().await {
        Ok(caches) => steps::run(phase, &pass.view(now), &ctx.io(caches)).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(Outcome {
            status,
            next,
            notes,
        }) => {
            pass.status = status;
            (next, notes)
        }
        Err(e) => (Next::Retry(e), Vec::new()),
    }
}

fn failed(message: String) -> PhaseDecision {
    PhaseDecision {
        phase: PlanPhase::Failed,
        rollback: true,
        message: Some(message),
    }
}

/// Leaves the phase: roll back when decided, write the new phase, then announce the step's notes and the
/// change. A terminal plan gives up its finalizer.
async fn move_on(
    pass: &mut Pass,
    ctx: &Context,
    decision: PhaseDecision,
    mut notes: Vec<Note>,
    deadline_passed: bool,
    now: Timestamp,
) -> Result<Then, ControllerError> {
    let from = pass.status.phase;
    if deadline_passed && decision.phase == PlanPhase::Failed {
        notes.push(Note {
            what: What::DeadlineMissed,
            text: format!(
                "spec.deadline passed in {}: {}",
                from.as_str(),
                decision.message.clone().unwrap_or_default()
            ),
        });
    }
    notes.extend(pass.transition(ctx, decision, now).await);
    pass.write(ctx).await?;
    let to = pass.status.phase;
    tracing::info!(from = %from, to = %to, detail = pass.status.message.as_deref().unwrap_or(""), "plan phase changed");
    ctx.report.publish(&pass.about(), notes);
    if to.is_terminal() {
        set_finalizer(&pass.plan, ctx, false, pass.resource_version.clone()).await?;
        return Ok(Then::Done(Action::await_change()));
    }
    Ok(Then::Again)
}

/// Stays in the phase: show the deadline, announce, wait as the step asked, and write before the pass
/// ends. News is written (and then announced) at once; progress without news (evictions counted, a
/// message) rides along in memory while the pass goes on, as it did before a pass was split into calls,
/// and is written before the pass ends. Intents never wait: a step writes them with a checkpoint.
async fn stay(
    pass: &mut Pass,
    ctx: &Context,
    next: Next,
    notes: Vec<Note>,
    now: Timestamp,
) -> Result<Then, ControllerError> {
    // A deadline is shown while it runs, and the plan is looked at again no later than it.
    let left = pass
        .plan
        .spec
        .deadline
        .as_ref()
        .map(|d| d.0.duration_since(now).unsigned_abs());
    if let Some(left) = left {
        let base = pass.status.message.clone().unwrap_or_default();
        let base = base
            .split(" (deadline in ")
            .next()
            .unwrap_or_default()
            .to_owned();
        pass.status.message = Some(format!("{base} (deadline in {}s)", left.as_secs()));
    }
    if !notes.is_empty() {
        pass.write_and_publish(ctx, notes).await?;
    }
    let by_deadline = |d: Duration| match left {
        Some(left) => d.min(left + Duration::from_millis(100)),
        None => d,
    };
    let (wake, recheck) = match next {
        Next::Wait { wake, recheck } => (wake, recheck),
        _ => (Wake::Never, IDLE),
    };
    if wake
        .wait(
            &ctx.caches,
            by_deadline(recheck.min(ctx.settings.wait_slice)),
        )
        .await
    {
        return Ok(Then::Again);
    }
    pass.write(ctx).await?;
    let requeue = if wake == Wake::Never {
        recheck
    } else {
        recheck.min(POLL)
    };
    Ok(Then::Done(Action::requeue(by_deadline(requeue))))
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
    let delay = retry_delay(attempts, stale);
    if matches!(error, ControllerError::NotLeading) {
        tracing::debug!(plan = %name, "pass cancelled: no longer leading");
    } else if stale {
        tracing::debug!(plan = %name, retry_in = ?delay, "plan changed since this pass read it; retrying on a fresh copy");
    } else {
        tracing::warn!(plan = %name, error = %error, retry_in = ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

/// The wait before a failed plan is looked at again: 1 s after the first failure, doubling with each
/// consecutive one up to 64 s; a stale copy only waits for the cache (50 ms).
fn retry_delay(consecutive_failures: u32, stale: bool) -> Duration {
    if stale {
        return Duration::from_millis(50);
    }
    Duration::from_millis(500u64.saturating_mul(1 << consecutive_failures.clamp(1, 7)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_failures_back_off_longer_and_a_stale_copy_does_not() {
        let waits: Vec<u64> = (1..=9).map(|n| retry_delay(n, false).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(retry_delay(5, true), Duration::from_millis(50));
    }
}

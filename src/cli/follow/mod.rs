//! Following a DisruptionPlan live (`snapdrain drain`): the plan, its Velero Backups and their
//! PodVolumeBackups by watch (never by polling), each change told once ([`events`]) as a line, a JSON
//! line or a progress bar ([`output`], [`bars`]); Ctrl-C asks what to do ([`interrupt`]); the ending is
//! an exit code ([`exit`]).

pub mod bars;
pub mod events;
pub mod exit;
pub mod interrupt;
pub mod output;

use std::pin::pin;
use std::time::Duration;

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use events::Tracker;
use exit::Outcome;
use interrupt::Choice;
use output::Output;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::velero::Backup;

pub struct FollowOptions {
    pub plan: String,
    /// Where the plan's Velero Backups live (`spec.backup.veleroNamespace`).
    pub velero_namespace: String,
    /// Give up following after this long (the plan keeps running).
    pub wait_timeout: Option<Duration>,
    /// stdin is a terminal: Ctrl-C asks instead of leaving the plan running.
    pub interactive: bool,
    /// `snapdrain` or `kubectl snapdrain`, for the hints.
    pub program: String,
}

/// A watch that may be refused (no Velero CRDs, no RBAC on them): it is given up on when its first
/// answer is an error, and otherwise left to the watcher's backoff.
struct Optional<S> {
    stream: Option<S>,
    answered: bool,
}

impl<S> Optional<S> {
    fn new(stream: S) -> Self {
        Self {
            stream: Some(stream),
            answered: false,
        }
    }

    /// Records an answer; returns false when the stream has just been given up.
    fn answered<T, E>(&mut self, item: &Option<Result<T, E>>) -> bool {
        match item {
            Some(Ok(_)) => {
                self.answered = true;
                true
            }
            Some(Err(_)) if self.answered => true,
            _ => {
                self.stream = None;
                false
            }
        }
    }
}

async fn next_of<S: Stream + Unpin>(s: &mut Option<S>) -> Option<S::Item> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

fn pvb_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("velero.io", "v1", "PodVolumeBackup");
    ApiResource::from_gvk_with_plural(&gvk, "podvolumebackups")
}

/// How following ended, with the plan as last seen.
pub struct Followed {
    pub outcome: Outcome,
    pub last: Option<Box<DisruptionPlan>>,
}

/// Follows the plan until it is terminal, the wait times out, or Ctrl-C says to leave it.
pub async fn follow(
    client: &Client,
    opts: &FollowOptions,
    out: &mut Output,
) -> anyhow::Result<Followed> {
    let mut last: Option<Box<DisruptionPlan>> = None;
    let outcome = follow_until(client, opts, out, &mut last).await?;
    Ok(Followed { outcome, last })
}

async fn follow_until(
    client: &Client,
    opts: &FollowOptions,
    out: &mut Output,
    last: &mut Option<Box<DisruptionPlan>>,
) -> anyhow::Result<Outcome> {
    let name = opts.plan.as_str();
    let plans: Api<DisruptionPlan> = Api::all(client.clone());
    let plan_events = watcher(
        plans,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff();
    let mut plan_events = pin!(plan_events);
    let backups: Api<Backup> = Api::namespaced(client.clone(), &opts.velero_namespace);
    let backup_events = watcher(
        backups,
        watcher::Config::default().labels(&format!("snapdrain.io/plan={name}")),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let mut backup_events = Optional::new(backup_events);
    let pvbs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &opts.velero_namespace, &pvb_resource());
    let pvb_events = watcher(
        pvbs,
        watcher::Config::default().labels("velero.io/backup-name"),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let mut pvb_events = Optional::new(pvb_events);

    let mut tracker = Tracker::default();
    let mut deadline: Option<jiff::Timestamp> = None;
    let give_up = opts.wait_timeout.map(|d| tokio::time::Instant::now() + d);
    let mut abort_sent = false;
    let mut watch_error_told = false;
    // One listener for the whole follow: a SIGINT that arrives while a branch below runs is kept for
    // the next turn (a `ctrl_c()` made anew each turn misses it, and the process, its default handler
    // replaced, would then not stop).
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot listen for Ctrl-C")?;
    loop {
        let timeout = async {
            match give_up {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = plan_events.next() => {
                let plan = match ev {
                    Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => p,
                    Some(Ok(watcher::Event::Delete(_))) => {
                        out.note("deleted", &format!("plan {name} was deleted (a deletion aborts a plan and rolls it back)"))?;
                        return Ok(Outcome::Aborted);
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        // The watcher resumes by itself with backoff; one line says so.
                        if !watch_error_told {
                            watch_error_told = true;
                            out.note("watchError", &format!("watch of plan {name} interrupted ({e}); resuming"))?;
                        }
                        continue;
                    }
                    None => anyhow::bail!("the watch of plan {name} ended unexpectedly"),
                };
                watch_error_told = false;
                if plan.name_any() != name {
                    continue;
                }
                if deadline.is_none() {
                    deadline = plan.spec.deadline.as_ref().map(|t| t.0);
                    for u in tracker.deadline(deadline.map(|d| d.to_string())) {
                        out.update(&u)?;
                    }
                }
                let status = plan.status.clone().unwrap_or_default();
                for u in tracker.plan(&status) {
                    out.update(&u)?;
                }
                out.status(header(name, status.phase.as_str(), deadline));
                *last = Some(Box::new(plan));
                if let Some(outcome) = Outcome::of_phase(status.phase) {
                    return Ok(outcome);
                }
            }
            item = next_of(&mut backup_events.stream) => {
                if !backup_events.answered(&item) {
                    continue;
                }
                if let Some(Ok(b)) = item {
                    let status = b.status.as_ref();
                    for u in tracker.backup(&b.name_any(), status.and_then(|s| s.phase.as_deref()), status.and_then(|s| s.progress)) {
                        out.update(&u)?;
                    }
                }
            }
            item = next_of(&mut pvb_events.stream) => {
                if !pvb_events.answered(&item) {
                    continue;
                }
                if let Some(Ok(pvb)) = item {
                    let backup = pvb.labels().get("velero.io/backup-name").cloned().unwrap_or_default();
                    if !tracker.knows_backup(&backup) {
                        continue;
                    }
                    let progress = &pvb.data["status"]["progress"];
                    let bytes = |k: &str| progress[k].as_u64().unwrap_or(0);
                    for u in tracker.volume(&pvb.name_any(), &backup, bytes("bytesDone"), bytes("totalBytes")) {
                        out.update(&u)?;
                    }
                }
            }
            () = timeout => {
                let phase = tracker.phase().map_or("unknown", |p| p.as_str());
                let waited = opts.wait_timeout.unwrap_or_default();
                out.note("timedOut", &format!(
                    "gave up waiting after {waited:?} (--wait-timeout) in step {phase}; {}",
                    interrupt::left_running_hint(&opts.program, name)
                ))?;
                return Ok(Outcome::TimedOut);
            }
            _ = interrupts.recv() => {
                if abort_sent {
                    out.note("interrupted", &format!("interrupted while the abort rolls back; {}", interrupt::left_running_hint(&opts.program, name)))?;
                    return Ok(Outcome::Interrupted);
                }
                let choice = if opts.interactive { ask(out, name, &mut interrupts).await? } else { Choice::Leave };
                match choice {
                    Choice::Leave => {
                        out.note("interrupted", &format!("interrupted; {}", interrupt::left_running_hint(&opts.program, name)))?;
                        return Ok(Outcome::Interrupted);
                    }
                    Choice::Continue => out.note("continue", "continuing to follow")?,
                    Choice::Abort => {
                        crate::cli::abort::request_abort(client, name).await?;
                        abort_sent = true;
                        out.json(json!({"event": "abortRequested", "message": format!("abort requested (annotation snapdrain.io/abort=true); following the rollback of {name}")}))?;
                    }
                }
            }
        }
    }
}

/// Asks what Ctrl-C should do; a second Ctrl-C or the end of input leaves the plan running.
async fn ask(
    out: &mut Output,
    plan: &str,
    interrupts: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<Choice> {
    out.prompt(&interrupt::prompt(plan))?;
    // The read blocks a thread of its own; if a second Ctrl-C wins, the process exits soon after, and
    // `main` ends it without waiting for that thread.
    let read = tokio::task::spawn_blocking(|| {
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer).map(|_| answer)
    });
    let choice = tokio::select! {
        r = read => match r {
            Ok(Ok(answer)) => interrupt::parse_choice(&answer),
            _ => Choice::Leave,
        },
        _ = interrupts.recv() => Choice::Leave,
    };
    out.resume();
    Ok(choice)
}

/// The bars' header: the plan, its step, and the time left to the deadline.
fn header(plan: &str, phase: &str, deadline: Option<jiff::Timestamp>) -> String {
    let mut h = format!("plan {plan}: {phase}");
    if let Some(d) = deadline {
        let left = d.duration_since(jiff::Timestamp::now());
        if left.is_negative() {
            h.push_str(&format!(" · deadline {d} passed"));
        } else {
            h.push_str(&format!(" · deadline in {}s", left.as_secs()));
        }
    }
    h
}

/// Tells a finished plan: its last message, and where to look next.
pub fn tell_ending(
    out: &mut Output,
    program: &str,
    plan: &str,
    outcome: Outcome,
    last: Option<&DisruptionPlan>,
) -> std::io::Result<()> {
    out.finish();
    let status = last.and_then(|p| p.status.as_ref());
    let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
    let elapsed = out.elapsed().as_secs_f64();
    let text = match outcome {
        Outcome::Completed => format!("plan {plan} Completed in {elapsed:.1}s"),
        Outcome::Failed => format!(
            "plan {plan} FAILED after {elapsed:.1}s: {message}. See `{program} status {plan}` and `{program} report {plan}`"
        ),
        Outcome::Aborted => format!("plan {plan} Aborted after {elapsed:.1}s: {message}"),
        _ => return Ok(()),
    };
    out.json(json!({
        "event": "finished",
        "outcome": outcome.as_str(),
        "exitCode": outcome.exit_code(),
        "phase": status.map(|s| s.phase),
        "message": text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_counts_down_to_the_deadline() {
        let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(90);
        let h = header("p1", "Draining", Some(soon));
        assert!(h.starts_with("plan p1: Draining · deadline in 8"), "{h}");
        let past = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(5);
        assert!(header("p1", "Draining", Some(past)).ends_with("passed"));
        assert_eq!(header("p1", "Pending", None), "plan p1: Pending");
    }
}

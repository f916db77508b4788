//! `snapdrain abort PLAN`: sets `snapdrain.io/abort: "true"` on the plan; the controller stops it and
//! rolls back (uncordons what it cordoned, restores holds). `--wait` follows it to Aborted.

use anyhow::{Context as _, bail};
use clap::Args;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::cluster::ClusterArgs;
use snapdrain::api::ABORT_ANNOTATION;
use snapdrain::api::DisruptionPlan;

#[derive(Debug, Args)]
pub struct AbortArgs {
    /// The DisruptionPlan to stop.
    pub plan: String,
    /// Wait until the plan is Aborted (its rollback done), or finished otherwise.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Sets the abort annotation (a merge patch: other annotations stay).
pub async fn request_abort(client: &kube::Client, plan: &str) -> anyhow::Result<()> {
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    api.patch(
        plan,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ABORT_ANNOTATION: "true"}}})),
    )
    .await
    .with_context(|| format!("cannot set {ABORT_ANNOTATION} on plan {plan}"))?;
    Ok(())
}

pub async fn run(args: AbortArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    let plan = api
        .get_opt(&args.plan)
        .await
        .with_context(|| format!("cannot read plan {}", args.plan))?
        .with_context(|| {
            format!(
                "plan {} not found; list plans with `{} status`",
                args.plan,
                super::invocation::program()
            )
        })?;
    let phase = plan.status.as_ref().map(|s| s.phase).unwrap_or_default();
    match phase {
        snapdrain::api::PlanPhase::Aborted => {
            println!("plan {} is already Aborted", args.plan);
            return Ok(());
        }
        p if p.is_terminal() => bail!(
            "plan {} already finished ({p}); there is nothing left to abort or roll back",
            args.plan
        ),
        _ => {}
    }
    request_abort(&client, &args.plan).await?;
    println!(
        "abort requested for plan {} (in {phase}); the controller stops it and rolls back",
        args.plan
    );
    if args.wait {
        let cond = |p: Option<&DisruptionPlan>| {
            p.is_none_or(|p| p.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
        };
        let done = kube::runtime::wait::await_condition(api, &args.plan, cond)
            .await
            .context("watch of the plan failed")?;
        println!("{}", outcome(&args.plan, done.as_ref()));
    }
    Ok(())
}

/// The line `--wait` ends with. `status.message` quotes what others wrote (pod names, API and AWS
/// errors): its control characters are escaped so that it cannot move the cursor or recolour the
/// terminal (security review L-7), as `snapdrain status` does.
fn outcome(plan: &str, done: Option<&DisruptionPlan>) -> String {
    match done.and_then(|p| p.status.as_ref()) {
        Some(s) => super::terminal::escape_controls(&format!(
            "plan {plan} {}: {}",
            s.phase,
            s.message.as_deref().unwrap_or_default()
        ))
        .into_owned(),
        None => format!("plan {plan} is gone (deleted after its rollback)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_message_is_printed_with_its_control_characters_escaped() {
        let plan: DisruptionPlan = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p"}, "spec": {"nodes": ["n1"]},
            "status": {"phase": "Aborted", "message": "rolled back: pod \u{1b}[2J\u{1b}]0;pwned\u{7}x\r\u{9b}2J"}
        }))
        .expect("a plan");
        let line = outcome("p", Some(&plan));
        assert!(
            !line.chars().any(|c| c.is_control()),
            "no raw control character: {line:?}"
        );
        assert!(
            line.starts_with("plan p Aborted: rolled back: pod "),
            "{line}"
        );
        assert_eq!(
            outcome("p", None),
            "plan p is gone (deleted after its rollback)"
        );
    }
}

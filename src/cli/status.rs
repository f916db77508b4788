//! `snapdrain status [PLAN]`: the plans as a table, or one plan in detail (step, message, deadline,
//! nodes with evictions and blocks, backups with their bucket objects, time per step, conditions);
//! `-o json|yaml` prints the objects themselves, as kubectl does.

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kube::api::Api;
use kube::{Resource as _, ResourceExt};

use super::cluster::ClusterArgs;
use super::follow::events::human_bytes;
use super::terminal::json_safe;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::lenient::{Lenient, each_page};
use snapdrain::api::status::PlanPhase;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A plan to show in detail (default: a table of all plans).
    pub plan: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: StatusFormat,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

fn age(meta: &ObjectMeta, now: jiff::Timestamp) -> String {
    let Some(created) = meta.creation_timestamp.as_ref() else {
        return "-".into();
    };
    let secs = now.duration_since(created.0).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The table of plans (kubectl-like columns, newest last). A plan snapdrain cannot decode (security
/// review H-1: e.g. nested deeper than the decoder's limit) is a row that says so instead of failing
/// the whole list.
pub fn table(plans: &[Lenient<DisruptionPlan>], now: jiff::Timestamp) -> String {
    let rows: Vec<[String; 6]> = plans
        .iter()
        .map(|p| {
            let p = match p {
                Lenient::Decoded(p) => p,
                Lenient::Undecodable(u) => {
                    let name = u.metadata.name.clone().unwrap_or_else(|| "?".into());
                    return [
                        name.clone(),
                        "Unreadable".into(),
                        "-".into(),
                        "-".into(),
                        age(&u.metadata, now),
                        format!(
                            "snapdrain cannot decode this plan ({}); read it with `kubectl get disruptionplan {name} -o yaml` and delete or fix it",
                            u.error
                        ),
                    ];
                }
            };
            let s = p.status.clone().unwrap_or_default();
            let summary = s.summary.clone().unwrap_or_default();
            let nodes = if p.spec.nodes.is_empty() {
                "(selector)".to_string()
            } else {
                p.spec.nodes.join(",")
            };
            [
                p.name_any(),
                s.phase.to_string(),
                format!("{nodes} {}", summary.nodes).trim().to_string(),
                if summary.backups.is_empty() {
                    "-".into()
                } else {
                    summary.backups
                },
                age(&p.metadata, now),
                s.message.unwrap_or_default(),
            ]
        })
        .collect();
    let header = ["NAME", "PHASE", "NODES", "BACKUPS", "AGE", "MESSAGE"];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 6]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}   ", w = widths[i]);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    out
}

/// One plan in detail.
pub fn detail(plan: &DisruptionPlan) -> String {
    let s = plan.status.clone().unwrap_or_default();
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(o, "Plan:     {}", plan.name_any());
    let _ = writeln!(o, "Phase:    {}", s.phase);
    if let Some(m) = &s.message {
        let _ = writeln!(o, "Message:  {m}");
    }
    let _ = writeln!(
        o,
        "Spec:     {:?} mode, backup {:?} ({:?}), source {:?}{}",
        plan.spec.mode,
        plan.spec.backup.policy,
        plan.spec.backup.method,
        plan.spec.source,
        if plan.spec.dry_run { ", dry run" } else { "" }
    );
    if let Some(r) = &plan.spec.reason {
        let _ = writeln!(o, "Reason:   {r}");
    }
    if let Some(d) = &plan.spec.deadline {
        let _ = writeln!(o, "Deadline: {}", d.0);
    }
    let _ = writeln!(o, "Nodes:");
    if s.nodes.is_empty() {
        let _ = writeln!(o, "  (not resolved yet) {}", plan.spec.nodes.join(", "));
    }
    for n in &s.nodes {
        let _ = writeln!(
            o,
            "  {}  {:?}  {}/{} pods evicted{}{}",
            n.name,
            n.phase,
            n.pods_evicted,
            n.pods_total,
            n.instance_id
                .as_deref()
                .map(|i| format!("  instance {i}"))
                .unwrap_or_default(),
            if n.cordoned_by_snapdrain {
                "  cordoned by snapdrain"
            } else {
                ""
            }
        );
        if let Some(b) = &n.blocked_by {
            let _ = writeln!(o, "    blocked ({}): {b}", n.pods_blocked);
        }
        if let Some(r) = &n.replacement {
            let _ = writeln!(
                o,
                "    replacement: instances {} node {} {}",
                r.instance_ids.join(","),
                r.node_name.as_deref().unwrap_or("-"),
                if r.ready { "Ready" } else { "not Ready yet" }
            );
        }
    }
    let _ = writeln!(o, "Backups:");
    if s.backups.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for b in &s.backups {
        let queued = b
            .queue_position
            .map(|p| format!(" (position {p} in Velero's queue)"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  {}  namespace {}  attempt {}  phase {}{queued}  {}{}",
            b.name,
            b.namespace,
            b.attempt,
            b.phase.as_deref().unwrap_or("-"),
            if b.verified {
                "verified"
            } else {
                "not verified"
            },
            if b.reused { "  (reused)" } else { "" }
        );
        let _ = writeln!(o, "    PVCs: {}", b.pvcs.join(", "));
        if let Some(h) = b.hooks.filter(|h| h.hooks_attempted > 0) {
            let _ = writeln!(
                o,
                "    backup hooks: {} run, {} failed",
                h.hooks_attempted, h.hooks_failed
            );
        }
        if !b.policy_hooks.is_empty() {
            let _ = writeln!(o, "    policy backup hooks: {}", b.policy_hooks.join(", "));
        }
        for v in &b.volumes {
            let cut = v
                .snapshot
                .as_ref()
                .map(|c| {
                    format!(
                        "; snapshot {} cut{}",
                        c.handle,
                        if c.ready { ", ready" } else { "" }
                    )
                })
                .unwrap_or_default();
            let release = match v.release_at {
                snapdrain::api::plan::ReleasePoint::Snapshot => "released at the snapshot",
                snapdrain::api::plan::ReleasePoint::Verified => "released once verified",
            };
            let _ = writeln!(
                o,
                "    {}: {:?}, {:?}, {release}{cut}",
                v.pvc, v.class, v.method
            );
        }
        for obj in &b.verified_objects {
            let _ = writeln!(o, "    {}  {}", obj.key, human_bytes(obj.size));
        }
        if let Some(e) = b.verification_error.as_ref().or(b.message.as_ref()) {
            let _ = writeln!(o, "    {e}");
        }
    }
    if !s.step_timings.is_empty() {
        let _ = writeln!(o, "Time per step:");
        for phase in PlanPhase::ALL {
            if let Some(secs) = s.step_timings.get(phase.as_str()) {
                let _ = writeln!(o, "  {:<12} {secs:.2}s", phase.as_str());
            }
        }
    }
    if !s.conditions.is_empty() {
        let _ = writeln!(o, "Conditions:");
        for c in &s.conditions {
            let _ = writeln!(
                o,
                "  {}={} ({}): {}",
                c.type_, c.status, c.reason, c.message
            );
        }
    }
    o
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let api: Api<DisruptionPlan> = Api::all(client);
    let program = super::invocation::program();
    match &args.plan {
        Some(name) => {
            let plan = api
                .get_opt(name)
                .await
                .with_context(|| format!("cannot read plan {name}"))?
                .with_context(|| {
                    format!("plan {name} not found; list plans with `{program} status`")
                })?;
            match args.output {
                StatusFormat::Text => {
                    print!("{}", super::terminal::escape_controls(&detail(&plan)))
                }
                StatusFormat::Json => {
                    println!("{}", json_safe(serde_json::to_string_pretty(&plan)?))
                }
                StatusFormat::Yaml => print!("{}", serde_saphyr::to_string(&plan)?),
            }
        }
        None => {
            // Each plan decoded on its own: one that cannot be read is shown as such, not a failed list.
            let lenient: Api<Lenient<DisruptionPlan>> = Api::all(api.into_client());
            let mut plans = each_page(&lenient, Some)
                .await
                .context("cannot list DisruptionPlans (is the CRD installed?)")?;
            plans.sort_by_key(|p| p.meta().creation_timestamp.clone().map(|t| t.0));
            let items: Vec<serde_json::Value> = plans
                .iter()
                .map(|p| match p {
                    Lenient::Decoded(p) => serde_json::to_value(p).unwrap_or_default(),
                    Lenient::Undecodable(u) => serde_json::json!({
                        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
                        "metadata": {"name": u.metadata.name, "creationTimestamp": u.metadata.creation_timestamp},
                        "undecodable": u.error,
                    }),
                })
                .collect();
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
            match args.output {
                StatusFormat::Text if plans.is_empty() => println!("No DisruptionPlans."),
                StatusFormat::Text => print!(
                    "{}",
                    super::terminal::escape_controls(&table(&plans, jiff::Timestamp::now()))
                ),
                StatusFormat::Json => {
                    println!("{}", json_safe(serde_json::to_string_pretty(&list)?))
                }
                StatusFormat::Yaml => print!("{}", serde_saphyr::to_string(&list)?),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdrain::api::status::{BackupRecord, DisruptionPlanStatus, NodeProgress, StatusSummary};

    fn plan() -> DisruptionPlan {
        let mut p: DisruptionPlan = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "drain-n1-abcde", "creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"nodes": ["n1"]}
        }))
        .expect("plan");
        let mut s = DisruptionPlanStatus {
            phase: PlanPhase::Draining,
            message: Some("eviction blocked: shop/pg-0: PDB".into()),
            nodes: vec![NodeProgress {
                name: "n1".into(),
                pods_total: 4,
                pods_evicted: 3,
                pods_blocked: 1,
                blocked_by: Some("shop/pg-0: PDB".into()),
                ..Default::default()
            }],
            backups: vec![BackupRecord {
                name: "b1".into(),
                namespace: "shop".into(),
                attempt: 1,
                verified: true,
                pvcs: vec!["data-pg-0".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        s.summary = Some(StatusSummary::of(&s));
        p.status = Some(s);
        p
    }

    #[test]
    fn the_table_aligns_columns_and_shows_the_summary() {
        let now: jiff::Timestamp = "2030-01-01T00:05:00Z".parse().expect("time");
        let t = table(&[Lenient::Decoded(plan())], now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{t}");
        assert!(lines[1].starts_with("drain-n1-abcde"), "{t}");
        assert!(lines[1].contains("Draining") && lines[1].contains("n1 0/1 drained"));
        assert!(
            lines[1].contains("1/1 verified") && lines[1].contains("5m"),
            "{t}"
        );
        assert_eq!(
            lines[0].find("PHASE"),
            lines[1].find("Draining"),
            "columns align:\n{t}"
        );
    }

    #[test]
    fn the_detail_names_blocked_pods_and_backups() {
        let d = detail(&plan());
        assert!(d.contains("Phase:    Draining"), "{d}");
        assert!(d.contains("3/4 pods evicted"), "{d}");
        assert!(d.contains("blocked (1): shop/pg-0: PDB"), "{d}");
        assert!(d.contains("b1  namespace shop  attempt 1"), "{d}");
    }

    #[test]
    fn the_detail_shows_a_queued_backup_and_each_volumes_release_point() {
        let mut p = plan();
        let s = p.status.as_mut().expect("status");
        let b = &mut s.backups[0];
        b.verified = false;
        b.phase = Some("Queued".into());
        b.queue_position = Some(2);
        b.volumes = serde_json::from_value(serde_json::json!([
            {"pvc": "data-pg-0", "class": "Network", "reason": "", "method": "CsiDataMover",
             "releaseAt": "Snapshot", "snapshot": {"volumeSnapshot": "vs", "content": "vsc",
             "handle": "snap-0abc", "ready": false}},
            {"pvc": "scratch-pg-0", "class": "NodeLocal", "reason": "", "method": "FileSystem"}
        ]))
        .expect("volumes");
        let d = detail(&p);
        assert!(
            d.contains("phase Queued (position 2 in Velero's queue)"),
            "{d}"
        );
        assert!(
            d.contains(
                "data-pg-0: Network, CsiDataMover, released at the snapshot; snapshot snap-0abc cut"
            ),
            "{d}"
        );
        assert!(
            d.contains("scratch-pg-0: NodeLocal, FileSystem, released once verified"),
            "{d}"
        );
    }

    /// A plan nested past serde_json's depth limit (security review H-1) is a row saying it cannot be
    /// read, and every other plan is still listed. Decoded strictly (as before) the whole list fails.
    #[test]
    fn an_undecodable_plan_is_a_row_that_says_so() {
        let mut deep = serde_json::json!("leaf");
        for _ in 0..200 {
            deep = serde_json::json!({"a": deep});
        }
        let deep_plan = serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "deep", "creationTimestamp": "2030-01-01T00:01:00Z"},
            "spec": {"nodes": ["n2"], "replacement": {"when": "after-drain", "instanceTypes": ["m6i.large"],
                "bottlerocket": {"settings": {"motd": deep}}}}
        });
        let list = serde_json::json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlanList",
            "metadata": {}, "items": [serde_json::to_value(plan()).expect("JSON"), deep_plan]});
        let text = serde_json::to_string(&list).expect("JSON");
        assert!(
            serde_json::from_str::<kube::core::ObjectList<DisruptionPlan>>(&text).is_err(),
            "strict decoding fails the whole list"
        );
        let lenient: kube::core::ObjectList<Lenient<DisruptionPlan>> =
            serde_json::from_str(&text).expect("the lenient list decodes");
        let now: jiff::Timestamp = "2030-01-01T00:05:00Z".parse().expect("time");
        let t = table(&lenient.items, now);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[1].starts_with("drain-n1-abcde"), "{t}");
        assert!(lines[2].starts_with("deep"), "{t}");
        assert!(lines[2].contains("Unreadable"), "{t}");
        assert!(
            lines[2].contains("snapdrain cannot decode this plan (recursion limit exceeded"),
            "{t}"
        );
    }
}

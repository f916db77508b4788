//! `snapdrain drain NODE... | --selector LABELS`: a manual pre-drain run. Creates a DisruptionPlan from
//! kubectl-drain-like flags and follows it live ([`super::follow`]) until it Completed, Failed or was
//! Aborted, exiting with a code for each ([`super::follow::exit`]).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::cluster::ClusterArgs;
use super::follow::exit::{EXIT_CODES_HELP, Outcome};
use super::follow::output::{Format, Output};
use super::follow::{FollowOptions, follow, tell_ending};
use super::selector::{parse_selector, selector_string};
use snapdrain::api::{
    BackupMethod, BackupPolicy, BottlerocketSpec, CapacityType, DisruptionPlan, DisruptionPlanSpec,
    LaunchTemplateRef, NodeClassRef, PlanMode, PlanSource, ReplacementSpec, ReplacementWhen,
    parse_duration, problems_message, validate,
};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// snapdrain cordons, evicts, terminates and replaces.
    Execute,
    /// snapdrain backs up, verifies and releases its holds; the autoscaler drains.
    Release,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackupPolicyArg {
    /// No drain without a verified backup.
    Required,
    /// Try; drain anyway if the backup fails.
    BestEffort,
    /// No backup.
    Skip,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackupMethodArg {
    /// Per volume: CSI snapshot for network volumes with a VolumeSnapshotClass, file system otherwise.
    Auto,
    FileSystem,
    CsiDataMover,
    Snapshot,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReplaceArg {
    /// Launch and wait for the new node before the drain ("make before break").
    BeforeDrain,
    /// Launch after the old node is gone.
    AfterDrain,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CapacityArg {
    OnDemand,
    Spot,
}

#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct DrainArgs {
    /// Nodes to back up and drain.
    #[arg(
        value_name = "NODE",
        required_unless_present = "selector",
        conflicts_with = "selector"
    )]
    pub nodes: Vec<String>,
    /// Select the nodes by label instead (kubectl syntax: pool=db,zone in (a,b),!spot).
    #[arg(short = 'l', long, value_name = "LABELS")]
    pub selector: Option<String>,
    /// Name of the DisruptionPlan (default: generated from the first node, e.g. drain-NODE-x7k2p).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Why the nodes go away, for people reading the plan.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Who carries out the drain once the backup is verified.
    #[arg(long, value_enum, default_value = "execute")]
    pub mode: ModeArg,

    /// Whether a verified backup is a precondition of the drain.
    #[arg(
        long = "backup",
        value_enum,
        default_value = "required",
        help_heading = "Backup"
    )]
    pub backup_policy: BackupPolicyArg,
    /// How Velero copies the volume data.
    #[arg(long, value_enum, default_value = "auto", help_heading = "Backup")]
    pub backup_method: BackupMethodArg,
    /// Velero BackupStorageLocation (default: the one Velero marks `default: true`).
    #[arg(long, value_name = "NAME", help_heading = "Backup")]
    pub backup_location: Option<String>,
    /// Namespace where Velero runs.
    #[arg(
        long,
        default_value = "velero",
        value_name = "NS",
        help_heading = "Backup"
    )]
    pub velero_namespace: String,
    /// Velero Backup TTL (Go duration, e.g. 168h).
    #[arg(long, value_name = "DURATION", help_heading = "Backup")]
    pub backup_ttl: Option<String>,
    /// Reuse a verified backup of the same PVCs started at most this long ago.
    #[arg(long, value_name = "DURATION", help_heading = "Backup")]
    pub reuse_backup_newer_than: Option<String>,
    /// How long one backup attempt may take, Velero's queue included.
    #[arg(long, value_name = "DURATION", help_heading = "Backup")]
    pub backup_timeout: Option<String>,
    /// Backup attempts per namespace before the plan fails (1-10).
    #[arg(long, value_name = "N", help_heading = "Backup")]
    pub backup_attempts: Option<u32>,

    /// How long the drain of one node may take before the plan fails and rolls back (as kubectl drain's
    /// --timeout; Go duration). Default: no limit.
    #[arg(long, value_name = "DURATION", help_heading = "Drain")]
    pub timeout: Option<String>,
    /// Grace period for each eviction, in seconds (default: each pod's own).
    #[arg(long, value_name = "SECONDS", help_heading = "Drain")]
    pub grace_period: Option<i64>,
    /// Evictions in flight at once, per node.
    #[arg(long, value_name = "N", help_heading = "Drain")]
    pub max_concurrent_evictions: Option<u32>,
    /// Evict DaemonSet pods too (last); by default they are left running (kubectl --ignore-daemonsets).
    #[arg(long, help_heading = "Drain")]
    pub evict_daemonsets: bool,
    /// Allow evicting pods with emptyDir volumes, losing that data.
    #[arg(long, help_heading = "Drain")]
    pub delete_emptydir_data: bool,
    /// Only evict pods matching this label selector.
    #[arg(long, value_name = "LABELS", help_heading = "Drain")]
    pub pod_selector: Option<String>,
    /// Evict pods no controller owns (they are not recreated) and pods with an active
    /// karpenter.sh/do-not-disrupt annotation (kubectl drain --force).
    #[arg(long, help_heading = "Drain")]
    pub force: bool,
    /// When the node goes away regardless: an RFC 3339 time or a duration from now (e.g. 10m).
    #[arg(long, value_name = "TIME|DURATION", help_heading = "Drain")]
    pub deadline: Option<String>,
    /// Keep the EC2 instance (do not terminate it or delete its NodeClaim).
    #[arg(long, help_heading = "Drain")]
    pub keep_instance: bool,
    /// Keep the Node object after the drain.
    #[arg(long, help_heading = "Drain")]
    pub keep_node: bool,

    /// Launch replacement capacity on EC2 (Execute mode).
    #[arg(long, value_enum, value_name = "WHEN", help_heading = "Replacement")]
    pub replace: Option<ReplaceArg>,
    /// Instance types, in order of preference (repeat or comma-separate).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "TYPE",
        help_heading = "Replacement"
    )]
    pub instance_type: Vec<String>,
    /// Karpenter EC2NodeClass to launch from (its AMI, instance profile, security groups, subnets and
    /// user data). Without it, or free-form flags the DisruptionPolicy allows, the replacement is
    /// launched as the replaced instance was.
    #[arg(long, value_name = "NAME", help_heading = "Replacement")]
    pub node_class: Option<String>,
    /// Bottlerocket AMI id (the DisruptionPolicy must allow it).
    #[arg(long, value_name = "AMI", help_heading = "Replacement")]
    pub image_id: Option<String>,
    /// Subnet ids (repeat or comma-separate).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SUBNET",
        help_heading = "Replacement"
    )]
    pub subnet: Vec<String>,
    /// EC2 launch template, by id (lt-...) or name.
    #[arg(long, value_name = "ID|NAME", help_heading = "Replacement")]
    pub launch_template: Option<String>,
    #[arg(long, value_enum, help_heading = "Replacement")]
    pub capacity_type: Option<CapacityArg>,
    /// Node label for the new node (repeat: k=v).
    #[arg(long, value_name = "K=V", help_heading = "Replacement")]
    pub node_label: Vec<String>,
    /// Node taint for the new node (repeat: key=value:Effect).
    #[arg(long, value_name = "K=V:EFFECT", help_heading = "Replacement")]
    pub node_taint: Vec<String>,

    /// Record what the plan would do and change nothing (the plan completes at once).
    #[arg(long)]
    pub dry_run: bool,
    /// Return as soon as the plan is created; follow it later with `status`.
    #[arg(long)]
    pub detach: bool,
    /// Give up following after this long (Go duration); the plan keeps running (exit 5).
    #[arg(long, value_name = "DURATION")]
    pub wait_timeout: Option<String>,
    /// Output: text lines (with progress bars on a terminal) or JSON lines.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Format,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

fn duration_arg(flag: &str, value: &Option<String>) -> anyhow::Result<Option<String>> {
    match value {
        Some(v) if parse_duration(v).is_none() => {
            bail!("--{flag} {v:?} is not a duration; use Go syntax such as 90s, 10m or 1h30m")
        }
        other => Ok(other.clone()),
    }
}

/// `k=v` pairs.
fn key_values(flag: &str, items: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--{flag} {kv:?}: expected KEY=VALUE"),
        })
        .collect()
}

/// The plan's deadline from `--deadline`: an RFC 3339 time, or a duration from `now`.
pub fn deadline_arg(value: &str, now: jiff::Timestamp) -> anyhow::Result<jiff::Timestamp> {
    if let Ok(t) = value.parse::<jiff::Timestamp>() {
        return Ok(t);
    }
    let d = parse_duration(value).with_context(|| {
        format!("--deadline {value:?} is neither an RFC 3339 time (2030-01-01T12:00:00Z) nor a duration (10m)")
    })?;
    let d = jiff::SignedDuration::try_from(d).context("--deadline is too far away")?;
    now.checked_add(d).context("--deadline is too far away")
}

/// The plan spec the flags ask for (pure: `now` anchors a relative deadline).
pub fn plan_spec(args: &DrainArgs, now: jiff::Timestamp) -> anyhow::Result<DisruptionPlanSpec> {
    let mut spec = DisruptionPlanSpec {
        nodes: args.nodes.clone(),
        node_selector: args.selector.as_deref().map(parse_selector).transpose()?,
        reason: Some(
            args.reason
                .clone()
                .unwrap_or_else(|| "manual drain (snapdrain drain)".into()),
        ),
        source: PlanSource::Manual,
        mode: match args.mode {
            ModeArg::Execute => PlanMode::Execute,
            ModeArg::Release => PlanMode::Release,
        },
        deadline: args
            .deadline
            .as_deref()
            .map(|d| deadline_arg(d, now).map(Time))
            .transpose()?,
        dry_run: args.dry_run,
        ..DisruptionPlanSpec::default()
    };
    let b = &mut spec.backup;
    b.policy = match args.backup_policy {
        BackupPolicyArg::Required => BackupPolicy::Required,
        BackupPolicyArg::BestEffort => BackupPolicy::BestEffort,
        BackupPolicyArg::Skip => BackupPolicy::Skip,
    };
    b.method = match args.backup_method {
        BackupMethodArg::Auto => BackupMethod::Auto,
        BackupMethodArg::FileSystem => BackupMethod::FileSystem,
        BackupMethodArg::CsiDataMover => BackupMethod::CsiDataMover,
        BackupMethodArg::Snapshot => BackupMethod::Snapshot,
    };
    b.storage_location = args.backup_location.clone();
    b.velero_namespace = args.velero_namespace.clone();
    b.ttl = duration_arg("backup-ttl", &args.backup_ttl)?;
    b.reuse_if_newer_than = duration_arg("reuse-backup-newer-than", &args.reuse_backup_newer_than)?;
    b.timeout = duration_arg("backup-timeout", &args.backup_timeout)?;
    if let Some(n) = args.backup_attempts {
        b.max_attempts = n;
    }
    let d = &mut spec.drain;
    d.timeout = duration_arg("timeout", &args.timeout)?;
    d.grace_period_seconds = args.grace_period;
    if let Some(n) = args.max_concurrent_evictions {
        d.max_concurrent_evictions = n;
    }
    d.ignore_daemon_sets = !args.evict_daemonsets;
    d.delete_empty_dir_data = args.delete_emptydir_data;
    d.force = args.force;
    d.pod_selector = args
        .pod_selector
        .as_deref()
        .map(parse_selector)
        .transpose()?;
    spec.termination.terminate_instance = !args.keep_instance;
    spec.termination.delete_node = !args.keep_node;
    if let Some(when) = args.replace {
        let mut node_taints: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in key_values("node-taint", &args.node_taint)? {
            node_taints.entry(k).or_default().push(v);
        }
        let node_labels = key_values("node-label", &args.node_label)?;
        let bottlerocket =
            (!node_labels.is_empty() || !node_taints.is_empty()).then(|| BottlerocketSpec {
                node_labels,
                node_taints,
                ..BottlerocketSpec::default()
            });
        spec.replacement = Some(ReplacementSpec {
            when: match when {
                ReplaceArg::BeforeDrain => ReplacementWhen::BeforeDrain,
                ReplaceArg::AfterDrain => ReplacementWhen::AfterDrain,
            },
            launch_template: args.launch_template.as_ref().map(|lt| {
                if snapdrain::cloud::ec2::is_launch_template_id(lt) {
                    LaunchTemplateRef {
                        id: Some(lt.clone()),
                        ..Default::default()
                    }
                } else {
                    LaunchTemplateRef {
                        name: Some(lt.clone()),
                        ..Default::default()
                    }
                }
            }),
            node_class_ref: args.node_class.clone().map(|name| NodeClassRef { name }),
            instance_types: args.instance_type.clone(),
            capacity_type: args.capacity_type.map(|c| match c {
                CapacityArg::OnDemand => CapacityType::OnDemand,
                CapacityArg::Spot => CapacityType::Spot,
            }),
            subnets: args.subnet.clone(),
            image_id: args.image_id.clone(),
            bottlerocket,
            ..Default::default()
        });
    } else if !args.instance_type.is_empty()
        || args.node_class.is_some()
        || args.image_id.is_some()
        || !args.subnet.is_empty()
        || args.launch_template.is_some()
        || !args.node_label.is_empty()
        || !args.node_taint.is_empty()
    {
        bail!("replacement flags were given without --replace before-drain|after-drain");
    }
    // The checks the API server's CEL rules would make, with the same messages, before anything is created.
    validate(&spec).map_err(|p| anyhow::anyhow!("{}", problems_message(&p)))?;
    Ok(spec)
}

/// `drain-<first node>-` (the API server appends five random characters), within the 253 characters of a
/// DNS subdomain name.
pub fn generate_name(spec: &DisruptionPlanSpec) -> String {
    let base = spec.nodes.first().map_or("selector", String::as_str);
    let base: String = base.chars().take(200).collect();
    format!("drain-{}-", base.trim_end_matches(['.', '-']))
}

/// Checks that the named nodes exist, or that the selector matches some; returns their names.
async fn resolve_nodes(
    client: &kube::Client,
    spec: &DisruptionPlanSpec,
) -> anyhow::Result<Vec<String>> {
    let api: Api<Node> = Api::all(client.clone());
    if let Some(sel) = &spec.node_selector {
        let s = selector_string(sel);
        let nodes = api
            .list(&ListParams::default().labels(&s))
            .await
            .with_context(|| format!("cannot list nodes matching {s}"))?;
        if nodes.items.is_empty() {
            bail!("no node matches the selector {s}; check with `kubectl get nodes -l '{s}'`");
        }
        return Ok(nodes.items.iter().map(|n| n.name_any()).collect());
    }
    for n in &spec.nodes {
        if api
            .get_opt(n)
            .await
            .with_context(|| format!("cannot read node {n}"))?
            .is_none()
        {
            bail!("node {n} not found; list nodes with `kubectl get nodes`");
        }
    }
    Ok(spec.nodes.clone())
}

pub async fn run(args: DrainArgs) -> anyhow::Result<Outcome> {
    let program = super::invocation::program();
    let spec = plan_spec(&args, jiff::Timestamp::now())?;
    let wait_timeout: Option<Duration> = duration_arg("wait-timeout", &args.wait_timeout)?
        .as_deref()
        .and_then(parse_duration);
    let client = args.cluster.client().await?;
    let nodes = resolve_nodes(&client, &spec).await?;

    let mut meta = json!({"labels": {"app.kubernetes.io/created-by": "snapdrain-cli"}});
    match &args.name {
        Some(n) => meta["name"] = json!(n),
        None => meta["generateName"] = json!(generate_name(&spec)),
    }
    let body: DisruptionPlan = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1",
        "kind": "DisruptionPlan",
        "metadata": meta,
        "spec": spec,
    }))
    .context("the plan built from the flags does not match the CRD types (a bug in snapdrain)")?;
    let plans: Api<DisruptionPlan> = Api::all(client.clone());
    let created = plans.create(&PostParams::default(), &body).await.map_err(|e| match e {
        kube::Error::Api(ae) if ae.code == 404 => anyhow::anyhow!(
            "the DisruptionPlan CRD is not installed in this cluster ({}); install it with `{program} crds | kubectl apply -f -`",
            ae.message
        ),
        kube::Error::Api(ae) if ae.code == 409 => anyhow::anyhow!(
            "a DisruptionPlan with that name already exists ({}); choose another --name or follow it with `{program} status`",
            ae.message
        ),
        other => anyhow::Error::new(other).context("cannot create the DisruptionPlan"),
    })?;
    let name = created.name_any();

    let stdout_tty = std::io::stdout().is_terminal();
    let live = stdout_tty && std::io::stderr().is_terminal();
    let mut out = Output::new(args.output, &name, live, Box::new(std::io::stdout()));
    out.json(json!({
        "event": "created",
        "nodes": nodes,
        "message": format!(
            "disruptionplan.snapdrain.io/{name} created for {} ({:?} mode, backup {:?}{})",
            nodes.join(", "),
            created.spec.mode,
            created.spec.backup.policy,
            if created.spec.dry_run { ", dry run" } else { "" }
        ),
    }))?;
    if args.detach {
        out.json(json!({"event": "detached", "message": format!(
            "detached; follow it with `{program} status {name}`, abort it with `{program} abort {name}`"
        )}))?;
        return Ok(Outcome::Detached);
    }
    let opts = FollowOptions {
        plan: name.clone(),
        velero_namespace: created.spec.backup.velero_namespace.clone(),
        wait_timeout,
        interactive: std::io::stdin().is_terminal(),
        program: program.clone(),
    };
    let followed = follow(&client, &opts, &mut out).await?;
    tell_ending(
        &mut out,
        &program,
        &name,
        followed.outcome,
        followed.last.as_deref(),
    )?;
    Ok(followed.outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        drain: DrainArgs,
    }

    fn args(argv: &[&str]) -> DrainArgs {
        let mut all = vec!["drain"];
        all.extend_from_slice(argv);
        T::try_parse_from(all).expect("parses").drain
    }

    fn now() -> jiff::Timestamp {
        "2030-01-01T00:00:00Z".parse().expect("time")
    }

    #[test]
    fn flags_fill_the_spec() {
        let a = args(&[
            "n1",
            "--mode",
            "execute",
            "--backup",
            "best-effort",
            "--backup-method",
            "csi-data-mover",
            "--timeout",
            "5m",
            "--grace-period",
            "30",
            "--force",
            "--deadline",
            "10m",
            "--dry-run",
            "--replace",
            "after-drain",
            "--instance-type",
            "m6i.xlarge,m6a.xlarge",
            "--image-id",
            "ami-1",
            "--subnet",
            "subnet-1",
            "--node-label",
            "pool=db",
            "--node-taint",
            "dedicated=db:NoSchedule",
        ]);
        let s = plan_spec(&a, now()).expect("valid");
        assert_eq!(s.nodes, vec!["n1"]);
        assert_eq!(s.source, PlanSource::Manual);
        assert_eq!(s.backup.policy, BackupPolicy::BestEffort);
        assert_eq!(s.backup.method, BackupMethod::CsiDataMover);
        assert_eq!(s.drain.timeout.as_deref(), Some("5m"));
        assert_eq!(s.drain.grace_period_seconds, Some(30));
        assert!(s.dry_run && s.drain.ignore_daemon_sets && s.drain.force);
        assert_eq!(
            s.deadline.map(|t| t.0.to_string()).as_deref(),
            Some("2030-01-01T00:10:00Z")
        );
        let r = s.replacement.expect("replacement");
        assert_eq!(r.when, ReplacementWhen::AfterDrain);
        assert_eq!(r.node_class_ref, None);
        assert_eq!(r.instance_types, vec!["m6i.xlarge", "m6a.xlarge"]);
        let br = r.bottlerocket.expect("bottlerocket");
        assert_eq!(br.node_labels.get("pool").map(String::as_str), Some("db"));
        assert_eq!(
            br.node_taints.get("dedicated"),
            Some(&vec!["db:NoSchedule".to_string()])
        );
    }

    #[test]
    fn defaults_match_a_plan_naming_only_the_nodes() {
        let s = plan_spec(&args(&["n1"]), now()).expect("valid");
        let api: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"]})).expect("spec");
        assert_eq!(s.backup, api.backup);
        assert_eq!(s.drain, api.drain);
        assert_eq!(s.termination, api.termination);
        assert_eq!(s.replacement, None);
        assert_eq!(generate_name(&s), "drain-n1-");
    }

    #[test]
    fn mistakes_are_refused_before_anything_is_created() {
        let e = plan_spec(&args(&["n1", "--timeout", "5 minutes"]), now()).unwrap_err();
        assert!(
            e.to_string()
                .contains("--timeout \"5 minutes\" is not a duration"),
            "{e}"
        );
        let e = plan_spec(&args(&["n1", "--image-id", "ami-1"]), now()).unwrap_err();
        assert!(e.to_string().contains("without --replace"), "{e}");
        let s = plan_spec(
            &args(&[
                "n1",
                "--replace",
                "after-drain",
                "--instance-type",
                "m6i.large",
                "--node-class",
                "general",
            ]),
            now(),
        )
        .expect("valid");
        assert_eq!(
            s.replacement
                .and_then(|r| r.node_class_ref)
                .map(|c| c.name)
                .as_deref(),
            Some("general")
        );
        let e = plan_spec(&args(&["n1", "--deadline", "tomorrow"]), now()).unwrap_err();
        assert!(e.to_string().contains("RFC 3339"), "{e}");
        let e = plan_spec(
            &args(&[
                "n1",
                "--mode",
                "release",
                "--replace",
                "after-drain",
                "--instance-type",
                "m6i.large",
                "--image-id",
                "ami-1",
            ]),
            now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid spec"), "{e}");
        assert!(
            T::try_parse_from(["drain"]).is_err(),
            "a node or a selector is required"
        );
        assert!(
            T::try_parse_from(["drain", "n1", "-l", "a=b"]).is_err(),
            "not both"
        );
    }

    #[test]
    fn a_selector_becomes_the_node_selector() {
        let s = plan_spec(&args(&["-l", "pool=db"]), now()).expect("valid");
        assert!(s.nodes.is_empty());
        assert_eq!(
            s.node_selector.and_then(|n| n.match_labels),
            Some(BTreeMap::from([("pool".to_string(), "db".to_string())]))
        );
    }
}

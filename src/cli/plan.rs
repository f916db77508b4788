//! `snapdrain plan NODE`: a dry run. Shows which backups a DisruptionPlan for NODE would take and which
//! pods it would evict, in which order, without changing anything in the cluster.

use clap::Args;

use snapdrain::api::DisruptionPlanSpec;
use snapdrain::controller::preview::describe;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The node to plan for.
    pub node: String,
    /// A DisruptionPlan manifest (YAML or JSON) whose spec is previewed for NODE (its nodes and
    /// nodeSelector are replaced by NODE). Without it: a plan naming only NODE.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub filename: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub cluster: super::cluster::ClusterArgs,
}

pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let spec = spec_for(&args.node, args.filename.as_deref())?;
    print!("{}", describe(&client, &args.node, &spec).await?);
    Ok(())
}

/// The spec previewed: the manifest's, for `node` only; or (no manifest) the defaults a plan naming only
/// `node` gets from the API (serde defaults, not `Default`).
fn spec_for(node: &str, manifest: Option<&std::path::Path>) -> anyhow::Result<DisruptionPlanSpec> {
    let mut spec = match manifest {
        None => serde_json::json!({}),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            let doc: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{} is not a DisruptionPlan manifest: {e}", path.display())
            })?;
            doc.get("spec").cloned().ok_or_else(|| {
                anyhow::anyhow!("{} has no spec: expected a DisruptionPlan", path.display())
            })?
        }
    };
    let Some(fields) = spec.as_object_mut() else {
        anyhow::bail!("the plan's spec is not a mapping");
    };
    fields.remove("nodeSelector");
    fields.insert("nodes".into(), serde_json::json!([node]));
    Ok(serde_json::from_value(spec)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifests_spec_is_previewed_for_the_node_named() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("plan.yaml");
        std::fs::write(
            &path,
            "apiVersion: snapdrain.io/v1alpha1\nkind: DisruptionPlan\nmetadata: {name: x}\nspec:\n  nodeSelector: {matchLabels: {pool: db}}\n  replacement: {when: before-drain, instanceTypes: [m6g.large], imageId: ami-0123456789abcdef0}\n",
        )
        .expect("write the manifest");
        let spec = spec_for("n1", Some(&path)).expect("a spec");
        assert_eq!(spec.nodes, ["n1"]);
        assert!(spec.node_selector.is_none());
        let replacement = spec.replacement.expect("the manifest's replacement");
        assert_eq!(
            replacement.image_id.as_deref(),
            Some("ami-0123456789abcdef0")
        );
        assert_eq!(spec_for("n2", None).expect("defaults").nodes, ["n2"]);
    }
}

//! The kubeconfig flags the user-facing commands share (`drain`, `status`, `abort`, `report`), with
//! kubectl's meaning: `--kubeconfig FILE`, `--context NAME`, else `$KUBECONFIG` (a list of files is
//! merged, as kubectl does), `~/.kube/config`, or the in-cluster service account.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        kube::Client::try_from(self.config().await?)
            .context("cannot build a Kubernetes client from the kubeconfig")
    }

    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .with_context(|| match &self.context {
                        Some(ctx) => format!(
                            "kubeconfig {} has no usable context {ctx} (list them with `kubectl config get-contexts`)",
                            path.display()
                        ),
                        None => format!("kubeconfig {} has no usable context", path.display()),
                    })?
            }
            (None, Some(ctx)) => kube::Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("no usable kubeconfig context {ctx}"))?,
            (None, None) => kube::Config::infer().await.context(
                "no kubeconfig found ($KUBECONFIG, ~/.kube/config) and not running in a cluster; pass --kubeconfig",
            )?,
        };
        Ok(snapdrain::controller::run::identified(config))
    }
}

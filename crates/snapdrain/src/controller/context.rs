//! What every reconcile shares: Kubernetes clients, AWS clients, metrics, the event recorder, settings.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::OnceCell;

use crate::cloud::ec2::Ec2Cloud;
use crate::telemetry::Metrics;

use super::clock::WallClock;
use super::error::ControllerError;
use super::report::Report;
use super::step::Io;

/// Settings of the controller process.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This replica's name (pod name), for the lease and events.
    pub identity: String,
    /// EC2 endpoint override (otherwise the standard AWS environment, e.g. `AWS_ENDPOINT_URL_EC2`).
    pub ec2_endpoint: Option<String>,
    /// AWS region (otherwise from the environment).
    pub region: Option<String>,
    /// Static EC2 credentials for endpoints without the standard chain (test endpoints, LocalStack).
    pub ec2_credentials: Option<(String, String)>,
    /// Defaults for Bottlerocket user data when a plan does not say: cluster name, API server, CA.
    pub cluster_name: Option<String>,
    pub api_server: Option<String>,
    pub cluster_certificate: Option<String>,
    /// Longest a single reconcile waits on the cluster before requeueing.
    pub wait_slice: Duration,
    /// Upper bound of the wait between backup attempts (the backoff itself grows from 30 s).
    pub backup_retry_cap: Duration,
    /// First wait after an EC2 capacity error on a replacement launch (doubling after each).
    pub capacity_retry_base: Duration,
    /// First wait before a notification is sent again (doubling after each failure).
    pub notification_retry_base: Duration,
    /// How often the notification URL's Secret (`urlSecretRef`) is read again, so a rotated or newly
    /// created Secret is picked up (snapdrain may only `get` it, not watch it).
    pub notification_url_recheck: Duration,
    /// The controller's own namespace (`POD_NAMESPACE`): where `urlSecretRef` Secrets live.
    pub namespace: String,
    /// snapdrain's own AWS configuration (identity, region, endpoint) for reading Velero's bucket when
    /// Velero has no credentials Secret (IRSA, EKS Pod Identity). None loads the AWS default chain on
    /// first use; tests pass their own so no process-wide environment is involved.
    pub aws: Option<aws_config::SdkConfig>,
    /// `--velero-credentials-secret`: the Secret (and key) in the Velero namespace holding Velero's
    /// credentials file, when it cannot be found from the Velero Deployment.
    pub velero_credentials_secret: Option<crate::api::velero::SecretKeyRef>,
    /// The most bytes of JSON a plan's status may grow to; a plan that could pass it fails while
    /// planning (`planning::status_size`).
    pub status_budget: usize,
    /// Velero's copy rate (MiB/s) the estimate against a plan's deadline uses
    /// (`planning::ebs_snapshots::velero_estimate`). 0: Velero is taken as instant.
    pub velero_mib_per_second: f64,
    /// Velero's fixed cost per backup (queue, tarball, upload) in that estimate.
    pub velero_overhead: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            identity: "snapdrain".into(),
            ec2_endpoint: None,
            region: None,
            ec2_credentials: None,
            cluster_name: None,
            api_server: None,
            cluster_certificate: None,
            wait_slice: Duration::from_secs(20),
            backup_retry_cap: Duration::from_secs(300),
            capacity_retry_base: Duration::from_secs(30),
            notification_retry_base: Duration::from_secs(1),
            notification_url_recheck: Duration::from_secs(60),
            namespace: "snapdrain".into(),
            aws: None,
            velero_credentials_secret: None,
            status_budget: crate::planning::status_size::DEFAULT_BUDGET,
            // kopia file-system backups commonly move about 100 MiB/s per node (the figure issue 24's
            // estimate is made with); a deployment measures its own and sets the flag.
            velero_mib_per_second: crate::planning::estimate::DEFAULT_MIB_PER_SECOND,
            velero_overhead: crate::planning::estimate::DEFAULT_OVERHEAD,
        }
    }
}

pub struct Context {
    pub client: Client,
    /// A client that does not retry 429s itself, so eviction answers reach snapdrain's own backoff and
    /// the `snapdrain_evictions_total{code}` metric.
    pub eviction_client: Client,
    pub metrics: Metrics,
    /// Events of the helper loops (signals, hold keeper); plan Events go through [`Context::report`].
    pub recorder: Recorder,
    /// Plan Events for the policy's notification webhook.
    pub notifier: crate::telemetry::Notifier,
    /// The only way plan news goes out: after the status write that carries it.
    pub(crate) report: Report,
    /// The plan driver's clock.
    pub(crate) clock: WallClock,
    pub settings: Settings,
    pub(crate) cloud: Cloud,
    /// Consecutive reconcile failures per plan, for the error policy's backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Per plan, the resourceVersions this controller's own status writes replaced: a pass that starts
    /// from one of them works from a copy older than our last write, and waits for the cache instead.
    pub(crate) superseded: Mutex<HashMap<String, VecDeque<String>>>,
    /// What the steps read about the cluster (pods, PVCs, StatefulSets, PDBs, VolumeAttachments, Nodes).
    pub caches: super::cache::Caches,
    /// The DisruptionPolicy plans are judged by (kept by the leader's policy follower).
    pub(crate) policy: super::policy::PolicyView,
}

impl Context {
    pub fn new(
        client: Client,
        eviction_client: Client,
        metrics: Metrics,
        settings: Settings,
        caches: super::cache::Caches,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "snapdrain".into(),
                instance: Some(settings.identity.clone()),
            },
        );
        let notifier =
            crate::telemetry::Notifier::start(metrics.clone(), settings.notification_retry_base);
        let report = Report::start(recorder.clone(), notifier.clone(), metrics.clone());
        Self {
            client,
            eviction_client,
            metrics,
            recorder,
            notifier,
            report,
            clock: WallClock::system(),
            cloud: Cloud::new(settings.clone()),
            settings,
            failures: Mutex::new(HashMap::new()),
            superseded: Mutex::new(HashMap::new()),
            caches,
            policy: super::policy::PolicyView::default(),
        }
    }

    /// The caches, once their first lists are in (at most one wait slice): a step never reads an
    /// unfilled cache as "nothing there".
    pub async fn synced_caches(&self) -> Result<&super::cache::Caches, ControllerError> {
        self.caches
            .wait_synced(self.settings.wait_slice)
            .await
            .map_err(ControllerError::CacheNotSynced)?;
        Ok(&self.caches)
    }

    /// What a step may use, over caches that are synced.
    pub(crate) fn io<'a>(&'a self, caches: &'a super::cache::Caches) -> Io<'a> {
        Io {
            client: &self.client,
            eviction_client: &self.eviction_client,
            caches,
            cloud: &self.cloud,
            settings: &self.settings,
            requests: &self.metrics,
            policy: self.policy.get(),
        }
    }
}

/// EC2, Auto Scaling and snapdrain's own AWS configuration, each built on first use (plans without
/// termination, replacement or bucket checks never need AWS).
pub struct Cloud {
    settings: Settings,
    ec2: OnceCell<Ec2Cloud>,
    aws: OnceCell<aws_config::SdkConfig>,
}

impl Cloud {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            ec2: OnceCell::new(),
            aws: OnceCell::new(),
        }
    }

    /// snapdrain's own AWS configuration: [`Settings::aws`], or the default chain (loaded on first use,
    /// with [`Settings::region`] when set).
    pub async fn aws_config(&self) -> &aws_config::SdkConfig {
        self.aws
            .get_or_init(|| async {
                if let Some(c) = &self.settings.aws {
                    return c.clone();
                }
                let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
                if let Some(r) = &self.settings.region {
                    loader = loader.region(aws_config::Region::new(r.clone()));
                }
                loader.load().await
            })
            .await
    }

    /// The EC2 client, built on first use.
    pub async fn ec2(&self) -> Result<&Ec2Cloud, ControllerError> {
        self.ec2
            .get_or_try_init(|| async {
                match &self.settings.ec2_endpoint {
                    Some(endpoint) => {
                        let region = self
                            .settings
                            .region
                            .clone()
                            .unwrap_or_else(|| "us-west-2".into());
                        let creds = self
                            .settings
                            .ec2_credentials
                            .as_ref()
                            .map(|(a, s)| (a.as_str(), s.as_str()));
                        Ok::<_, ControllerError>(
                            Ec2Cloud::with_endpoint(endpoint, &region, creds).await,
                        )
                    }
                    // `--region` wins over AWS_REGION and the profile (review #16).
                    None => Ok(Ec2Cloud::from_env(self.settings.region.as_deref()).await),
                }
            })
            .await
    }
}

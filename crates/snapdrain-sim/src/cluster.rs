//! A whole simulated cluster in one handle: the API server, the CRDs and scenario it was started with,
//! and the world controllers around it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::apiserver::audit::Audit;
use super::apiserver::faults::Faults;
use super::apiserver::resources::ResKey;
use super::apiserver::store::{Store, WriteOptions};
use super::apiserver::{ApiServer, Settings, StartError};
use super::ec2::{
    CLUSTER_SECURITY_GROUP, Ec2Sim, Ec2SimConfig, InstanceInfo, MetadataOptions,
    NODE_INSTANCE_PROFILE,
};
use super::error::SimError;
use super::s3::{S3Sim, S3SimConfig, S3Tls};
use super::scenario::format::{TlsCa, VeleroCredentials};
use super::scenario::{self, LoadedScenario, S3_URL_FALLBACK, Scenario, crds, timeline};
use super::world::autoscaler::{self, AutoscalerConfig, AutoscalerHandle};
use super::world::eviction::drainer_client;
use super::world::karpenter::{self, Cloud, KarpenterConfig, KarpenterHandle};
use super::world::nth::{self, NthConfig, NthHandle};
use super::world::velero::{self, VeleroConfig, VeleroHandle};
use super::world::{Timings, World, WorldContext, ec2_nodes};
use crate::ec2::bottlerocket::{ClusterJoin, karpenter_user_data};

/// Other crates load objects through this path; the function lives with the scenario that uses it.
pub use super::scenario::manifest::load_object;

/// Which scenario to load.
#[derive(Clone, Debug)]
pub enum ScenarioSource {
    /// A built-in scenario name or a scenario file path.
    Named(String),
    /// An already parsed scenario; `label` names it in errors.
    Inline {
        scenario: Box<Scenario>,
        label: String,
    },
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub addr: SocketAddr,
    /// Objects to create at start, in order (after the scenario's).
    pub objects: Vec<Value>,
    pub settings: Settings,
    /// A scenario to load; implies `world`.
    pub scenario: Option<ScenarioSource>,
    /// Run the world controllers (kubelet, scheduler, workload controllers, Velero, Karpenter, Cluster
    /// Autoscaler, and aws-node-termination-handler when the scenario installs it) and serve the Velero and
    /// Karpenter CRDs. Off by default: a bare API server.
    pub world: bool,
    /// Overrides the scenario's timings.
    pub timings: Option<Timings>,
    /// The S3 endpoint that replaces `${S3_URL}` in scenario objects (the S3 simulator's, when one runs).
    pub s3_url: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            objects: Vec::new(),
            settings: Settings::default(),
            scenario: None,
            world: false,
            timings: None,
            s3_url: None,
        }
    }
}

pub struct SimCluster {
    pub store: Store,
    pub audit: Arc<Audit>,
    pub faults: Arc<Faults>,
    pub api: ApiServer,
    /// The running world, when asked for (a scenario or `world: true`). Dropping the cluster stops it.
    pub world: Option<World>,
    pub context: Option<Arc<WorldContext>>,
    /// What the scenario loaded, including the EC2 instances behind its nodes.
    pub scenario: Option<LoadedScenario>,
    /// S3 standing in for MinIO (with the world).
    pub s3: Option<S3Sim>,
    /// The EC2 endpoint (with the world).
    pub ec2: Option<Ec2Sim>,
    /// Fault injection and restarts of the simulated Velero server.
    pub velero: Option<VeleroHandle>,
    /// Spot interruptions for the simulated Karpenter.
    pub karpenter: Option<KarpenterHandle>,
    /// Scale-downs for the simulated Cluster Autoscaler (with the world).
    pub autoscaler: Option<AutoscalerHandle>,
    /// Interruption notices for aws-node-termination-handler, when the scenario installs it.
    pub nth: Option<NthHandle>,
    /// What timeline actions reach (with the world), for [`SimCluster::act`].
    reach: Option<timeline::Reach>,
}

/// The simulated Velero server as the scenario installs it: its data path, and its server pod's labels
/// (`velero install`: `deploy: velero`; the Helm chart: `name: velero`).
fn velero_config(spec: Option<&scenario::format::VeleroSpec>) -> VeleroConfig {
    let mut config = VeleroConfig::default();
    if let Some(v) = spec {
        config.data_path = v.data_path;
        if v.install == scenario::format::VeleroInstall::Helm {
            config.server_labels = BTreeMap::from([("name".into(), "velero".into())]);
        }
    }
    config
}

impl SimCluster {
    pub async fn start(config: SimConfig) -> Result<Self, SimError> {
        let store = Store::new();
        let audit = Arc::new(Audit::default());
        let faults = Arc::new(Faults::default());
        for ns in ["default", "kube-system", "kube-node-lease"] {
            store
                .create(
                    &ResKey::core("namespaces"),
                    None,
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                    WriteOptions::default(),
                )
                .map_err(|e| SimError::Load {
                    what: format!("namespace {ns}"),
                    message: e.message,
                })?;
        }
        let with_world = config.world || config.scenario.is_some();
        if with_world {
            crds::install(&store).map_err(|message| SimError::Load {
                what: "the Velero and Karpenter CRDs".into(),
                message,
            })?;
        }

        // Scenario first: its Velero install says which bucket and keys the S3 endpoint serves.
        let resolved = match &config.scenario {
            None => None,
            Some(ScenarioSource::Named(n)) => Some(scenario::resolve(n)?),
            Some(ScenarioSource::Inline { scenario, label }) => {
                Some(((**scenario).clone(), label.clone()))
            }
        };
        let s3 = if with_world {
            let mut s3_config = S3SimConfig::default();
            if let Some(v) = resolved.as_ref().and_then(|(scn, _)| scn.velero.as_ref()) {
                s3_config.access_key = v.access_key.clone();
                s3_config.secret_key = v.secret_key.clone();
                s3_config.region = v.region.clone();
                s3_config.buckets = vec![v.bucket.clone()];
                if v.aws_s3 {
                    s3_config.bucket_region = Some(v.region.clone());
                }
                if v.tls {
                    s3_config.tls =
                        Some(S3Tls::private_ca().map_err(|message| SimError::Load {
                            what: "the S3 endpoint's CA".into(),
                            message,
                        })?);
                }
            }
            let s3 = S3Sim::start(s3_config).await.map_err(|e| SimError::Load {
                what: "the S3 endpoint".into(),
                message: e.to_string(),
            })?;
            // With IRSA, Velero's role may use the bucket (its IAM policy).
            if let Some(v) = resolved.as_ref().and_then(|(scn, _)| scn.velero.as_ref())
                && v.credentials == VeleroCredentials::Irsa
            {
                let (ak, sk) = crate::sts::role_credentials(&v.role_arn);
                s3.grant(&ak, &sk);
            }
            s3.attach_faults(faults.clone());
            Some(s3)
        } else {
            None
        };
        let s3_url = config
            .s3_url
            .clone()
            .or_else(|| s3.as_ref().map(S3Sim::endpoint))
            .unwrap_or_else(|| S3_URL_FALLBACK.to_string());
        let loaded = match &resolved {
            None => None,
            Some((scn, label)) => Some(scenario::load_with_ca(
                &store,
                scn,
                label,
                &s3_url,
                s3.as_ref().and_then(S3Sim::ca_pem),
            )?),
        };
        for (i, obj) in config.objects.into_iter().enumerate() {
            load_object(&store, obj).map_err(|message| SimError::Load {
                what: format!("object #{}", i + 1),
                message,
            })?;
        }
        let api = ApiServer::start(
            config.addr,
            store.clone(),
            audit.clone(),
            faults.clone(),
            config.settings,
        )
        .await
        .map_err(|e| match e {
            StartError::Listen(source) => SimError::Bind {
                addr: config.addr,
                source,
            },
            StartError::Tls(source) => SimError::Tls {
                addr: config.addr,
                source,
            },
        })?;
        let mut ec2 = None;
        let mut velero_handle = None;
        let mut karpenter_handle = None;
        let mut autoscaler_handle = None;
        let mut nth_handle = None;
        let mut timeline_reach = None;
        let (world, context) = if with_world {
            let timings = config
                .timings
                .clone()
                .or_else(|| loaded.as_ref().map(|l| l.timings.clone()))
                .unwrap_or_default();
            let mut ec2_config = ec2_config_for(loaded.as_ref(), timings.instance_boot);
            ec2_config.snapshot_mib_per_second = timings.ebs_snapshot_mib_per_second;
            ec2_config.snapshot_per_volume_interval = timings.ebs_snapshot_per_volume_interval;
            // The instance profiles Karpenter created for the EC2NodeClasses' roles exist in IAM.
            ec2_config
                .instance_profiles
                .extend(karpenter::nodeclass::instance_profiles(&store));
            ec2_config
                .images
                .extend(karpenter::nodeclass::images(&store));
            let ec2_sim = Ec2Sim::start(ec2_config)
                .await
                .map_err(|e| SimError::Load {
                    what: "the EC2 endpoint".into(),
                    message: e.to_string(),
                })?;
            karpenter::nodeclass::resolve_all(&store, ec2_sim.config()).map_err(|message| {
                SimError::Load {
                    what: "the EC2NodeClasses' status".into(),
                    message,
                }
            })?;
            ec2_sim.attach_faults(faults.clone());
            // EC2 sees the EBS volumes attached to each instance as the cluster's VolumeAttachments do.
            let volume_store = store.clone();
            ec2_sim.set_volume_source(Arc::new(move |instance: &str| {
                crate::world::volumes::ec2_attached_volumes(&volume_store, instance)
            }));
            // The user data Karpenter (or the EKS node group) launched them with: it names the
            // cluster (karpenter-provider-aws pkg/providers/amifamily/bootstrap/bottlerocket.go).
            let user_data = karpenter_user_data(
                &cluster_join(&api.url(), &api.pki.ca_pem),
                &BTreeMap::new(),
                &[],
            );
            for i in loaded.iter().flat_map(|l| l.instances.iter()) {
                ec2_sim
                    .insert_running_with_user_data(
                        InstanceInfo {
                            id: i.instance_id.clone(),
                            instance_type: i.instance_type.clone(),
                            image_id: i.image_id.clone(),
                            zone: i.zone.clone(),
                            subnet_id: ec2_sim
                                .config()
                                .subnets
                                .iter()
                                .find(|s| s.zone == i.zone)
                                .map(|s| s.id.clone())
                                .unwrap_or_default(),
                            private_ip: i.private_ip.clone(),
                            private_dns_name: i.node_name.clone(),
                            tags: i
                                .node_pool
                                .iter()
                                .map(|p| ("karpenter.sh/nodepool".to_string(), p.clone()))
                                .collect(),
                            user_data: None,
                            kubelet_error: None,
                            launch_time: jiff::Timestamp::now(),
                            spot: false,
                            // As Karpenter or a node group launched them: with the node role's instance
                            // profile, the cluster security group and IMDSv2 (karpenter-provider-aws
                            // pkg/providers/launchtemplate/types.go), unless the scenario says not.
                            iam_instance_profile: i.instance_profile.then(|| {
                                ec2_sim.config().instance_profile_arn(NODE_INSTANCE_PROFILE)
                            }),
                            security_group_ids: vec![CLUSTER_SECURITY_GROUP.into()],
                            metadata_options: MetadataOptions {
                                http_tokens: "required".into(),
                                hop_limit: 1,
                            },
                        },
                        i.user_data.then_some(user_data.as_str()),
                    )
                    .map_err(|e| SimError::Load {
                        what: format!("instance {} of node {}", i.instance_id, i.node_name),
                        message: e.to_string(),
                    })?;
            }
            let mut ctx = WorldContext::new(store.clone(), audit.clone(), faults.clone(), timings);
            ctx.s3_endpoint = Some(s3_url.clone());
            ctx.s3_ca_pem = s3.as_ref().and_then(S3Sim::ca_pem).map(str::to_owned);
            if let Some(v) = resolved.as_ref().and_then(|(scn, _)| scn.velero.as_ref())
                && v.tls_ca == TlsCa::VeleroImage
            {
                ctx.velero_system_cas.extend(ctx.s3_ca_pem.clone());
            }
            let ctx = Arc::new(ctx);
            let mut world = World::start(ctx.clone());
            world.adopt(tokio::spawn(ec2_nodes::run(
                ctx.clone(),
                ec2_sim.subscribe(),
            )));
            let vh = VeleroHandle::new();
            world.adopt(tokio::spawn(velero::run(
                ctx.clone(),
                velero_config(resolved.as_ref().and_then(|(scn, _)| scn.velero.as_ref())),
                vh.clone(),
            )));
            let admin = api.admin_config().map_err(|message| SimError::Load {
                what: "the API server's admin configuration".into(),
                message,
            })?;
            let client =
                karpenter::api_client(admin.clone()).map_err(|message| SimError::Load {
                    what: "a client for the simulated Karpenter".into(),
                    message,
                })?;
            let creds =
                aws_credential_types::Credentials::new("sim", "sim", None, None, "simulator");
            let ec2_config = aws_sdk_ec2::Config::builder()
                .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
                .region(aws_sdk_ec2::config::Region::new(
                    ec2_sim.config().region.clone(),
                ))
                .credentials_provider(creds)
                .endpoint_url(ec2_sim.endpoint())
                .build();
            let cloud = karpenter::ec2::SimEc2Cloud::new(
                aws_sdk_ec2::Client::from_conf(ec2_config),
                ec2_sim.config().subnets.clone(),
                cluster_join(&api.url(), &api.pki.ca_pem),
            );
            let shared_cloud: Arc<dyn Cloud> = cloud.clone();
            let kh = KarpenterHandle::new();
            world.adopt(tokio::spawn(karpenter::run(
                ctx.clone(),
                KarpenterConfig::new(cloud, client),
                kh.clone(),
            )));
            let scenario_spec = resolved.as_ref().map(|(scn, _)| scn);
            let drainer = |agent: &str, who: &str| {
                drainer_client(admin.clone(), agent).map_err(|message| SimError::Load {
                    what: format!("a client for the simulated {who}"),
                    message,
                })
            };
            let (ah, requests) = autoscaler::handle();
            world.adopt(tokio::spawn(autoscaler::run(
                ctx.clone(),
                AutoscalerConfig {
                    client: drainer(autoscaler::USER_AGENT, "Cluster Autoscaler")?,
                    cloud: shared_cloud.clone(),
                    settings: scenario_spec
                        .and_then(|s| s.cluster_autoscaler.clone())
                        .unwrap_or_default(),
                },
                requests,
            )));
            if let Some(settings) = scenario_spec.and_then(|s| s.node_termination_handler.clone()) {
                let (nh, notices) = nth::handle();
                world.adopt(tokio::spawn(nth::run(
                    ctx.clone(),
                    NthConfig {
                        client: drainer(nth::USER_AGENT, "aws-node-termination-handler")?,
                        settings,
                    },
                    notices,
                )));
                nth_handle = Some(nh);
            }
            let reads_interruptions = scenario_spec
                .and_then(|s| s.karpenter.as_ref())
                .is_some_and(|k| k.interruption_queue.is_some());
            let reach = timeline::Reach {
                autoscaler: Some(ah.clone()),
                nth: nth_handle.clone(),
                cloud: Some(shared_cloud),
                karpenter_interruptions: reads_interruptions.then(|| kh.clone()),
            };
            if let Some(l) = &loaded
                && !l.timeline.is_empty()
            {
                world.adopt(timeline::spawn(
                    ctx.clone(),
                    l.timeline.clone(),
                    reach.clone(),
                ));
            }
            timeline_reach = Some(reach);
            autoscaler_handle = Some(ah);
            ec2 = Some(ec2_sim);
            velero_handle = Some(vh);
            karpenter_handle = Some(kh);
            (Some(world), Some(ctx))
        } else {
            (None, None)
        };
        Ok(Self {
            store,
            audit,
            faults,
            api,
            world,
            context,
            scenario: loaded,
            s3,
            ec2,
            velero: velero_handle,
            karpenter: karpenter_handle,
            autoscaler: autoscaler_handle,
            nth: nth_handle,
            reach: timeline_reach,
        })
    }

    /// Runs one timeline action now (a test that waits for snapdrain before the disruption comes), with
    /// the same effects and audit entry as in a scenario's timeline. Needs the world.
    pub fn act(&self, action: &timeline::Action) -> Result<Value, String> {
        match (&self.context, &self.reach) {
            (Some(ctx), Some(reach)) => timeline::act(ctx, reach, action, 0),
            _ => Err("the cluster runs no world: start it with a scenario".into()),
        }
    }

    pub fn url(&self) -> String {
        self.api.url()
    }

    /// A kube-rs configuration for this cluster as its admin (the kubeconfig's user), trusting the API
    /// server's CA.
    pub fn kube_config(&self) -> kube::Config {
        self.api
            .admin_config()
            .expect("the server's own https://127.0.0.1:<port> URL and the CA it made parse")
    }

    /// The PEM of the CA that signed the API server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.api.pki.ca_pem
    }

    /// A kubeconfig for this cluster, trusting its CA, as `user`.
    pub fn kubeconfig_for(&self, user: super::apiserver::KubeconfigUser<'_>) -> String {
        super::apiserver::kubeconfig(&self.url(), self.ca_pem(), user)
    }

    /// Issues and enforces tokens; RBAC is on unless a test turns it off.
    pub fn auth(&self) -> &super::apiserver::auth::Auth {
        &self.api.state.auth
    }

    /// Writes a kubeconfig for this cluster and returns its path.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<PathBuf, SimError> {
        std::fs::write(path, self.api.kubeconfig()).map_err(|e| SimError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Ok(path.to_path_buf())
    }
}

/// The EC2 endpoint's region and subnets follow the scenario's zones (one subnet per zone).
fn ec2_config_for(loaded: Option<&LoadedScenario>, boot: std::time::Duration) -> Ec2SimConfig {
    let mut config = Ec2SimConfig {
        boot_delay: boot,
        ..Ec2SimConfig::default()
    };
    let zones: std::collections::BTreeSet<&str> = loaded
        .iter()
        .flat_map(|l| l.instances.iter().map(|i| i.zone.as_str()))
        .collect();
    if let Some(first) = zones.iter().next() {
        config.region = first
            .trim_end_matches(|c: char| c.is_ascii_lowercase())
            .to_string();
        config.subnets = zones
            .iter()
            .enumerate()
            .map(|(i, z)| super::ec2::SubnetConfig {
                id: format!("subnet-0{i}{:0>15}", z.len() * 7919 + i),
                zone: z.to_string(),
            })
            .collect();
    }
    config
}

/// The cluster settings a Bottlerocket node needs to join the simulated cluster at `api_url` whose CA is
/// `ca_pem`: `cluster-certificate` is the base64 of the CA's PEM, as EKS gives it
/// (`DescribeCluster` `certificateAuthority.data`) and Karpenter writes it (karpenter-provider-aws
/// `pkg/providers/amifamily/bootstrap/bottlerocket.go`). The simulated kubelet does not use it.
pub fn cluster_join(api_url: &str, ca_pem: &str) -> ClusterJoin {
    use base64::Engine as _;
    ClusterJoin {
        cluster_name: "snapdrain-sim".into(),
        api_server: api_url.to_string(),
        cluster_certificate: base64::engine::general_purpose::STANDARD.encode(ca_pem),
    }
}

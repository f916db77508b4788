//! The scenario file format: a cluster (nodes, Karpenter pools, workloads, Velero) and a timeline.
//! Every struct refuses unknown fields, so a typo is an error naming the field, not a silent default.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::timeline::TimelineEntry;
use crate::world::Timings;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub timings: Option<Timings>,
    /// Create workload pods, claims, volumes and attachments already bound and Running instead of letting
    /// the world controllers do it step by step (for large clusters that must load fast).
    #[serde(default)]
    pub materialize: bool,
    #[serde(default)]
    pub nodes: Vec<NodeGroup>,
    #[serde(default)]
    pub node_pools: Vec<NodePoolSpec>,
    #[serde(default)]
    pub ec2_node_classes: Vec<NodeClassSpec>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub stateful_sets: Vec<StatefulSetSpec>,
    #[serde(default)]
    pub deployments: Vec<DeploymentSpec>,
    #[serde(default)]
    pub jobs: Vec<JobSpec>,
    #[serde(default)]
    pub daemon_sets: Vec<DaemonSetSpec>,
    #[serde(default)]
    pub pdbs: Vec<PdbSpec>,
    #[serde(default)]
    pub velero: Option<VeleroSpec>,
    /// Cluster Autoscaler's flags (defaults: CA's). It runs in every world, idle until the timeline (or a
    /// test) asks it to scale a node down.
    #[serde(default)]
    pub cluster_autoscaler: Option<crate::world::autoscaler::AutoscalerSettings>,
    /// Installs aws-node-termination-handler with these flags (defaults: NTH's, so `taintNode: false`):
    /// it then handles the timeline's `spotInterruption` and `rebalanceRecommendation`.
    #[serde(default)]
    pub node_termination_handler: Option<crate::world::nth::NthSettings>,
    /// Karpenter's own settings (its Helm chart's `settings`; defaults: Karpenter's).
    #[serde(default)]
    pub karpenter: Option<crate::world::karpenter::KarpenterSettings>,
    /// Any manifests, created as given (after the objects above). `${S3_URL}` is replaced.
    #[serde(default)]
    pub objects: Vec<Value>,
    #[serde(default)]
    pub timeline: Vec<TimelineEntry>,
}

/// One node (`name`) or `count` nodes named `<prefix>-<i>` (default: EC2-style `ip-...` names).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroup {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    /// One zone, or `zones` to spread the group round-robin.
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<Taint>,
    #[serde(default)]
    pub capacity: Option<Capacity>,
    /// `aws:///<zone>/i-<17 hex>`; generated when absent.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    /// Bottlerocket version in `status.nodeInfo.osImage` ("Bottlerocket OS <v> (aws-k8s-1.35)").
    #[serde(default = "default_os_version")]
    pub os_version: String,
    #[serde(default)]
    pub karpenter: Option<KarpenterNode>,
    #[serde(default)]
    pub unschedulable: bool,
    /// How the nodes' instances were launched. Absent: as Karpenter and EKS node groups launch
    /// Bottlerocket nodes.
    #[serde(default)]
    pub launch: Option<InstanceLaunch>,
}

/// What a node's instance was launched with, as far as a replacement can copy it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceLaunch {
    /// The node role's instance profile. `false`: none (an instance started by hand).
    #[serde(default = "yes")]
    pub instance_profile: bool,
    /// Bottlerocket user data naming the cluster. `false`: none (the cluster settings were given
    /// some other way, or the instance was started by hand).
    #[serde(default = "yes")]
    pub user_data: bool,
}

pub fn default_instance_type() -> String {
    "m6i.xlarge".into()
}
pub fn default_os_version() -> String {
    "1.42.0".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capacity {
    #[serde(default)]
    pub cpu: Option<String>,
    #[serde(default)]
    pub memory: Option<String>,
    #[serde(default)]
    pub pods: Option<u32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KarpenterNode {
    pub node_pool: String,
    #[serde(default)]
    pub node_class: Option<String>,
    #[serde(default = "default_capacity_type")]
    pub capacity_type: String,
}

fn default_capacity_type() -> String {
    "on-demand".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePoolSpec {
    pub name: String,
    #[serde(default = "default_name")]
    pub node_class: String,
    /// `spec.disruption.consolidationPolicy`: `WhenEmptyOrUnderutilized` (Karpenter's default) also
    /// consolidates nodes whose pods fit elsewhere; `WhenEmpty` only removes empty ones.
    #[serde(default = "default_consolidation_policy")]
    pub consolidation_policy: String,
    /// `spec.disruption.consolidateAfter`, a Go duration (`10s`) or `Never`: how long after the last pod
    /// event a NodeClaim becomes Consolidatable.
    #[serde(default = "default_consolidate_after")]
    pub consolidate_after: String,
    /// `spec.template.spec.expireAfter` (copied to NodeClaims), a Go duration or `Never`.
    #[serde(default = "default_expire_after")]
    pub expire_after: String,
    /// `spec.template.spec.terminationGracePeriod` (copied to NodeClaims): the longest a drain may take
    /// once the NodeClaim is deleted, do-not-disrupt pods included.
    #[serde(default)]
    pub termination_grace_period: Option<String>,
    /// `spec.disruption.budgets` as Karpenter takes them.
    #[serde(default)]
    pub budgets: Option<Vec<Value>>,
    #[serde(default)]
    pub capacity_types: Option<Vec<String>>,
}

impl Scenario {
    /// Every NodePool the scenario runs: those it declares, then one with Karpenter's chart defaults for
    /// each pool a node group names but no entry declares (scale-5k declares none). A bench that changes
    /// the pools' disruption settings edits this list, or it edits nothing for such a scenario.
    pub fn node_pools_in_use(&self) -> Vec<NodePoolSpec> {
        let mut pools = self.node_pools.clone();
        let referenced: std::collections::BTreeSet<(String, String)> = self
            .nodes
            .iter()
            .filter_map(|g| g.karpenter.as_ref())
            .map(|k| {
                let class = k.node_class.clone().unwrap_or_else(default_name);
                (k.node_pool.clone(), class)
            })
            .collect();
        for (pool, class) in referenced {
            if !pools.iter().any(|p| p.name == pool) {
                pools.push(NodePoolSpec {
                    name: pool,
                    node_class: class,
                    consolidation_policy: default_consolidation_policy(),
                    consolidate_after: default_consolidate_after(),
                    expire_after: default_expire_after(),
                    termination_grace_period: None,
                    budgets: None,
                    capacity_types: None,
                });
            }
        }
        pools
    }
}

fn default_name() -> String {
    "default".into()
}
fn default_consolidation_policy() -> String {
    "WhenEmptyOrUnderutilized".into()
}
fn default_consolidate_after() -> String {
    "30s".into()
}
fn default_expire_after() -> String {
    "720h".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeClassSpec {
    pub name: String,
    #[serde(default = "default_ami_alias")]
    pub ami_alias: String,
    /// The AMI the class currently resolves to (status.amis); generated when absent.
    #[serde(default)]
    pub image_id: Option<String>,
    #[serde(default = "default_role")]
    pub role: String,
}

fn default_ami_alias() -> String {
    "bottlerocket@latest".into()
}
fn default_role() -> String {
    "KarpenterNodeRole-snapdrain-sim".into()
}

/// What every workload's pod template takes, under `pod:` (serde cannot flatten with deny_unknown_fields).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodShape {
    #[serde(default = "default_image")]
    pub image: String,
    #[serde(default = "default_cpu")]
    pub cpu: String,
    #[serde(default = "default_memory")]
    pub memory: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Pod template annotations (e.g. `backup.velero.io/backup-volumes`).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<Value>,
    #[serde(default)]
    pub termination_grace_period_seconds: Option<i64>,
}

impl Default for PodShape {
    fn default() -> Self {
        Self {
            image: default_image(),
            cpu: default_cpu(),
            memory: default_memory(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            termination_grace_period_seconds: None,
        }
    }
}

fn default_image() -> String {
    "public.ecr.aws/docker/library/busybox:1.37".into()
}
fn default_cpu() -> String {
    "100m".into()
}
fn default_memory() -> String {
    "128Mi".into()
}
pub fn default_namespace() -> String {
    "default".into()
}
fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatefulSetSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub pod: PodShape,
    #[serde(default)]
    pub volume_claim_templates: Vec<ClaimTemplate>,
    /// `OrderedReady` (default) or `Parallel`.
    #[serde(default)]
    pub pod_management_policy: Option<String>,
    #[serde(default)]
    pub service_name: Option<String>,
    #[serde(default)]
    pub pdb: Option<Budget>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimTemplate {
    #[serde(default = "default_claim_name")]
    pub name: String,
    #[serde(default = "default_size")]
    pub size: String,
    #[serde(default)]
    pub storage_class: Option<String>,
}

fn default_claim_name() -> String {
    "data".into()
}
fn default_size() -> String {
    "10Gi".into()
}

/// A PodDisruptionBudget for a workload: one of the two.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    #[serde(default)]
    pub min_available: Option<Value>,
    #[serde(default)]
    pub max_unavailable: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub pod: PodShape,
    #[serde(default)]
    pub pdb: Option<Budget>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub completions: Option<u32>,
    #[serde(default = "one")]
    pub parallelism: u32,
    /// How long each pod runs before it succeeds.
    #[serde(default)]
    pub run_for_ms: Option<u64>,
    #[serde(default)]
    pub pod: PodShape,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub pod: PodShape,
    /// Adds `operator: Exists` (tolerate every taint), as most node agents do.
    #[serde(default)]
    pub tolerate_all: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PdbSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub min_available: Option<Value>,
    #[serde(default)]
    pub max_unavailable: Option<Value>,
}

/// A Velero install as `velero install --provider aws --bucket ... --backup-location-config ...` makes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VeleroSpec {
    #[serde(default = "default_bucket")]
    pub bucket: String,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default = "default_region")]
    pub region: String,
    /// Filled from the simulated S3 endpoint when it is `${S3_URL}` (the default).
    #[serde(default = "default_s3_url")]
    pub s3_url: String,
    #[serde(default = "default_access_key")]
    pub access_key: String,
    #[serde(default = "default_secret_key")]
    pub secret_key: String,
    /// The node-agent DaemonSet (file-system backups).
    #[serde(default = "yes")]
    pub node_agent: bool,
    /// Where file-system backups move their data: `hostingPod` (Velero 1.17+, the default: a pod per
    /// PodVolumeBackup on the source node) or `nodeAgent` (Velero ≤ 1.16: inside the node-agent pod).
    #[serde(default)]
    pub data_path: crate::world::velero::DataPath,
    /// How Velero was installed: `cli` (`velero install`: Secret `cloud-credentials`) or `helm` (the
    /// vmware-tanzu chart, release `velero`: Secret named after the release, `velero`).
    #[serde(default)]
    pub install: VeleroInstall,
    /// Where Velero's AWS credentials come from: a `secret` mounted in its pod, or `irsa` (no Secret;
    /// the pod's service account has IAM role `roleArn`, as with `velero install --no-secret`).
    #[serde(default)]
    pub credentials: VeleroCredentials,
    #[serde(default = "default_role_arn")]
    pub role_arn: String,
    /// The BSL is for AWS S3: no `s3Url` and no `region` (Velero looks the region up), and the
    /// simulated endpoint stands for AWS S3 with the bucket living in `region`.
    #[serde(default)]
    pub aws_s3: bool,
    /// S3 is served over HTTPS with a certificate from a private CA (by default carried by the BSL in
    /// `objectStorage.caCert`: see `tlsCa`).
    #[serde(default)]
    pub tls: bool,
    /// With `tls`, who has the endpoint's CA.
    #[serde(default)]
    pub tls_ca: TlsCa,
    /// The BSL's `config.insecureSkipTLSVerify`, verbatim (Go `strconv.ParseBool` text: `"true"`, `"1"`,
    /// ...): velero-plugin-for-aws `config.go` `WithTLSSettings` then skips certificate verification.
    /// Spelt as in the BSL.
    #[serde(default, rename = "insecureSkipTLSVerify")]
    pub insecure_skip_tls_verify: Option<String>,
    /// Backups are written with SSE-C: a 32-byte key in Secret `velero-sse-c`, mounted in the Velero
    /// pod at `/sse-c`, named by the BSL's `config.customerKeyEncryptionFile: /sse-c/key`.
    #[serde(default)]
    pub sse_c: bool,
    /// Name of the BackupStorageLocation (marked `default: true`). `velero install` names it `default`;
    /// the Helm chart and many installs name it after the provider (`aws`, `minio`).
    #[serde(default = "default_location_name")]
    pub location_name: String,
}

fn default_location_name() -> String {
    "default".into()
}

impl Default for VeleroSpec {
    fn default() -> Self {
        Self {
            bucket: default_bucket(),
            prefix: None,
            region: default_region(),
            s3_url: default_s3_url(),
            access_key: default_access_key(),
            secret_key: default_secret_key(),
            node_agent: true,
            data_path: crate::world::velero::DataPath::default(),
            install: VeleroInstall::default(),
            credentials: VeleroCredentials::default(),
            role_arn: default_role_arn(),
            aws_s3: false,
            tls: false,
            tls_ca: TlsCa::default(),
            insecure_skip_tls_verify: None,
            sse_c: false,
            location_name: default_location_name(),
        }
    }
}

/// How Velero was installed (which decides its objects' names).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum VeleroInstall {
    #[default]
    Cli,
    Helm,
}

/// Who has the private CA of an S3 endpoint served over TLS.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TlsCa {
    /// The BSL's `objectStorage.caCert`.
    #[default]
    Location,
    /// The Velero pod's system trust store (a custom image, or a CA bundle injected into the pod as
    /// OpenShift does), to which the plugin adds `caCert`: the BSL carries none, so a client with its own
    /// system roots (snapdrain) does not trust the endpoint.
    VeleroImage,
    /// No one: only `insecureSkipTLSVerify` lets a client in.
    Nobody,
}

/// Where Velero's AWS credentials come from.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum VeleroCredentials {
    #[default]
    Secret,
    Irsa,
}

fn default_role_arn() -> String {
    "arn:aws:iam::111122223333:role/velero".into()
}

fn default_bucket() -> String {
    "velero".into()
}
fn default_region() -> String {
    "us-east-1".into()
}
pub fn default_s3_url() -> String {
    super::S3_URL_PLACEHOLDER.into()
}
fn default_access_key() -> String {
    "minio".into()
}
fn default_secret_key() -> String {
    "minio123".into()
}
fn yes() -> bool {
    true
}

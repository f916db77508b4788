//! A simulated EC2 endpoint that the real aws-sdk-ec2 talks to over HTTP (AWS EC2 query protocol).
//!
//! Instances boot after a configurable delay; Bottlerocket user data is validated at boot, and
//! the outcome is broadcast as [`InstanceEvent`]s so the rest of the simulator can make Nodes join.

mod actions;
mod autoscaling;
pub mod bottlerocket;
pub mod images;
mod params;
mod server;
mod snapshots;
mod state;
mod templates;
mod xml;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use bottlerocket::{BootError, HostSettings};
pub use images::ImageConfig;
pub use snapshots::PER_VOLUME_INTERVAL;
use state::{Instance, World};

/// Errors of the simulator handle itself (API errors go to clients as EC2 error documents).
#[derive(Debug, Error)]
pub enum Ec2SimError {
    #[error("could not bind the EC2 simulator to 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("instance {0} already exists in the EC2 simulator; pick another id")]
    DuplicateInstance(String),
    #[error("instance {0} does not exist in the EC2 simulator")]
    NotFound(String),
    #[error("subnet {0} is not configured in the EC2 simulator; add it to Ec2SimConfig::subnets")]
    UnknownSubnet(String),
}

/// A subnet and the availability zone it lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetConfig {
    pub id: String,
    pub zone: String,
}

/// The security group EKS creates for the cluster (control plane ↔ nodes): the one security group of
/// the simulator that reaches the control plane by default.
pub const CLUSTER_SECURITY_GROUP: &str = "sg-0c0ffee0000000001";
/// The VPC's default security group: an instance launched without SecurityGroupIds gets it, and it does
/// not reach the EKS control plane.
pub const DEFAULT_SECURITY_GROUP: &str = "sg-0defa000000000002";
/// The node IAM role's instance profile, as the cluster's node groups and Karpenter use it.
pub const NODE_INSTANCE_PROFILE: &str = "snapdrain-sim-node";

/// A security group and whether its rules let a node reach the cluster's control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroupConfig {
    pub id: String,
    pub name: String,
    pub reaches_control_plane: bool,
}

/// IMDS settings of an instance (`MetadataOptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataOptions {
    /// `optional` (IMDSv1 allowed) or `required` (IMDSv2 only).
    pub http_tokens: String,
    pub hop_limit: u32,
}

impl Default for MetadataOptions {
    /// EC2's defaults when RunInstances names none (an account without IMDS defaults set).
    fn default() -> Self {
        Self {
            http_tokens: "optional".into(),
            hop_limit: 1,
        }
    }
}

/// How to start the EC2 simulator.
#[derive(Debug, Clone)]
pub struct Ec2SimConfig {
    pub region: String,
    pub account_id: String,
    pub subnets: Vec<SubnetConfig>,
    /// Security groups of the VPC; an unknown id is refused (`InvalidGroup.NotFound`).
    pub security_groups: Vec<SecurityGroupConfig>,
    /// Instance profile names that exist (IAM); an unknown one is refused.
    pub instance_profiles: Vec<String>,
    /// AMIs the account can launch, with their architectures (DescribeImages; the architecture check of
    /// RunInstances and CreateFleet).
    pub images: Vec<ImageConfig>,
    /// pending → running (or → stopped when the user data is invalid).
    pub boot_delay: Duration,
    /// shutting-down → terminated.
    pub shutdown_delay: Duration,
    /// How fast an EBS snapshot reads its volume, MiB/s: a snapshot is `pending` for size / rate, then
    /// `completed` (0: at once).
    pub snapshot_mib_per_second: f64,
    /// How long after a snapshot of a volume starts another of it is refused with
    /// `SnapshotCreationPerVolumeRateExceeded` (EC2: 15 s; tests may set zero).
    pub snapshot_per_volume_interval: Duration,
}

impl Default for Ec2SimConfig {
    fn default() -> Self {
        let subnets = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, z)| SubnetConfig {
                id: format!("subnet-0{i}a1b2c3d4e5f6a7b8"),
                zone: format!("us-west-2{z}"),
            })
            .collect();
        Ec2SimConfig {
            region: "us-west-2".into(),
            account_id: "123456789012".into(),
            subnets,
            security_groups: vec![
                SecurityGroupConfig {
                    id: CLUSTER_SECURITY_GROUP.into(),
                    name: "eks-cluster-sg-snapdrain-sim".into(),
                    reaches_control_plane: true,
                },
                SecurityGroupConfig {
                    id: DEFAULT_SECURITY_GROUP.into(),
                    name: "default".into(),
                    reaches_control_plane: false,
                },
            ],
            instance_profiles: vec![NODE_INSTANCE_PROFILE.into()],
            images: images::default_images(),
            boot_delay: Duration::from_millis(50),
            shutdown_delay: Duration::from_millis(50),
            snapshot_mib_per_second: 0.0,
            snapshot_per_volume_interval: snapshots::PER_VOLUME_INTERVAL,
        }
    }
}

/// EC2 instance states with their API codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
}

impl InstanceState {
    pub fn code(self) -> u32 {
        match self {
            InstanceState::Pending => 0,
            InstanceState::Running => 16,
            InstanceState::ShuttingDown => 32,
            InstanceState::Terminated => 48,
            InstanceState::Stopping => 64,
            InstanceState::Stopped => 80,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
        }
    }
}

impl Ec2SimConfig {
    /// `arn:aws:iam::<account>:instance-profile/<name>`.
    pub fn instance_profile_arn(&self, name: &str) -> String {
        format!("arn:aws:iam::{}:instance-profile/{name}", self.account_id)
    }
}

/// What the rest of the simulator needs to know about an instance to turn it into a Node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InstanceInfo {
    pub id: String,
    pub instance_type: String,
    pub image_id: String,
    pub zone: String,
    pub subnet_id: String,
    pub private_ip: String,
    pub private_dns_name: String,
    pub tags: BTreeMap<String, String>,
    /// Valid Bottlerocket user data, once booted. `None` when the instance was launched without
    /// user data: it runs, but a Bottlerocket host without cluster settings never joins.
    pub user_data: Option<HostSettings>,
    /// Set when the host is up but kubelet refused its settings and exited, or cannot authenticate to
    /// or reach the API server (no instance profile, no security group to the control plane): no Node
    /// will join.
    pub kubelet_error: Option<String>,
    pub launch_time: jiff::Timestamp,
    pub spot: bool,
    /// The instance profile's ARN, if launched with one.
    pub iam_instance_profile: Option<String>,
    pub security_group_ids: Vec<String>,
    pub metadata_options: MetadataOptions,
}

impl InstanceInfo {
    /// `aws:///<zone>/<id>`, the Node's `spec.providerID`.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

/// An instance as tests see it.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSnapshot {
    pub info: InstanceInfo,
    pub state: InstanceState,
    /// `(code, message)`, e.g. why boot failed.
    pub state_reason: Option<(String, String)>,
    pub client_token: Option<String>,
}

/// A CreateFleet request as the simulator received it: how EC2 was asked to choose among the overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRequest {
    pub default_capacity_type: String,
    pub on_demand_allocation_strategy: Option<String>,
    pub spot_allocation_strategy: Option<String>,
    pub overrides: Vec<FleetOverrideRecord>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FleetOverrideRecord {
    pub instance_type: String,
    pub subnet_id: Option<String>,
    pub priority: Option<f64>,
}

/// An Auto Scaling group as tests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoScalingGroupSnapshot {
    pub name: String,
    pub desired: u32,
    /// Members that are not terminated (or terminating).
    pub members: Vec<String>,
}

/// The tag EC2 Auto Scaling puts on every instance of a group (and EKS managed node groups use).
pub const ASG_NAME_TAG: &str = "aws:autoscaling:groupName";

/// Lifecycle changes, broadcast to subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum InstanceEvent {
    /// Reached `running`; if `instance.user_data` is set, the host would join that cluster.
    /// Boxed: an InstanceInfo is much larger than the other variants.
    Booted { instance: Box<InstanceInfo> },
    /// Went to `stopped` instead of `running`; no Node should join.
    BootFailed { id: String, reason: String },
    /// Reached `terminated`.
    Terminated { id: String },
}

/// An EBS volume attached to an instance, as EC2 knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedVolume {
    pub volume_id: String,
    pub size_gib: u64,
    pub device: String,
    /// The instance's root volume (what `ExcludeBootVolume` leaves out).
    pub boot: bool,
    /// The volume's tags (`CopyTagsFromSource=volume` copies them to its snapshots).
    pub tags: BTreeMap<String, String>,
}

/// Where EC2 learns the volumes attached to an instance besides its root volume: the cluster answers
/// from its VolumeAttachments of EBS CSI volumes.
pub type VolumeSource = Arc<dyn Fn(&str) -> Vec<AttachedVolume> + Send + Sync>;

/// EC2's `SnapshotState` values the simulator uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    Pending,
    Completed,
    Error,
}

impl SnapshotState {
    pub fn name(self) -> &'static str {
        match self {
            SnapshotState::Pending => "pending",
            SnapshotState::Completed => "completed",
            SnapshotState::Error => "error",
        }
    }
}

/// An EBS snapshot as tests see it (the simulator's own record, for oracles).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRecord {
    pub id: String,
    pub volume_id: String,
    pub volume_size_gib: u64,
    pub start_time: jiff::Timestamp,
    pub state: SnapshotState,
    pub progress: u8,
    pub tags: BTreeMap<String, String>,
    pub description: String,
    /// `CreateSnapshots` or `CreateSnapshot`.
    pub action: &'static str,
}

/// A fresh `i-` + 17 hex characters id.
pub fn random_instance_id() -> String {
    format!("i-{}", &uuid::Uuid::new_v4().simple().to_string()[..17])
}

/// Handle to a running EC2 simulator. Clones share it; the server stops when the last one drops.
#[derive(Clone)]
pub struct Ec2Sim {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// State shared by the HTTP handlers and the lifecycle timers.
pub(crate) struct Shared {
    config: Ec2SimConfig,
    world: Mutex<World>,
    events: broadcast::Sender<InstanceEvent>,
    outage: AtomicBool,
    /// The simulator's fault rules (`ec2` kind), once the cluster attaches them.
    faults: std::sync::OnceLock<Arc<crate::apiserver::faults::Faults>>,
    /// Volumes attached to instances, as the cluster knows them (once set).
    volume_source: std::sync::OnceLock<VolumeSource>,
}

impl Shared {
    /// Whether a fault rule leaves the launch `action` without capacity now.
    fn capacity_short(&self, action: &str) -> bool {
        self.faults.get().is_some_and(|f| f.ec2_capacity(action))
    }

    fn world(&self) -> MutexGuard<'_, World> {
        // A panic while holding the lock leaves plain data behind, still usable by a simulator.
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: InstanceEvent) {
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    /// Starts the boot timer of a freshly launched instance.
    fn schedule_boot(self: &Arc<Self>, id: String) {
        let shared = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(shared.config.boot_delay).await;
            shared.finish_boot(&id);
        });
    }

    fn finish_boot(&self, id: &str) {
        let event = {
            let mut world = self.world();
            let Some(inst) = world.instances.get_mut(id) else {
                return;
            };
            // Terminated while pending: nothing boots.
            if inst.state != InstanceState::Pending {
                return;
            }
            match inst.raw_user_data.as_deref().map(bottlerocket::boot) {
                Some(Err(BootError::Settings(m))) => {
                    let reason = BootError::Settings(m).to_string();
                    inst.state = InstanceState::Stopped;
                    inst.state_reason = Some((
                        "Client.InstanceInitiatedShutdown".into(),
                        format!("Client.InstanceInitiatedShutdown: {reason}"),
                    ));
                    InstanceEvent::BootFailed {
                        id: id.to_string(),
                        reason,
                    }
                }
                booted => {
                    match booted {
                        Some(Ok(host)) => {
                            inst.info.kubelet_error = join_problem(&self.config, &inst.info);
                            inst.info.user_data = Some(host);
                        }
                        Some(Err(refused)) => inst.info.kubelet_error = Some(refused.to_string()),
                        None => {}
                    }
                    inst.state = InstanceState::Running;
                    InstanceEvent::Booted {
                        instance: Box::new(inst.info.clone()),
                    }
                }
            }
        };
        self.emit(event);
    }

    /// Begins termination; returns (previous, current) state. Idempotent.
    fn begin_terminate(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<(InstanceState, InstanceState), Ec2SimError> {
        let prev = {
            let mut world = self.world();
            let inst = world
                .instances
                .get_mut(id)
                .ok_or_else(|| Ec2SimError::NotFound(id.to_string()))?;
            let prev = inst.state;
            if matches!(
                prev,
                InstanceState::ShuttingDown | InstanceState::Terminated
            ) {
                return Ok((prev, prev));
            }
            inst.state = InstanceState::ShuttingDown;
            inst.state_reason = Some((
                "Client.UserInitiatedShutdown".into(),
                "Client.UserInitiatedShutdown: User initiated shutdown".into(),
            ));
            prev
        };
        for launched in self.keep_group_capacity(id) {
            self.schedule_boot(launched);
        }
        let shared = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(shared.config.shutdown_delay).await;
            let done = {
                let mut world = shared.world();
                match world.instances.get_mut(&id) {
                    Some(inst) if inst.state == InstanceState::ShuttingDown => {
                        inst.state = InstanceState::Terminated;
                        true
                    }
                    _ => false,
                }
            };
            if done {
                shared.emit(InstanceEvent::Terminated { id });
            }
        });
        Ok((prev, InstanceState::ShuttingDown))
    }
}

/// Why a booted Bottlerocket host with valid cluster settings still cannot register its Node, if it
/// cannot. The aws-k8s variants authenticate kubelet to EKS with the node role through IMDS
/// (aws-iam-authenticator; Bottlerocket QUICKSTART-EKS launches with a node instance profile), so without
/// an instance profile IMDS serves no credentials; and kubelet must reach the API server, which the VPC's
/// default security group does not allow (EKS user guide, "Amazon EKS security group requirements").
fn join_problem(config: &Ec2SimConfig, info: &InstanceInfo) -> Option<String> {
    if info.iam_instance_profile.is_none() {
        return Some(
            "kubelet could not authenticate to the EKS API server: the instance has no IAM instance profile, so IMDS serves no node-role credentials".into(),
        );
    }
    let reaches = info.security_group_ids.iter().any(|id| {
        config
            .security_groups
            .iter()
            .any(|g| &g.id == id && g.reaches_control_plane)
    });
    if !reaches {
        return Some(format!(
            "kubelet could not reach the EKS API server: security groups {:?} do not allow traffic to the control plane",
            info.security_group_ids
        ));
    }
    None
}

impl Shared {
    /// After `gone` left service: its Auto Scaling group (if any) launches copies of it until the group
    /// is back at its desired capacity. Returns the launched ids (their boot timers still to start).
    fn keep_group_capacity(&self, gone: &str) -> Vec<String> {
        let mut world = self.world();
        let Some(name) = world
            .groups
            .iter()
            .find(|(_, g)| g.members.iter().any(|m| m == gone))
            .map(|(n, _)| n.clone())
        else {
            return Vec::new();
        };
        let Some(template) = world.instances.get(gone).map(|i| {
            (
                i.info.clone(),
                i.raw_user_data.clone(),
                self.config
                    .subnets
                    .iter()
                    .position(|s| s.id == i.info.subnet_id)
                    .unwrap_or(0),
            )
        }) else {
            return Vec::new();
        };
        let live: Vec<String> = world.groups[&name]
            .members
            .iter()
            .filter(|m| {
                world.instances.get(*m).is_some_and(|i| {
                    !matches!(
                        i.state,
                        InstanceState::ShuttingDown | InstanceState::Terminated
                    )
                })
            })
            .cloned()
            .collect();
        let desired = world.groups[&name].desired as usize;
        let mut launched = Vec::new();
        let mut members = live.clone();
        while members.len() < desired {
            let (info, user_data, subnet_index) = &template;
            let ip = world.allocate_ip(*subnet_index);
            let id = random_instance_id();
            let mut info = info.clone();
            info.id = id.clone();
            info.private_dns_name = state::private_dns_name(&ip, &self.config.region);
            info.private_ip = ip;
            info.user_data = None;
            info.kubelet_error = None;
            info.launch_time = jiff::Timestamp::now();
            world.insert(Instance {
                info,
                state: InstanceState::Pending,
                state_reason: None,
                reservation_id: state::random_id("r-"),
                client_token: None,
                raw_user_data: user_data.clone(),
            });
            members.push(id.clone());
            launched.push(id);
        }
        if let Some(g) = world.groups.get_mut(&name) {
            g.members = members;
        }
        launched
    }
}

impl Ec2Sim {
    /// Puts running instances into a new Auto Scaling group whose desired capacity is their number, and
    /// tags them `aws:autoscaling:groupName` as EC2 Auto Scaling does.
    pub fn create_auto_scaling_group(&self, name: &str, ids: &[String]) -> Result<(), Ec2SimError> {
        let mut world = self.handle.shared.world();
        for id in ids {
            let inst = world
                .instances
                .get_mut(id)
                .ok_or_else(|| Ec2SimError::NotFound(id.clone()))?;
            inst.info.tags.insert(ASG_NAME_TAG.into(), name.into());
        }
        world.groups.insert(
            name.to_string(),
            state::AutoScalingGroup {
                desired: ids.len() as u32,
                members: ids.to_vec(),
            },
        );
        Ok(())
    }

    pub fn auto_scaling_group(&self, name: &str) -> Option<AutoScalingGroupSnapshot> {
        let world = self.handle.shared.world();
        let g = world.groups.get(name)?;
        Some(AutoScalingGroupSnapshot {
            name: name.to_string(),
            desired: g.desired,
            members: g
                .members
                .iter()
                .filter(|m| {
                    world.instances.get(*m).is_some_and(|i| {
                        !matches!(
                            i.state,
                            InstanceState::ShuttingDown | InstanceState::Terminated
                        )
                    })
                })
                .cloned()
                .collect(),
        })
    }

    /// Names of the launch templates that exist.
    pub fn launch_template_names(&self) -> Vec<String> {
        self.handle
            .shared
            .world()
            .templates
            .values()
            .map(|t| t.name.clone())
            .collect()
    }

    /// Every CreateFleet request received, oldest first.
    pub fn fleet_requests(&self) -> Vec<FleetRequest> {
        self.handle.shared.world().fleet_requests.clone()
    }

    /// Binds 127.0.0.1:0 and starts serving the EC2 API.
    pub async fn start(config: Ec2SimConfig) -> Result<Ec2Sim, Ec2SimError> {
        let (events, _) = broadcast::channel(4096);
        let mut world = World::default();
        world.images = config
            .images
            .iter()
            .map(|i| (i.id.clone(), i.clone()))
            .collect();
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            config,
            events,
            outage: AtomicBool::new(false),
            faults: std::sync::OnceLock::new(),
            volume_source: std::sync::OnceLock::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Ec2SimError::Bind)?;
        let addr = listener.local_addr().map_err(Ec2SimError::Bind)?;
        let server = tokio::spawn(server::serve(listener, shared.clone()));
        Ok(Ec2Sim {
            handle: Arc::new(Handle {
                shared,
                addr,
                server,
            }),
        })
    }

    /// `http://127.0.0.1:PORT`, for `AWS_ENDPOINT_URL_EC2` or an SDK `endpoint_url`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.handle.addr)
    }

    pub fn config(&self) -> &Ec2SimConfig {
        &self.handle.shared.config
    }

    pub fn subscribe(&self) -> broadcast::Receiver<InstanceEvent> {
        self.handle.shared.events.subscribe()
    }

    /// Adds an instance that is already running (for Nodes a scenario starts with), launched without
    /// user data. No `Booted` event is sent: the scenario already has that Node.
    pub fn insert_running(&self, info: InstanceInfo) -> Result<(), Ec2SimError> {
        self.insert_running_with_user_data(info, None)
    }

    /// Like [`Ec2Sim::insert_running`], launched with this (plain, not base64) user data, which
    /// DescribeInstanceAttribute then returns as EC2 does.
    pub fn insert_running_with_user_data(
        &self,
        info: InstanceInfo,
        user_data: Option<&str>,
    ) -> Result<(), Ec2SimError> {
        let shared = &self.handle.shared;
        if !shared.config.subnets.iter().any(|s| s.id == info.subnet_id) {
            return Err(Ec2SimError::UnknownSubnet(info.subnet_id));
        }
        let mut world = shared.world();
        if world.instances.contains_key(&info.id) {
            return Err(Ec2SimError::DuplicateInstance(info.id));
        }
        // An instance that runs proves its image exists, with an architecture its type runs.
        if !world.images.contains_key(&info.image_id)
            && let Some(arch) = images::instance_type_architectures(&info.instance_type)
                .and_then(|a| a.iter().find(|a| **a != "i386"))
        {
            world.images.insert(
                info.image_id.clone(),
                ImageConfig {
                    id: info.image_id.clone(),
                    name: format!("image of {}", info.id),
                    architecture: arch.to_string(),
                    creation_date: "2026-01-01T00:00:00.000Z".into(),
                },
            );
        }
        world.insert(Instance {
            reservation_id: state::random_id("r-"),
            state: InstanceState::Running,
            state_reason: None,
            client_token: None,
            raw_user_data: user_data.map(|u| u.as_bytes().to_vec()),
            info,
        });
        Ok(())
    }

    /// Makes an AMI known to the account (a newly published Bottlerocket release, an image shared with
    /// it); an image with the same id is replaced.
    pub fn register_image(&self, image: ImageConfig) {
        self.handle
            .shared
            .world()
            .images
            .insert(image.id.clone(), image);
    }

    /// Terminates an instance in-process (as simulated Karpenter would through the API).
    pub fn terminate(&self, id: &str) -> Result<(), Ec2SimError> {
        self.handle.shared.begin_terminate(id).map(|_| ())
    }

    /// From now on, launches of `instance_type` (in `zone`, or anywhere) fail with `code`,
    /// e.g. `InsufficientInstanceCapacity`.
    pub fn inject_capacity_error(&self, instance_type: &str, zone: Option<&str>, code: &str) {
        self.handle.shared.world().faults.push(state::Fault {
            instance_type: instance_type.into(),
            zone: zone.map(str::to_string),
            code: code.into(),
        });
    }

    pub fn clear_faults(&self) {
        self.handle.shared.world().faults.clear();
    }

    /// Follows the `ec2` rules of the simulator's fault rules (`/sim/faults`) from now on.
    pub fn attach_faults(&self, faults: Arc<crate::apiserver::faults::Faults>) {
        let _ = self.handle.shared.faults.set(faults);
    }

    /// Learns the volumes attached to each instance from `source` from now on (set once).
    pub fn set_volume_source(&self, source: VolumeSource) {
        let _ = self.handle.shared.volume_source.set(source);
    }

    /// Attaches an EBS volume to an instance in-process.
    pub fn attach_volume(
        &self,
        instance_id: &str,
        volume: AttachedVolume,
    ) -> Result<(), Ec2SimError> {
        let mut world = self.handle.shared.world();
        if !world.instances.contains_key(instance_id) {
            return Err(Ec2SimError::NotFound(instance_id.to_string()));
        }
        world
            .attached
            .entry(instance_id.to_string())
            .or_default()
            .push(volume);
        Ok(())
    }

    /// The volumes attached to an instance now, root volume first (None: no such instance).
    pub fn attached_volumes(&self, instance_id: &str) -> Option<Vec<AttachedVolume>> {
        snapshots::attached_volumes(&self.handle.shared, instance_id)
    }

    /// From now on, snapshots of `volume_id` end in `error` instead of `completed`.
    pub fn fail_snapshots_of(&self, volume_id: &str) {
        self.handle
            .shared
            .world()
            .failing_volumes
            .insert(volume_id.to_string());
    }

    /// Every EBS snapshot ever started, oldest first, in its state now.
    pub fn snapshots(&self) -> Vec<SnapshotRecord> {
        let now = std::time::Instant::now();
        self.handle
            .shared
            .world()
            .snapshots
            .iter()
            .map(|s| s.record(now))
            .collect()
    }

    /// While on, every request gets 503 `ServiceUnavailable`.
    pub fn set_outage(&self, on: bool) {
        self.handle.shared.outage.store(on, Ordering::SeqCst);
    }

    /// Every instance ever launched or inserted, terminated ones included, oldest first.
    pub fn instances(&self) -> Vec<InstanceSnapshot> {
        self.handle
            .shared
            .world()
            .ordered()
            .map(Instance::snapshot)
            .collect()
    }

    pub fn instance(&self, id: &str) -> Option<InstanceSnapshot> {
        self.handle
            .shared
            .world()
            .instances
            .get(id)
            .map(Instance::snapshot)
    }
}

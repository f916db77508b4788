//! A simulated EC2 endpoint that the real aws-sdk-ec2 talks to over HTTP (AWS EC2 query protocol).
//!
//! Instances boot after a configurable delay; Bottlerocket user data is validated at boot, and
//! the outcome is broadcast as [`InstanceEvent`]s so the rest of the simulator can make Nodes join.

mod actions;
pub mod bottlerocket;
mod params;
mod server;
mod state;
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

/// How to start the EC2 simulator.
#[derive(Debug, Clone)]
pub struct Ec2SimConfig {
    pub region: String,
    pub account_id: String,
    pub subnets: Vec<SubnetConfig>,
    /// pending → running (or → stopped when the user data is invalid).
    pub boot_delay: Duration,
    /// shutting-down → terminated.
    pub shutdown_delay: Duration,
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
            boot_delay: Duration::from_millis(50),
            shutdown_delay: Duration::from_millis(50),
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

/// What the rest of the simulator needs to know about an instance to turn it into a Node.
#[derive(Debug, Clone, PartialEq)]
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
    /// Set when the host is up but kubelet refused its settings and exited: no Node will join.
    pub kubelet_error: Option<String>,
    pub launch_time: jiff::Timestamp,
    pub spot: bool,
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
}

impl Shared {
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
                        Some(Ok(host)) => inst.info.user_data = Some(host),
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

impl Ec2Sim {
    /// Binds 127.0.0.1:0 and starts serving the EC2 API.
    pub async fn start(config: Ec2SimConfig) -> Result<Ec2Sim, Ec2SimError> {
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            world: Mutex::new(World::default()),
            config,
            events,
            outage: AtomicBool::new(false),
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

    /// Adds an instance that is already running (for Nodes a scenario starts with).
    /// No `Booted` event is sent: the scenario already has that Node.
    pub fn insert_running(&self, info: InstanceInfo) -> Result<(), Ec2SimError> {
        let shared = &self.handle.shared;
        if !shared.config.subnets.iter().any(|s| s.id == info.subnet_id) {
            return Err(Ec2SimError::UnknownSubnet(info.subnet_id));
        }
        let mut world = shared.world();
        if world.instances.contains_key(&info.id) {
            return Err(Ec2SimError::DuplicateInstance(info.id));
        }
        world.insert(Instance {
            reservation_id: state::random_id("r-"),
            state: InstanceState::Running,
            state_reason: None,
            client_token: None,
            raw_user_data: None,
            info,
        });
        Ok(())
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

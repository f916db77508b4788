//! A whole simulated cluster in one handle: the API server, the CRDs and scenario it was started with,
//! and the world controllers around it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::apiserver::audit::Audit;
use super::apiserver::faults::Faults;
use super::apiserver::resources::ResKey;
use super::apiserver::store::{Store, WriteOptions};
use super::apiserver::{ApiServer, Settings, kubeconfig};
use super::error::SimError;
use super::scenario::{self, LoadedScenario, S3_URL_FALLBACK, Scenario, crds, timeline};
use super::world::{Timings, World, WorldContext};

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
    /// Run the world controllers (kubelet, scheduler, workload controllers, ...) and serve the Velero and
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

        // Cloud simulators. The S3 simulator (`sim::s3::S3Sim`) starts here when it is part of the build:
        // its `endpoint()` becomes `s3_url` (filling `${S3_URL}` in the BSL) and `WorldContext::s3_endpoint`,
        // and the BSL bucket is created in it. The EC2 simulator (`sim::ec2::Ec2Sim`) starts here too: every
        // `loaded.instances` entry is registered with `insert_running`, and its `subscribe()` feed goes to
        // the EC2-nodes controller through the WorldContext.
        let s3_url = config
            .s3_url
            .clone()
            .unwrap_or_else(|| S3_URL_FALLBACK.to_string());

        let loaded = match &config.scenario {
            None => None,
            Some(source) => {
                let (scn, label) = match source {
                    ScenarioSource::Named(n) => scenario::resolve(n)?,
                    ScenarioSource::Inline { scenario, label } => {
                        ((**scenario).clone(), label.clone())
                    }
                };
                Some(scenario::load(&store, &scn, &label, &s3_url)?)
            }
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
        .map_err(|e| SimError::Bind {
            addr: config.addr,
            source: e,
        })?;
        let (world, context) = if with_world {
            let timings = config
                .timings
                .clone()
                .or_else(|| loaded.as_ref().map(|l| l.timings.clone()))
                .unwrap_or_default();
            let mut ctx = WorldContext::new(store.clone(), audit.clone(), faults.clone(), timings);
            ctx.s3_endpoint = config.s3_url.clone();
            let ctx = Arc::new(ctx);
            let mut world = World::start(ctx.clone());
            if let Some(l) = &loaded
                && !l.timeline.is_empty()
            {
                world.adopt(timeline::spawn(ctx.clone(), l.timeline.clone()));
            }
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
        })
    }

    pub fn url(&self) -> String {
        self.api.url()
    }

    /// Writes a kubeconfig for this cluster and returns its path.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<PathBuf, SimError> {
        std::fs::write(path, kubeconfig(&self.url())).map_err(|e| SimError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Ok(path.to_path_buf())
    }
}

/// Creates one object given as a full manifest (apiVersion, kind, metadata), keeping its status.
pub fn load_object(store: &Store, obj: Value) -> Result<(), String> {
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or("apiVersion is missing")?;
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("kind is missing")?;
    let def = store
        .registry()
        .by_kind(api_version, kind)
        .cloned()
        .ok_or_else(|| format!("no resource serves {api_version} {kind} (create its CustomResourceDefinition first)"))?;
    let ns = if def.namespaced {
        Some(
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string(),
        )
    } else {
        None
    };
    if let Some(ns) = &ns
        && store.get(&ResKey::core("namespaces"), None, ns).is_none()
    {
        store
            .create(
                &ResKey::core("namespaces"),
                None,
                json!({"metadata": {"name": ns}}),
                WriteOptions::default(),
            )
            .map_err(|e| e.message)?;
    }
    store
        .create(
            &def.key(),
            ns.as_deref(),
            obj,
            WriteOptions {
                internal: true,
                ..Default::default()
            },
        )
        .map(|_| ())
        .map_err(|e| e.message)
}

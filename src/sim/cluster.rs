//! A whole simulated cluster in one handle: the API server and, as they are added, the world around it.

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

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub addr: SocketAddr,
    /// Objects to create at start (a scenario), in order.
    pub objects: Vec<Value>,
    pub settings: Settings,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            objects: Vec::new(),
            settings: Settings::default(),
        }
    }
}

pub struct SimCluster {
    pub store: Store,
    pub audit: Arc<Audit>,
    pub faults: Arc<Faults>,
    pub api: ApiServer,
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
        Ok(Self {
            store,
            audit,
            faults,
            api,
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

//! One object from a full manifest into the store: what the scenario loader, the timeline and a
//! cluster's extra objects all create through. Here rather than in `cluster`, the composition root, so
//! that the scenario does not import what assembles it.

use serde_json::{Value, json};

use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{Store, WriteOptions};

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

//! Waiting on cluster state by watch, never by polling sleeps: a reflector follows the objects and the
//! condition is checked after every change, with a timeout.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;

use super::DrainError;

/// Watches `api` (filtered by `config`) until `done` holds for the current set of objects, or `timeout`
/// passes. Returns whether the condition was met.
pub async fn wait_for<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    timeout: Duration,
    done: impl Fn(&[Arc<K>]) -> bool,
) -> Result<bool, DrainError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store::<K>();
    let mut stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .boxed();
    let wait = async {
        let mut ready = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => ready = true,
                Ok(_) => {}
                // Transient watch errors are retried by the backoff; keep waiting.
                Err(e) => tracing::debug!(error = %e, what, "watch error while waiting"),
            }
            if ready && done(&reader.state()) {
                return true;
            }
        }
        false
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(met) => Ok(met),
        Err(_) => Ok(false),
    }
}

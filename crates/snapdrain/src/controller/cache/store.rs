//! One cached kind: the objects by namespace/name, an index by one string key (a pod's node, a PVC's
//! namespace), readiness and a change counter. Pure state changes ([`State::apply`]) fed by a watcher;
//! readers see one consistent snapshot per call (objects and index change under one lock).
//!
//! A relist (first start, a 410 Gone after compaction, a watch that cannot resume) arrives as
//! `Init`, `InitApply`..., `InitDone` (kube-runtime watcher): the new list is built aside and swapped in
//! whole at `InitDone`, so an object deleted while the watch was down leaves the cache and the index, as
//! client-go's reflector `Replace` does (kubernetes/client-go tools/cache/reflector.go, store.go).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::runtime::watcher::Event;
use tokio::sync::{broadcast, watch};

/// What a cache can hold: an object with a namespace ("" for cluster-scoped kinds) and a name. Every
/// `kube::Resource` is one; [`super::CachedPod`] is one without being a Resource.
pub trait Stored {
    fn namespace_name(&self) -> (&str, &str);

    /// The cache's key for the object; a type that holds its names shared gives them without a copy.
    fn key(&self) -> (Arc<str>, Arc<str>) {
        let (namespace, name) = self.namespace_name();
        (Arc::from(namespace), Arc::from(name))
    }
}

impl<K: kube::Resource> Stored for K {
    fn namespace_name(&self) -> (&str, &str) {
        let m = self.meta();
        (
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or(""),
        )
    }
}

/// What the index is keyed by: `None` leaves an object out of the index (an unscheduled pod).
pub type IndexFn<K> = fn(&K) -> Option<String>;

/// The objects of one list, by namespace then name, with their index. The index holds the same `Arc`s
/// (no copy of any key or object: at 150,000 pods a second set of namespace/name strings is tens of MiB).
struct Objects<K> {
    by_key: HashMap<Arc<str>, HashMap<Arc<str>, Arc<K>>>,
    len: usize,
    index: HashMap<String, Vec<Arc<K>>>,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            len: 0,
            index: HashMap::new(),
        }
    }
}

impl<K: Stored> Objects<K> {
    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<K>> {
        self.by_key.get(namespace)?.get(name)
    }

    fn insert(&mut self, index_by: IndexFn<K>, obj: K) -> Arc<K> {
        let (namespace, name) = obj.key();
        let obj = Arc::new(obj);
        if let Some(b) = index_by(&obj) {
            self.index.entry(b).or_default().push(obj.clone());
        }
        let old = self
            .by_key
            .entry(namespace)
            .or_default()
            .insert(name, obj.clone());
        match old {
            Some(old) => self.unindex(index_by, &old),
            None => self.len += 1,
        }
        obj
    }

    fn remove(&mut self, index_by: IndexFn<K>, obj: &K) {
        // The stored object, not the deleted one, says where it is indexed (a final state may differ).
        let (namespace, name) = obj.namespace_name();
        let Some(names) = self.by_key.get_mut(namespace) else {
            return;
        };
        let Some(old) = names.remove(name) else {
            return;
        };
        if names.is_empty() {
            self.by_key.remove(namespace);
        }
        self.len -= 1;
        self.unindex(index_by, &old);
    }

    fn unindex(&mut self, index_by: IndexFn<K>, stored: &Arc<K>) {
        let Some(bucket) = index_by(stored) else {
            return;
        };
        if let Some(objs) = self.index.get_mut(&bucket) {
            objs.retain(|o| !Arc::ptr_eq(o, stored));
            if objs.is_empty() {
                self.index.remove(&bucket);
            }
        }
    }
}

/// The cache's state; [`State::apply`] is the whole of its logic.
pub struct State<K> {
    live: Objects<K>,
    /// A relist in progress (between `Init` and `InitDone`).
    building: Option<Objects<K>>,
    /// True once the first list is in: before that, an empty cache means "not known", not "none".
    synced: bool,
    /// Completed lists (1 after start-up; more after each relist).
    lists: u64,
    index_by: IndexFn<K>,
}

impl<K: Stored> State<K> {
    pub fn new(index_by: IndexFn<K>) -> Self {
        Self {
            live: Objects::default(),
            building: None,
            synced: false,
            lists: 0,
            index_by,
        }
    }

    /// Applies one watcher event. Returns the object when it was added or changed (for followers).
    pub fn apply(&mut self, event: Event<K>) -> Option<Arc<K>> {
        let index_by = self.index_by;
        match event {
            Event::Init => {
                self.building = Some(Objects::default());
                None
            }
            Event::InitApply(obj) => {
                let building = self.building.get_or_insert_with(Objects::default);
                Some(building.insert(index_by, obj))
            }
            Event::InitDone => {
                self.live = self.building.take().unwrap_or_default();
                self.synced = true;
                self.lists += 1;
                None
            }
            Event::Apply(obj) => Some(self.live.insert(index_by, obj)),
            Event::Delete(obj) => {
                self.live.remove(index_by, &obj);
                None
            }
        }
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.live.get(namespace, name).cloned()
    }

    /// The objects whose index key is `bucket` (the pods of a node), in namespace/name order.
    pub fn indexed(&self, bucket: &str) -> Vec<Arc<K>> {
        let mut objs = self.live.index.get(bucket).cloned().unwrap_or_default();
        objs.sort_by(|a, b| a.namespace_name().cmp(&b.namespace_name()));
        objs
    }

    pub fn all(&self) -> Vec<Arc<K>> {
        self.live
            .by_key
            .values()
            .flat_map(|names| names.values().cloned())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.live.len
    }

    pub fn is_empty(&self) -> bool {
        self.live.len == 0
    }
}

struct Shared<K> {
    kind: &'static str,
    state: RwLock<State<K>>,
    /// Bumped after every event: waits re-check their condition on it.
    changed: watch::Sender<u64>,
    /// Objects added or changed, for followers that act per object (the hold keeper). A follower that
    /// lags looks at the whole cache instead.
    applied: broadcast::Sender<Arc<K>>,
}

/// A cache of one kind, shared by every reader of the process. Cheap to clone.
pub struct Cache<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Stored> Cache<K> {
    pub fn new(kind: &'static str, index_by: IndexFn<K>) -> Self {
        let (changed, _) = watch::channel(0);
        let (applied, _) = broadcast::channel(1024);
        Self {
            shared: Arc::new(Shared {
                kind,
                state: RwLock::new(State::new(index_by)),
                changed,
                applied,
            }),
        }
    }

    /// The kind, as in `snapdrain_cache_objects{kind}` and log lines.
    pub fn kind(&self) -> &'static str {
        self.shared.kind
    }

    fn read<T>(&self, f: impl FnOnce(&State<K>) -> T) -> T {
        // A panic while holding the lock cannot leave State half-changed in a way readers care about:
        // each change is one map operation; read through a poisoned lock.
        let state = self.shared.state.read().unwrap_or_else(|e| e.into_inner());
        f(&state)
    }

    /// Applies one watcher event and wakes the waits.
    pub fn apply(&self, event: Event<K>) {
        let applied = {
            let mut state = self.shared.state.write().unwrap_or_else(|e| e.into_inner());
            state.apply(event)
        };
        if let Some(obj) = applied {
            // No follower listening is fine.
            let _ = self.shared.applied.send(obj);
        }
        self.shared.changed.send_modify(|n| *n += 1);
    }

    pub fn synced(&self) -> bool {
        self.read(|s| s.synced)
    }

    /// Completed lists so far (a relist after a 410 adds one).
    pub fn lists(&self) -> u64 {
        self.read(|s| s.lists)
    }

    pub fn len(&self) -> usize {
        self.read(State::len)
    }

    pub fn is_empty(&self) -> bool {
        self.read(State::is_empty)
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.read(|s| s.get(namespace, name))
    }

    pub fn indexed(&self, bucket: &str) -> Vec<Arc<K>> {
        self.read(|s| s.indexed(bucket))
    }

    pub fn all(&self) -> Vec<Arc<K>> {
        self.read(State::all)
    }

    /// Objects added or changed from now on.
    pub fn follow(&self) -> broadcast::Receiver<Arc<K>> {
        self.shared.applied.subscribe()
    }

    /// A receiver that changes after every event.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Waits up to `timeout` for the first list. True when it is in.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, |_| true).await
    }

    /// Waits up to `timeout` for the cache to be synced and `done` to hold, re-checking after every
    /// event. True when it held.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let mut changes = self.changes();
        let wait = async {
            loop {
                changes.borrow_and_update();
                if self.synced() && done(self) {
                    return true;
                }
                if changes.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }
}

impl Cache<k8s_openapi::api::core::v1::Namespace> {
    /// The labels of `pod`'s namespace, for a DisruptionPolicy's `namespaceSelector`; `None` while the
    /// namespace is not cached (each reader decides what that means: wait, or protect more).
    pub fn labels_of(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
    ) -> Option<std::collections::BTreeMap<String, String>> {
        let ns = pod.metadata.namespace.as_deref()?;
        self.get("", ns)
            .map(|n| n.metadata.labels.clone().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": []});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": spec
        }))
        .expect("a minimal pod deserializes")
    }

    fn node_of(p: &Pod) -> Option<String> {
        p.spec.as_ref().and_then(|s| s.node_name.clone())
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    fn synced_with(pods: &[Pod]) -> State<Pod> {
        let mut s = State::new(node_of as IndexFn<Pod>);
        s.apply(Event::Init);
        for p in pods {
            s.apply(Event::InitApply(p.clone()));
        }
        s.apply(Event::InitDone);
        s
    }

    #[test]
    fn the_node_index_follows_binding_and_deletion() {
        let mut s = synced_with(&[pod("a", Some("n1")), pod("b", None)]);
        assert!(s.synced);
        assert_eq!(names(&s.indexed("n1")), ["a"]);
        // Bound by the scheduler: moves into the node's bucket.
        s.apply(Event::Apply(pod("b", Some("n2"))));
        assert_eq!(names(&s.indexed("n2")), ["b"]);
        // A changed node (a re-created pod of the same name elsewhere) leaves the old bucket.
        s.apply(Event::Apply(pod("a", Some("n2"))));
        assert!(s.indexed("n1").is_empty());
        assert_eq!(names(&s.indexed("n2")), ["a", "b"]);
        s.apply(Event::Delete(pod("a", Some("n2"))));
        assert_eq!(names(&s.indexed("n2")), ["b"]);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_relist_replaces_the_cache_and_its_index_whole() {
        let mut s = synced_with(&[pod("old", Some("n1")), pod("kept", Some("n1"))]);
        // The watch was down: "old" was deleted and "new" created meanwhile; the 410 forces a relist.
        s.apply(Event::Init);
        // While the relist is under way, readers still see the last complete list.
        s.apply(Event::InitApply(pod("kept", Some("n1"))));
        assert_eq!(names(&s.indexed("n1")), ["kept", "old"]);
        s.apply(Event::InitApply(pod("new", Some("n1"))));
        s.apply(Event::InitDone);
        assert_eq!(names(&s.indexed("n1")), ["kept", "new"]);
        assert!(s.get("shop", "old").is_none());
        assert_eq!(s.lists, 2);
    }

    #[test]
    fn nothing_is_synced_before_the_first_list_is_done() {
        let mut s = State::new(node_of as IndexFn<Pod>);
        s.apply(Event::Init);
        s.apply(Event::InitApply(pod("a", Some("n1"))));
        assert!(!s.synced);
        assert!(s.indexed("n1").is_empty());
        s.apply(Event::InitDone);
        assert!(s.synced);
    }

    #[test]
    fn a_delete_unindexes_by_the_stored_object() {
        let mut s = synced_with(&[pod("a", Some("n1"))]);
        // A delete event's final state without a node still removes the pod from n1.
        s.apply(Event::Delete(pod("a", None)));
        assert!(s.indexed("n1").is_empty());
        assert!(s.get("shop", "a").is_none());
    }
}

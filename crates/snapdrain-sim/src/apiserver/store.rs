//! Object storage with the semantics of kube-apiserver over etcd: one cluster-wide monotonic
//! resourceVersion, optimistic concurrency, finalizers, graceful pod deletion, and a bounded event history
//! per resource from which watches resume (older resourceVersions get 410 Gone).
//!
//! Objects are `serde_json::Value`s in their storage version. Both the HTTP handlers and the simulated
//! controllers of the world (kubelet, scheduler, Velero, ...) write through this type, so every change is
//! seen by watchers the same way.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::errors::{ApiError, ApiResult, Cause};
use super::meta::{now_rfc3339, remove_meta, rfc3339_in, set_meta};
use super::objects::{Field, Objects};
use super::resources::{Registry, ResKey, ResourceDef, def_from_crd};
use super::validation;

/// Other crates read metadata through this path; the helper lives in the `meta` leaf.
pub use super::meta::meta_str;

/// How many events each resource keeps for watches to resume from. Older resourceVersions get 410 Gone.
const HISTORY_PER_RESOURCE: usize = 200_000;
/// Extra attempts at a free generated name (kube-apiserver makes 8 in all).
const GENERATE_NAME_RETRIES: usize = 7;
/// Events buffered per live subscriber before it is cut off as too slow (it then resumes or re-lists).
const SUBSCRIBER_BUFFER: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object. `previous` is the object before a modification, so that filtered watches can
/// turn "stopped matching" into DELETED and "started matching" into ADDED, as the real server does.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub type_: EventType,
    pub object: Arc<Value>,
    pub previous: Option<Arc<Value>>,
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug)]
pub enum WatchFrom {
    /// Only changes after now.
    Now,
    /// Changes after this resourceVersion (410 Gone when it is no longer in the history).
    Rv(u64),
    /// Synthetic ADDED events for every current object, then changes.
    Everything,
}

pub struct WatchStart {
    pub initial: Vec<Arc<WatchEvent>>,
    pub receiver: broadcast::Receiver<Arc<WatchEvent>>,
    /// The resourceVersion the watch is consistent with after `initial`.
    pub rv: u64,
}

#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

#[derive(Clone, Debug)]
pub enum Deleted {
    /// Removed from storage now (the last state).
    Gone(Arc<Value>),
    /// Marked for deletion (finalizers or a pod's grace period); still readable.
    Pending(Arc<Value>),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    /// Writes from the simulated controllers keep what a client could not set (e.g. a new pod's status).
    pub internal: bool,
}

pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    /// Key of the last item returned when more remain.
    pub next: Option<(String, String)>,
}

type ObjKey = super::objects::ObjKey;

struct ResState {
    objects: Objects,
    /// The resourceVersion of the last change to this resource (0: none yet).
    last_change_rv: u64,
    history: VecDeque<Arc<WatchEvent>>,
    /// Events at or below this resourceVersion are no longer in `history`.
    compacted_rv: u64,
    tx: broadcast::Sender<Arc<WatchEvent>>,
}

impl ResState {
    fn new(key: &ResKey) -> Self {
        let (tx, _) = broadcast::channel(SUBSCRIBER_BUFFER);
        Self {
            objects: Objects::new(key),
            last_change_rv: 0,
            history: VecDeque::new(),
            compacted_rv: 0,
            tx,
        }
    }
}

struct Inner {
    rv: u64,
    registry: Registry,
    resources: HashMap<ResKey, ResState>,
}

impl Inner {
    /// The definition serving `key`, or the NotFound a request for `name` gets.
    fn def(&self, key: &ResKey, name: &str) -> ApiResult<Arc<ResourceDef>> {
        self.registry
            .get_shared(key)
            .ok_or_else(|| ApiError::not_found(&key.group, &key.plural, name))
    }

    /// The CRD object that defines the custom resource `def`.
    fn crd_of(&self, def: &ResourceDef) -> Option<Arc<Value>> {
        self.resources
            .get(&ResKey::new(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
            ))?
            .objects
            .get(&(String::new(), format!("{}.{}", def.plural, def.group)))
            .cloned()
    }

    /// Schema pruning, defaulting and validation of a client's write of a custom resource (the
    /// simulated controllers' own writes are trusted: they model controllers that already passed).
    fn admit_custom(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(crd) = self.crd_of(def) else {
            return Ok(());
        };
        match super::schema::of_crd(&crd, def.storage_version()) {
            Some(schema) => super::schema::admit(def, schema, obj, old),
            None => Ok(()),
        }
    }

    /// The stored object `name` in `ns` with its storage key, or NotFound.
    fn existing(
        &mut self,
        key: &ResKey,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<(ObjKey, Arc<Value>)> {
        let obj_key = (ns.unwrap_or("").to_string(), name.to_string());
        let current = self
            .state(key)
            .objects
            .get(&obj_key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        Ok((obj_key, current))
    }

    fn state(&mut self, key: &ResKey) -> &mut ResState {
        self.resources
            .entry(key.clone())
            .or_insert_with(|| ResState::new(key))
    }

    fn emit(
        &mut self,
        key: &ResKey,
        type_: EventType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        let rv = self.rv;
        let state = self.state(key);
        state.last_change_rv = rv;
        let event = Arc::new(WatchEvent {
            rv,
            type_,
            object,
            previous,
        });
        state.history.push_back(event.clone());
        while state.history.len() > HISTORY_PER_RESOURCE {
            if let Some(old) = state.history.pop_front() {
                state.compacted_rv = old.rv;
            }
        }
        // No receivers is normal (nobody watches this resource).
        let _ = state.tx.send(event);
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
}

/// The shared store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<RwLock<Inner>>,
    /// Bumped to cut every open watch (fault injection: dropped connections).
    watch_epoch: Arc<tokio::sync::watch::Sender<u64>>,
    /// When false, a pod's graceful deletion completes by timer; when a simulated kubelet runs, it does.
    kubelet_managed: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// etcd's default `--max-request-bytes` (1.5 MiB, etcd `embed/config.go` `DefaultMaxRequestBytes`): a
/// write whose value is larger is refused by etcd, whatever kube-apiserver's own 3 MiB body limit let in.
/// Custom resources are stored as JSON, so their JSON size is what counts.
pub const ETCD_MAX_REQUEST_BYTES: usize = 1_572_864;

/// Refuses an object etcd would refuse. kube-apiserver passes etcd's error through as a 500 with no
/// reason and etcd's message (kubernetes/kubernetes#74600: `{"status":"Failure","message":"etcdserver:
/// request is too large","code":500}`); every later write of the object fails the same way.
fn fits_in_etcd(obj: &Value) -> ApiResult<()> {
    let mut size = ByteCount(0);
    // Writing JSON into a counter cannot fail: ByteCount accepts every byte.
    let _ = serde_json::to_writer(&mut size, obj);
    if size.0 > ETCD_MAX_REQUEST_BYTES {
        return Err(ApiError::new(500, "", "etcdserver: request is too large"));
    }
    Ok(())
}

struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn finalizers(obj: &Value) -> usize {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// Everything but metadata and status: a change here bumps metadata.generation.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn generate_suffix() -> String {
    // The alphabet kube-apiserver uses for generateName: no vowels, no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

impl Store {
    pub fn new() -> Self {
        let (epoch, _) = tokio::sync::watch::channel(0);
        Self {
            inner: Arc::new(RwLock::new(Inner {
                rv: 1,
                registry: Registry::with_builtins(),
                resources: HashMap::new(),
            })),
            watch_epoch: Arc::new(epoch),
            kubelet_managed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock would leave the data as it was before the panicking write began
        // (writes replace whole Arcs), so recovering the guard is safe.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_kubelet_managed(&self, managed: bool) {
        self.kubelet_managed
            .store(managed, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn current_rv(&self) -> u64 {
        self.read().rv
    }

    /// The CRD object behind a custom resource definition, if it is installed.
    pub fn crd_of(&self, def: &ResourceDef) -> Option<Arc<Value>> {
        self.read().crd_of(def)
    }

    pub fn registry(&self) -> Registry {
        self.read().registry.clone()
    }

    pub fn def(&self, key: &ResKey) -> Option<ResourceDef> {
        self.read().registry.get(key).cloned()
    }

    /// The definition serving `kind` in `api_version`, without copying the whole registry.
    pub fn def_by_kind(&self, api_version: &str, kind: &str) -> Option<ResourceDef> {
        self.read().registry.by_kind(api_version, kind).cloned()
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<ResourceDef> {
        self.read().registry.lookup(group, version, plural).cloned()
    }

    pub fn watch_epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.watch_epoch.subscribe()
    }

    /// Cuts every open watch connection (clients reconnect from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    /// Forgets the event history of every resource, so that resuming a watch from any earlier
    /// resourceVersion gets 410 Gone and the client must re-list.
    pub fn compact(&self) {
        let mut inner = self.write();
        let rv = inner.rv;
        for state in inner.resources.values_mut() {
            state.history.clear();
            state.compacted_rv = rv;
        }
    }

    pub fn get(&self, key: &ResKey, ns: Option<&str>, name: &str) -> Option<Arc<Value>> {
        let inner = self.read();
        inner
            .resources
            .get(key)?
            .objects
            .get(&(ns.unwrap_or("").to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of `key` whose `field` has `value`, in list order: from the store's index when the
    /// field is indexed for the resource (`objects::indexed_fields`), else by a scan.
    pub fn by_field(&self, key: &ResKey, field: Field, value: &str) -> Vec<Arc<Value>> {
        let inner = self.read();
        inner
            .resources
            .get(key)
            .map(|s| s.objects.by_field(field, value))
            .unwrap_or_default()
    }

    /// How many objects `key` holds and the resourceVersion of its last change: equal answers mean
    /// nothing of that resource changed in between.
    pub fn change_mark(&self, key: &ResKey) -> (usize, u64) {
        let inner = self.read();
        inner
            .resources
            .get(key)
            .map_or((0, 0), |s| (s.objects.len(), s.last_change_rv))
    }

    /// Writes `items` (objects of `key`, as a list returned them) as comma-separated JSON, from the
    /// serialized form the store caches per object until it changes.
    pub fn write_json(
        &self,
        key: &ResKey,
        items: &[Arc<Value>],
        buf: &mut Vec<u8>,
    ) -> serde_json::Result<()> {
        let inner = self.read();
        match inner.resources.get(key) {
            Some(s) => s.objects.write_json(items, buf),
            None => Objects::new(key).write_json(items, buf),
        }
    }

    /// A page of objects in key order, starting after `after`, keeping those `keep` accepts.
    pub fn list(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        keep: &dyn Fn(&Value) -> bool,
        limit: Option<usize>,
        after: Option<&ObjKey>,
    ) -> ListPage {
        let inner = self.read();
        let rv = inner.rv;
        let Some(state) = inner.resources.get(key) else {
            return ListPage {
                items: Vec::new(),
                rv,
                next: None,
            };
        };
        let start = match (after, ns) {
            (Some(k), _) => std::ops::Bound::Excluded(k.clone()),
            (None, Some(ns)) => std::ops::Bound::Included((ns.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut next = None;
        for ((obj_ns, name), obj) in state.objects.range(start) {
            if let Some(ns) = ns
                && obj_ns != ns
            {
                break;
            }
            if !keep(obj) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                next = Some((obj_ns.clone(), name.clone()));
                break;
            }
            items.push(obj.clone());
        }
        // `next` points at the first item not returned; continue "after" the last returned one.
        let next = next.and(items.last().map(|o| {
            (
                meta_str(o, "namespace").unwrap_or("").to_string(),
                meta_str(o, "name").unwrap_or("").to_string(),
            )
        }));
        ListPage { items, rv, next }
    }

    /// Every object of a resource (all namespaces) with the resourceVersion they are consistent with.
    pub fn snapshot(&self, key: &ResKey) -> (Vec<Arc<Value>>, u64) {
        let page = self.list(key, None, &|_| true, None, None);
        (page.items, page.rv)
    }

    /// Starts a watch consistent with the store: no event is lost or repeated between `initial` and
    /// `receiver`.
    pub fn watch(&self, key: &ResKey, from: WatchFrom) -> ApiResult<WatchStart> {
        let mut inner = self.write();
        let rv = inner.rv;
        let state = inner.state(key);
        let receiver = state.tx.subscribe();
        let initial = match from {
            WatchFrom::Now => Vec::new(),
            WatchFrom::Rv(from) => {
                if from < state.compacted_rv {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {from} ({})",
                        state.compacted_rv
                    )));
                }
                state
                    .history
                    .iter()
                    .filter(|e| e.rv > from)
                    .cloned()
                    .collect()
            }
            WatchFrom::Everything => state
                .objects
                .values()
                .map(|o| {
                    Arc::new(WatchEvent {
                        rv: o
                            .pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(rv),
                        type_: EventType::Added,
                        object: o.clone(),
                        previous: None,
                    })
                })
                .collect(),
        };
        Ok(WatchStart {
            initial,
            receiver,
            rv,
        })
    }

    /// Objects and a subscription taken atomically, for the simulated controllers.
    pub fn subscribe(
        &self,
        key: &ResKey,
    ) -> (Vec<Arc<Value>>, broadcast::Receiver<Arc<WatchEvent>>) {
        let mut inner = self.write();
        let state = inner.state(key);
        let rx = state.tx.subscribe();
        (state.objects.values().cloned().collect(), rx)
    }

    pub fn create(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        obj: Value,
        opts: WriteOptions,
    ) -> ApiResult<Arc<Value>> {
        let mut inner = self.write();
        let created = Self::create_locked(&mut inner, key, ns, obj, opts)?;
        Ok(created)
    }

    fn create_locked(
        inner: &mut Inner,
        key: &ResKey,
        ns: Option<&str>,
        mut obj: Value,
        opts: WriteOptions,
    ) -> ApiResult<Arc<Value>> {
        let def = inner.def(key, "")?;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        let ns = if def.namespaced {
            ns.or(meta_str(&obj, "namespace")).map(str::to_string)
        } else {
            None
        };
        if def.namespaced {
            let ns_name = ns.clone().unwrap_or_default();
            if ns_name.is_empty() {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            let ns_obj = inner
                .resources
                .get(&ResKey::core("namespaces"))
                .and_then(|s| s.objects.get(&(String::new(), ns_name.clone())));
            match ns_obj {
                None => return Err(ApiError::not_found("", "namespaces", &ns_name)),
                Some(o) if o.pointer("/metadata/deletionTimestamp").is_some() => {
                    return Err(ApiError::new(
                        403,
                        "Forbidden",
                        format!(
                            "{} \"{}\" is forbidden: unable to create new content in namespace {ns_name} because it is being terminated",
                            def.plural,
                            meta_str(&obj, "name").unwrap_or("")
                        ),
                    ));
                }
                Some(_) => {}
            }
            set_meta(&mut obj, "namespace", json!(ns_name));
        } else {
            remove_meta(&mut obj, "namespace");
        }
        let mut name = meta_str(&obj, "name").unwrap_or("").to_string();
        if name.is_empty() {
            match meta_str(&obj, "generateName") {
                Some(prefix) if !prefix.is_empty() => {
                    // Like kube-apiserver (RetryGenerateName, GA in 1.32), try a few suffixes before
                    // reporting a collision: five random characters do collide among thousands of pods.
                    let ns_key = ns.clone().unwrap_or_default();
                    let prefix = prefix.to_string();
                    for _ in 0..=GENERATE_NAME_RETRIES {
                        name = format!("{prefix}{}", generate_suffix());
                        if !inner
                            .state(key)
                            .objects
                            .contains_key(&(ns_key.clone(), name.clone()))
                        {
                            break;
                        }
                    }
                    set_meta(&mut obj, "name", json!(name));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def.kind,
                        &def.group,
                        "",
                        vec![Cause {
                            reason: "FieldValueRequired".into(),
                            field: "metadata.name".into(),
                            message: "Required value: name or generateName is required".into(),
                        }],
                    ));
                }
            }
        }
        validation::validate(&def, &obj)?;
        if def.custom && !opts.internal {
            inner.admit_custom(&def, &mut obj, None)?;
        }
        let obj_key = (ns.clone().unwrap_or_default(), name.clone());
        if inner.state(key).objects.contains_key(&obj_key) {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            let rule_errors = super::cel::check_crd(&obj);
            if !rule_errors.is_empty() {
                return Err(ApiError::invalid(&def.kind, &def.group, &name, rule_errors));
            }
            let crd_def = def_from_crd(&obj).map_err(|msg| {
                ApiError::invalid(
                    &def.kind,
                    &def.group,
                    &name,
                    vec![Cause {
                        reason: "FieldValueInvalid".into(),
                        field: "spec".into(),
                        message: msg,
                    }],
                )
            })?;
            if !opts.dry_run {
                obj["status"] = json!({
                    "acceptedNames": obj["spec"]["names"].clone(),
                    "storedVersions": [crd_def.storage_version()],
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()}
                    ]
                });
                inner.registry.insert(crd_def);
            }
        } else if !opts.internal {
            Self::prepare_status_on_create(&def, &mut obj);
        }
        obj["apiVersion"] = json!(def.api_version(def.storage_version()));
        obj["kind"] = json!(def.kind);
        for f in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            remove_meta(&mut obj, f);
        }
        set_meta(&mut obj, "uid", json!(uuid::Uuid::new_v4().to_string()));
        set_meta(&mut obj, "creationTimestamp", json!(now_rfc3339()));
        if def.status_subresource || def.custom {
            set_meta(&mut obj, "generation", json!(1));
        }
        if opts.dry_run {
            set_meta(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
            return Ok(Arc::new(obj));
        }
        fits_in_etcd(&obj)?;
        let rv = inner.next_rv();
        set_meta(&mut obj, "resourceVersion", json!(rv.to_string()));
        let obj = Arc::new(obj);
        inner.state(key).objects.insert(obj_key, obj.clone());
        inner.emit(key, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// What the real server's create strategies do with a client-supplied status.
    fn prepare_status_on_create(def: &ResourceDef, obj: &mut Value) {
        match (def.group.as_str(), def.plural.as_str()) {
            ("", "pods") => {
                obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            ("", "namespaces") => {
                obj["status"] = json!({"phase": "Active"});
                // kube-apiserver labels every namespace with its own name (Kubernetes 1.21+, kubernetes
                // `pkg/apis/core/v1/defaults.go` `SetDefaults_Namespace`), which is what webhook
                // namespaceSelectors key on to exclude kube-system. (On update too; not simulated.)
                let name = obj.pointer("/metadata/name").cloned().unwrap_or_default();
                if !obj["metadata"]["labels"].is_object() {
                    obj["metadata"]["labels"] = json!({});
                }
                obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
                if obj.pointer("/spec/finalizers").is_none() {
                    obj["spec"] = json!({"finalizers": ["kubernetes"]});
                }
            }
            ("", "persistentvolumeclaims") if obj.get("status").is_none() => {
                obj["status"] = json!({"phase": "Pending"});
            }
            _ if def.custom && def.status_subresource => {
                if let Some(m) = obj.as_object_mut() {
                    m.remove("status");
                }
            }
            _ => {}
        }
    }

    /// Replaces an object (PUT). A non-empty `metadata.resourceVersion` in `new` must match.
    pub fn update(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        name: &str,
        new: Value,
        sub: Option<&str>,
        opts: WriteOptions,
    ) -> ApiResult<Arc<Value>> {
        self.modify(key, ns, name, sub, opts, |_| Ok(new))
    }

    /// Read-modify-write under the store lock: `f` sees the current object and returns the new one.
    /// Patches go through here, so they never conflict with concurrent writers (as in the real server,
    /// which retries patches on conflict), unless the patch itself carries a resourceVersion.
    pub fn modify(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        name: &str,
        sub: Option<&str>,
        opts: WriteOptions,
        f: impl FnOnce(&Value) -> ApiResult<Value>,
    ) -> ApiResult<Arc<Value>> {
        let mut inner = self.write();
        let def = inner.def(key, name)?;
        let (obj_key, current) = inner.existing(key, &def, ns, name)?;
        let new = f(&current)?;
        Self::update_locked(&mut inner, &def, obj_key, current, new, sub, opts)
    }

    /// Like `modify`, but creates the object when it does not exist (server-side apply).
    pub fn upsert(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        name: &str,
        sub: Option<&str>,
        opts: WriteOptions,
        f: impl FnOnce(Option<&Value>) -> ApiResult<Value>,
    ) -> ApiResult<(Arc<Value>, bool)> {
        let mut inner = self.write();
        let def = inner.def(key, name)?;
        let obj_key = (ns.unwrap_or("").to_string(), name.to_string());
        match inner.state(key).objects.get(&obj_key).cloned() {
            Some(current) => {
                let new = f(Some(&current))?;
                Ok((
                    Self::update_locked(&mut inner, &def, obj_key, current, new, sub, opts)?,
                    false,
                ))
            }
            None => {
                if sub.is_some() {
                    return Err(ApiError::not_found(&def.group, &def.plural, name));
                }
                let mut new = f(None)?;
                set_meta(&mut new, "name", json!(name));
                Ok((Self::create_locked(&mut inner, key, ns, new, opts)?, true))
            }
        }
    }

    fn update_locked(
        inner: &mut Inner,
        def: &ResourceDef,
        obj_key: ObjKey,
        current: Arc<Value>,
        mut new: Value,
        sub: Option<&str>,
        opts: WriteOptions,
    ) -> ApiResult<Arc<Value>> {
        let name = obj_key.1.clone();
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        if let Some(given) = meta_str(&new, "name")
            && !given.is_empty()
            && given != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({name})"
            )));
        }
        let current_rv = meta_str(&current, "resourceVersion")
            .unwrap_or("")
            .to_string();
        if let Some(given) = meta_str(&new, "resourceVersion")
            && !given.is_empty()
            && given != current_rv
        {
            return Err(ApiError::conflict(&def.group, &def.plural, &name));
        }
        let merged = match sub {
            Some("status") => {
                let mut m = (*current).clone();
                m["status"] = new.get("status").cloned().unwrap_or(Value::Null);
                if m["status"].is_null()
                    && let Some(o) = m.as_object_mut()
                {
                    o.remove("status");
                }
                m
            }
            Some(other) if other != "scale" => {
                return Err(ApiError::not_found(
                    &def.group,
                    &format!("{}/{other}", def.plural),
                    &name,
                ));
            }
            _ => {
                // Identity and server-owned metadata cannot be changed by a client.
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "namespace",
                ] {
                    match current.pointer(&format!("/metadata/{f}")) {
                        Some(v) => set_meta(&mut new, f, v.clone()),
                        None => remove_meta(&mut new, f),
                    }
                }
                set_meta(&mut new, "name", json!(name));
                if def.status_subresource && !opts.internal {
                    match current.get("status") {
                        Some(s) => new["status"] = s.clone(),
                        None => {
                            if let Some(o) = new.as_object_mut() {
                                o.remove("status");
                            }
                        }
                    }
                }
                if current.pointer("/metadata/deletionTimestamp").is_some() {
                    let old: Vec<&Value> = current
                        .pointer("/metadata/finalizers")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().collect())
                        .unwrap_or_default();
                    let added = new
                        .pointer("/metadata/finalizers")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.iter().any(|f| !old.contains(&f)));
                    if added {
                        return Err(ApiError::new(
                            422,
                            "Invalid",
                            format!(
                                "{} \"{name}\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                                def.kind
                            ),
                        ));
                    }
                }
                validation::validate(def, &new)?;
                if spec_part(&new) != spec_part(&current) {
                    let generation = current
                        .pointer("/metadata/generation")
                        .and_then(Value::as_i64);
                    if let Some(g) = generation {
                        set_meta(&mut new, "generation", json!(g + 1));
                    }
                }
                new
            }
        };
        let mut merged = merged;
        if def.custom && !opts.internal && sub != Some("scale") {
            inner.admit_custom(def, &mut merged, Some(&current))?;
        }
        merged["apiVersion"] = current["apiVersion"].clone();
        merged["kind"] = current["kind"].clone();
        set_meta(&mut merged, "resourceVersion", json!(current_rv));
        if merged == *current {
            // A no-op write changes nothing, not even the resourceVersion.
            return Ok(current);
        }
        if opts.dry_run {
            return Ok(Arc::new(merged));
        }
        fits_in_etcd(&merged)?;
        let key = def.key();
        let rv = inner.next_rv();
        set_meta(&mut merged, "resourceVersion", json!(rv.to_string()));
        let deleting = merged.pointer("/metadata/deletionTimestamp").is_some();
        let grace = merged
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let merged = Arc::new(merged);
        if deleting && finalizers(&merged) == 0 && grace == 0 {
            inner.state(&key).objects.remove(&obj_key);
            inner.emit(&key, EventType::Deleted, merged.clone(), Some(current));
            Self::after_removal(inner, def, &merged);
            return Ok(merged);
        }
        inner.state(&key).objects.insert(obj_key, merged.clone());
        inner.emit(&key, EventType::Modified, merged.clone(), Some(current));
        Ok(merged)
    }

    /// Side effects of an object leaving storage.
    fn after_removal(inner: &mut Inner, def: &ResourceDef, obj: &Value) {
        if def.group == "apiextensions.k8s.io"
            && def.plural == "customresourcedefinitions"
            && let Ok(crd_def) = def_from_crd(obj)
        {
            let key = crd_def.key();
            inner.registry.remove(&key);
            let objects: Vec<(ObjKey, Arc<Value>)> = inner
                .resources
                .get_mut(&key)
                .map(|s| s.objects.take_all())
                .unwrap_or_default();
            for (_, o) in objects {
                inner.next_rv();
                inner.emit(&key, EventType::Deleted, o, None);
            }
        }
    }

    pub fn delete(
        &self,
        key: &ResKey,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Deleted> {
        let result = {
            let mut inner = self.write();
            Self::delete_locked(&mut inner, key, ns, name, opts)?
        };
        if let (Deleted::Pending(obj), false, Some(grace)) =
            (&result.0, self.kubelet_managed(), result.1)
        {
            self.finish_pod_deletion_later(key.clone(), obj.clone(), grace);
        }
        if key.group.is_empty() && key.plural == "namespaces" && !opts.dry_run {
            self.empty_namespace(name);
        }
        Ok(result.0)
    }

    fn kubelet_managed(&self) -> bool {
        self.kubelet_managed
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Returns the outcome and, for a pod left terminating, its grace period.
    fn delete_locked(
        inner: &mut Inner,
        key: &ResKey,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<(Deleted, Option<i64>)> {
        let def = inner.def(key, name)?;
        let (obj_key, current) = inner.existing(key, &def, ns, name)?;
        let uid = meta_str(&current, "uid").unwrap_or("");
        if let Some(want) = &opts.precondition_uid
            && want != uid
        {
            return Err(ApiError::precondition_failed(
                &def.group,
                &def.plural,
                name,
                format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta_str(&current, "resourceVersion").unwrap_or("");
        if let Some(want) = &opts.precondition_rv
            && want != rv
        {
            return Err(ApiError::precondition_failed(
                &def.group,
                &def.plural,
                name,
                format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        let is_pod = def.group.is_empty() && def.plural == "pods";
        let grace = if is_pod {
            Self::pod_grace(&current, opts.grace_period_seconds)
        } else {
            0
        };
        let already_deleting = current.pointer("/metadata/deletionTimestamp").is_some();
        if finalizers(&current) == 0 && grace == 0 {
            if opts.dry_run {
                return Ok((Deleted::Gone(current), None));
            }
            inner.state(key).objects.remove(&obj_key);
            let rv = inner.next_rv();
            let mut last = (*current).clone();
            set_meta(&mut last, "resourceVersion", json!(rv.to_string()));
            let last = Arc::new(last);
            inner.emit(key, EventType::Deleted, last.clone(), Some(current));
            Self::after_removal(inner, &def, &last);
            return Ok((Deleted::Gone(last), None));
        }
        if already_deleting {
            // A second delete may shorten a pod's grace period, never lengthen it.
            let current_grace = current
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if !(is_pod && grace < current_grace) || opts.dry_run {
                return Ok((Deleted::Pending(current), None));
            }
        }
        let mut marked = (*current).clone();
        set_meta(&mut marked, "deletionTimestamp", json!(rfc3339_in(grace)));
        set_meta(&mut marked, "deletionGracePeriodSeconds", json!(grace));
        if opts.dry_run {
            return Ok((Deleted::Pending(Arc::new(marked)), None));
        }
        let rv = inner.next_rv();
        set_meta(&mut marked, "resourceVersion", json!(rv.to_string()));
        let marked = Arc::new(marked);
        inner.state(key).objects.insert(obj_key, marked.clone());
        inner.emit(key, EventType::Modified, marked.clone(), Some(current));
        Ok((Deleted::Pending(marked), is_pod.then_some(grace)))
    }

    /// The grace period a pod deletion gets: unscheduled and finished pods go at once.
    fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let scheduled = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !scheduled || phase == "Succeeded" || phase == "Failed" {
            return 0;
        }
        let default = pod
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        requested.unwrap_or(default).max(0)
    }

    /// Without a kubelet, a terminating pod disappears once its grace period is over.
    fn finish_pod_deletion_later(&self, key: ResKey, pod: Arc<Value>, grace: i64) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        handle.spawn(async move {
            tokio::time::sleep(Duration::from_secs(grace.max(0) as u64)).await;
            let ns = meta_str(&pod, "namespace").map(str::to_string);
            let name = meta_str(&pod, "name").unwrap_or("").to_string();
            let uid = meta_str(&pod, "uid").map(str::to_string);
            let opts = DeleteOptions {
                grace_period_seconds: Some(0),
                precondition_uid: uid,
                ..Default::default()
            };
            // The pod may already be gone or replaced: nothing to do then.
            let _ = store.delete(&key, ns.as_deref(), &name, &opts);
        });
    }

    /// Deletes everything in a namespace being deleted, then the namespace itself (the namespace
    /// controller's job, done at once here).
    fn empty_namespace(&self, ns: &str) {
        let keys: Vec<ResKey> = {
            let inner = self.read();
            inner
                .registry
                .all()
                .filter(|d| d.namespaced)
                .map(ResourceDef::key)
                .collect()
        };
        for key in keys {
            let page = self.list(&key, Some(ns), &|_| true, None, None);
            for obj in page.items {
                let name = meta_str(&obj, "name").unwrap_or("").to_string();
                let opts = DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                let _ = self.delete(&key, Some(ns), &name, &opts);
                // Objects held by finalizers are released: their controllers are not simulated per namespace.
                let _ = self.modify(
                    &key,
                    Some(ns),
                    &name,
                    None,
                    WriteOptions {
                        internal: true,
                        ..Default::default()
                    },
                    |o| {
                        let mut o = o.clone();
                        remove_meta(&mut o, "finalizers");
                        Ok(o)
                    },
                );
            }
        }
        let _ = self.modify(
            &ResKey::core("namespaces"),
            None,
            ns,
            None,
            WriteOptions {
                internal: true,
                ..Default::default()
            },
            |o| {
                let mut o = o.clone();
                remove_meta(&mut o, "finalizers");
                if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("finalizers");
                }
                Ok(o)
            },
        );
        let _ = self.delete(
            &ResKey::core("namespaces"),
            None,
            ns,
            &DeleteOptions::default(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_ns() -> Store {
        let s = Store::new();
        s.create(
            &ResKey::core("namespaces"),
            None,
            json!({"metadata": {"name": "default"}}),
            WriteOptions::default(),
        )
        .unwrap();
        s
    }

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    }

    /// etcd refuses a value over 1.5 MiB (kubernetes/kubernetes#74600): on create, and on a later write
    /// that grows the object past it, which leaves the stored object as it was.
    #[test]
    fn an_object_over_etcds_request_limit_is_refused_with_etcds_500() {
        let s = store_with_ns();
        let cm =
            |bytes: usize| json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(bytes)}});
        let key = ResKey::core("configmaps");
        let e = s
            .create(
                &key,
                Some("default"),
                cm(ETCD_MAX_REQUEST_BYTES),
                WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (500, ""));
        assert_eq!(e.message, "etcdserver: request is too large");
        assert!(s.get(&key, Some("default"), "big").is_none());

        let small = s
            .create(&key, Some("default"), cm(1000), WriteOptions::default())
            .unwrap();
        let e = s
            .update(
                &key,
                Some("default"),
                "big",
                cm(ETCD_MAX_REQUEST_BYTES),
                None,
                WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!(e.message, "etcdserver: request is too large");
        assert_eq!(s.get(&key, Some("default"), "big").unwrap(), small);
        // Just under the limit is stored.
        s.update(
            &key,
            Some("default"),
            "big",
            cm(ETCD_MAX_REQUEST_BYTES - 1000),
            None,
            WriteOptions::default(),
        )
        .unwrap();
    }

    #[test]
    fn create_assigns_identity_and_monotonic_versions() {
        let s = store_with_ns();
        let a = s
            .create(
                &ResKey::core("pods"),
                Some("default"),
                pod("a"),
                WriteOptions::default(),
            )
            .unwrap();
        let b = s
            .create(
                &ResKey::core("pods"),
                Some("default"),
                pod("b"),
                WriteOptions::default(),
            )
            .unwrap();
        let rv = |o: &Value| {
            meta_str(o, "resourceVersion")
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        assert!(rv(&b) > rv(&a));
        assert_ne!(meta_str(&a, "uid"), meta_str(&b, "uid"));
        assert_eq!(a["status"]["phase"], "Pending");
        let dup = s
            .create(
                &ResKey::core("pods"),
                Some("default"),
                pod("a"),
                WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!(dup.code, 409);
        assert_eq!(dup.reason, "AlreadyExists");
        let gen_name =
            json!({"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c"}]}});
        let g = s
            .create(
                &ResKey::core("pods"),
                Some("default"),
                gen_name,
                WriteOptions::default(),
            )
            .unwrap();
        assert!(meta_str(&g, "name").unwrap().starts_with("web-"));
        assert_eq!(meta_str(&g, "name").unwrap().len(), 9);
    }

    #[test]
    fn stale_update_conflicts_and_noop_keeps_version() {
        let s = store_with_ns();
        let a = s
            .create(
                &ResKey::core("pods"),
                Some("default"),
                pod("a"),
                WriteOptions::default(),
            )
            .unwrap();
        let mut changed = (*a).clone();
        changed["metadata"]["labels"]["x"] = json!("1");
        let updated = s
            .update(
                &ResKey::core("pods"),
                Some("default"),
                "a",
                changed.clone(),
                None,
                WriteOptions::default(),
            )
            .unwrap();
        let err = s
            .update(
                &ResKey::core("pods"),
                Some("default"),
                "a",
                changed,
                None,
                WriteOptions::default(),
            )
            .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(err.reason, "Conflict");
        let same = s
            .update(
                &ResKey::core("pods"),
                Some("default"),
                "a",
                (*updated).clone(),
                None,
                WriteOptions::default(),
            )
            .unwrap();
        assert_eq!(
            meta_str(&same, "resourceVersion"),
            meta_str(&updated, "resourceVersion")
        );
    }

    #[test]
    fn finalizers_hold_deletion_until_removed() {
        let s = store_with_ns();
        let key = ResKey::core("configmaps");
        s.create(
            &key,
            Some("default"),
            json!({"metadata": {"name": "c", "finalizers": ["x/y"]}}),
            WriteOptions::default(),
        )
        .unwrap();
        let d = s
            .delete(&key, Some("default"), "c", &DeleteOptions::default())
            .unwrap();
        let Deleted::Pending(obj) = d else {
            panic!("finalizer must hold the object")
        };
        assert!(obj.pointer("/metadata/deletionTimestamp").is_some());
        let mut without = (*obj).clone();
        without["metadata"]["finalizers"] = json!([]);
        s.update(
            &key,
            Some("default"),
            "c",
            without,
            None,
            WriteOptions::default(),
        )
        .unwrap();
        assert!(s.get(&key, Some("default"), "c").is_none());
    }

    #[test]
    fn delete_checks_uid_precondition() {
        let s = store_with_ns();
        s.create(
            &ResKey::core("pods"),
            Some("default"),
            pod("a"),
            WriteOptions::default(),
        )
        .unwrap();
        let opts = DeleteOptions {
            precondition_uid: Some("other".into()),
            ..Default::default()
        };
        let err = s
            .delete(&ResKey::core("pods"), Some("default"), "a", &opts)
            .unwrap_err();
        assert_eq!(err.code, 409);
        assert!(
            err.message
                .contains("Precondition failed: UID in precondition: other")
        );
    }

    #[test]
    fn watch_resumes_from_history_and_compaction_gives_gone() {
        let s = store_with_ns();
        let key = ResKey::core("pods");
        let a = s
            .create(&key, Some("default"), pod("a"), WriteOptions::default())
            .unwrap();
        let from: u64 = meta_str(&a, "resourceVersion").unwrap().parse().unwrap();
        s.create(&key, Some("default"), pod("b"), WriteOptions::default())
            .unwrap();
        let w = s.watch(&key, WatchFrom::Rv(from)).unwrap();
        assert_eq!(w.initial.len(), 1);
        assert_eq!(meta_str(&w.initial[0].object, "name"), Some("b"));
        s.compact();
        let err = s.watch(&key, WatchFrom::Rv(from)).err().unwrap();
        assert_eq!(err.code, 410);
    }

    #[test]
    fn status_subresource_separates_spec_and_status() {
        let s = store_with_ns();
        let key = ResKey::core("pods");
        let a = s
            .create(&key, Some("default"), pod("a"), WriteOptions::default())
            .unwrap();
        let mut with_status = (*a).clone();
        with_status["status"]["phase"] = json!("Running");
        let main = s
            .update(
                &key,
                Some("default"),
                "a",
                with_status.clone(),
                None,
                WriteOptions::default(),
            )
            .unwrap();
        assert_eq!(main["status"]["phase"], "Pending");
        with_status["metadata"]["resourceVersion"] = main["metadata"]["resourceVersion"].clone();
        let st = s
            .update(
                &key,
                Some("default"),
                "a",
                with_status,
                Some("status"),
                WriteOptions::default(),
            )
            .unwrap();
        assert_eq!(st["status"]["phase"], "Running");
    }

    #[test]
    fn crd_registers_its_resource() {
        let s = Store::new();
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true}]}});
        s.create(
            &ResKey::new("apiextensions.k8s.io", "customresourcedefinitions"),
            None,
            crd,
            WriteOptions::default(),
        )
        .unwrap();
        assert!(s.lookup("example.com", "v1", "widgets").is_some());
        s.create(
            &ResKey::new("example.com", "widgets"),
            None,
            json!({"metadata": {"name": "w"}}),
            WriteOptions::default(),
        )
        .unwrap();
        s.delete(
            &ResKey::new("apiextensions.k8s.io", "customresourcedefinitions"),
            None,
            "widgets.example.com",
            &DeleteOptions::default(),
        )
        .unwrap();
        assert!(s.lookup("example.com", "v1", "widgets").is_none());
    }
}

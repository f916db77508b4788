//! The PodDisruptionBudget status controller (kube-controller-manager's disruption controller): keeps each
//! budget's `status` current from the readiness of the pods it selects, so that the eviction subresource
//! can decide from `status.disruptionsAllowed` alone.
//!
//! Differences from the real controller, kept on purpose:
//! - `expectedPods` uses the scale of a pod's controller (ReplicaSet or its Deployment, StatefulSet,
//!   ReplicationController) when it is found; a pod without a known controller counts as one pod instead
//!   of failing the sync (`found no controllers for pod`) or being left out (unmanaged pods).
//! - Custom resources with a `scale` subresource are not consulted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_stream::wrappers::BroadcastStream;

use super::label_selector;
use super::meta::meta_str;
use super::resources::ResKey;
use super::store::{EventType, Store, WatchEvent, WriteOptions};

/// How long an eviction's entry in `status.disruptedPods` keeps the pod out of `currentHealthy` while the
/// pod has not started terminating (`DeletionTimeout` in the real controller).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

pub fn pdb_key() -> ResKey {
    ResKey::new("policy", "poddisruptionbudgets")
}

fn pods_key() -> ResKey {
    ResKey::core("pods")
}

/// Workload resources whose scale feeds `expectedPods`.
fn owner_keys() -> [ResKey; 4] {
    [
        ResKey::new("apps", "replicasets"),
        ResKey::new("apps", "deployments"),
        ResKey::new("apps", "statefulsets"),
        ResKey::core("replicationcontrollers"),
    ]
}

/// Stores with a running controller, told apart by their watch-epoch channel (a `Store` has no other
/// identity to compare by).
static RUNNING: Mutex<Vec<watch::Receiver<u64>>> = Mutex::new(Vec::new());

/// Starts the controller for `store` unless one already runs for it; it stops when `stop` turns true.
pub fn start(store: Store, stop: watch::Receiver<bool>) {
    let epoch = store.watch_epoch();
    {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.iter().any(|r| r.same_channel(&epoch)) {
            return;
        }
        running.push(epoch.clone());
    }
    tokio::spawn(async move {
        run(store, stop).await;
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        running.retain(|r| !r.same_channel(&epoch));
    });
}

enum Source {
    Pod,
    Pdb,
    Owner,
}

/// An event from one of the watched resources; `None` when the subscriber fell behind.
type Tagged = (Source, Option<Arc<WatchEvent>>);

fn tagged(
    rx: tokio::sync::broadcast::Receiver<Arc<WatchEvent>>,
    source: fn() -> Source,
) -> BoxStream<'static, Tagged> {
    BroadcastStream::new(rx)
        .map(move |r| (source(), r.ok()))
        .boxed()
}

type PdbId = (String, String);

async fn run(store: Store, mut stop: watch::Receiver<bool>) {
    // Subscribe before the first full sync so that no change falls in between.
    let mut streams = vec![
        tagged(store.subscribe(&pods_key()).1, || Source::Pod),
        tagged(store.subscribe(&pdb_key()).1, || Source::Pdb),
    ];
    for key in owner_keys() {
        streams.push(tagged(store.subscribe(&key).1, || Source::Owner));
    }
    let mut events = futures::stream::select_all(streams);
    let mut dirty = all_pdbs(&store);
    let mut recheck: Option<tokio::time::Instant> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        if let Some(next) = sync_all(&store, &mut dirty) {
            let at = tokio::time::Instant::now() + next;
            recheck = Some(recheck.map_or(at, |r| r.min(at)));
        }
        let first = tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            ev = events.next() => match ev {
                Some(ev) => ev,
                None => return,
            },
            _ = sleep_until(recheck) => {
                recheck = None;
                dirty.extend(all_pdbs(&store));
                continue;
            }
        };
        mark(&store, first, &mut dirty);
        // Take whatever else is already queued, so a burst of pod changes costs one sync per budget.
        while let Some(Some(ev)) = futures::FutureExt::now_or_never(events.next()) {
            mark(&store, ev, &mut dirty);
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn all_pdbs(store: &Store) -> BTreeSet<PdbId> {
    store
        .snapshot(&pdb_key())
        .0
        .iter()
        .map(|p| id_of(p))
        .collect()
}

fn id_of(obj: &Value) -> PdbId {
    (
        meta_str(obj, "namespace").unwrap_or("").to_string(),
        meta_str(obj, "name").unwrap_or("").to_string(),
    )
}

fn pdbs_in(store: &Store, ns: &str) -> Vec<Arc<Value>> {
    store
        .list(&pdb_key(), Some(ns), &|_| true, None, None)
        .items
}

/// Marks the budgets an event can affect.
fn mark(store: &Store, (source, ev): Tagged, dirty: &mut BTreeSet<PdbId>) {
    let Some(ev) = ev else {
        dirty.extend(all_pdbs(store));
        return;
    };
    let ns = meta_str(&ev.object, "namespace").unwrap_or("");
    match source {
        Source::Pdb => {
            if ev.type_ != EventType::Deleted {
                dirty.insert(id_of(&ev.object));
            }
        }
        Source::Owner => dirty.extend(pdbs_in(store, ns).iter().map(|p| id_of(p))),
        Source::Pod => {
            let labels = |o: &Value| o.pointer("/metadata/labels").cloned();
            let now = labels(&ev.object);
            let before = ev.previous.as_deref().and_then(labels);
            for pdb in pdbs_in(store, ns) {
                let Some(sel) = selector_of(&pdb) else {
                    continue;
                };
                let hit = |l: &Option<Value>| label_selector::matches(sel, l.as_ref()) == Ok(true);
                if hit(&now) || hit(&before) {
                    dirty.insert(id_of(&pdb));
                }
            }
        }
    }
}

/// A budget's selector, unless it selects nothing (absent or empty selects no pods, as in the real
/// controller and eviction subresource).
pub fn selector_of(pdb: &Value) -> Option<&Value> {
    pdb.pointer("/spec/selector")
        .filter(|s| s.is_object() && !label_selector::is_empty(s))
}

/// Syncs every dirty budget; returns when the earliest pending `disruptedPods` entry expires.
fn sync_all(store: &Store, dirty: &mut BTreeSet<PdbId>) -> Option<Duration> {
    let mut next: Option<Duration> = None;
    // A conflict means someone (an eviction) wrote the budget meanwhile: compute again from the new state.
    for _attempt in 0..5 {
        let mut conflicted = BTreeSet::new();
        for (ns, name) in std::mem::take(dirty) {
            match sync_one(store, &ns, &name) {
                Ok(Some(d)) => next = Some(next.map_or(d, |n| n.min(d))),
                Ok(None) => {}
                Err(()) => {
                    conflicted.insert((ns, name));
                }
            }
        }
        if conflicted.is_empty() {
            break;
        }
        *dirty = conflicted;
    }
    next
}

fn sync_one(store: &Store, ns: &str, name: &str) -> Result<Option<Duration>, ()> {
    let Some(pdb) = store.get(&pdb_key(), Some(ns), name) else {
        return Ok(None);
    };
    let pods: Vec<Arc<Value>> = match selector_of(&pdb) {
        None => Vec::new(),
        Some(sel) => {
            store
                .list(
                    &pods_key(),
                    Some(ns),
                    &|p| label_selector::matches(sel, p.pointer("/metadata/labels")) == Ok(true),
                    None,
                    None,
                )
                .items
        }
    };
    let scale = |pod: &Value| controller_scale(store, ns, pod);
    let computed = compute(&pdb, &pods, &scale, jiff::Timestamp::now());
    if pdb.get("status") == Some(&computed.status) {
        return Ok(computed.recheck);
    }
    let mut new = (*pdb).clone();
    new["status"] = computed.status;
    // The resourceVersion we read makes this a compare-and-swap against concurrent evictions.
    let opts = WriteOptions {
        internal: true,
        ..Default::default()
    };
    match store.modify(&pdb_key(), Some(ns), name, Some("status"), opts, |_| {
        Ok(new)
    }) {
        Ok(_) => Ok(computed.recheck),
        Err(e) if e.code == 409 => Err(()),
        Err(e) => {
            // Gone meanwhile: its deletion event needs nothing more.
            tracing::debug!(pdb = name, namespace = ns, error = %e, "PDB status not written");
            Ok(None)
        }
    }
}

/// The scale of a pod's controller and the controller's uid (so that pods sharing one count once).
fn controller_scale(store: &Store, ns: &str, pod: &Value) -> Option<(String, i64)> {
    let owner = controller_ref(pod)?;
    let get = |key: ResKey, r: &Value| -> Option<Arc<Value>> {
        let obj = store.get(&key, Some(ns), r.get("name")?.as_str()?)?;
        // A controller of the same name but another uid is not this pod's controller.
        (meta_str(&obj, "uid") == r.get("uid").and_then(Value::as_str)).then_some(obj)
    };
    let replicas = |o: &Value| {
        o.pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
    };
    let uid = |o: &Value| meta_str(o, "uid").unwrap_or("").to_string();
    let kind = owner.get("kind").and_then(Value::as_str).unwrap_or("");
    let obj = match kind {
        "ReplicaSet" => {
            let rs = get(ResKey::new("apps", "replicasets"), owner)?;
            match controller_ref(&rs) {
                Some(d) if d.get("kind").and_then(Value::as_str) == Some("Deployment") => {
                    get(ResKey::new("apps", "deployments"), d)?
                }
                _ => rs,
            }
        }
        "StatefulSet" => get(ResKey::new("apps", "statefulsets"), owner)?,
        "ReplicationController" => get(ResKey::core("replicationcontrollers"), owner)?,
        _ => return None,
    };
    Some((uid(&obj), replicas(&obj)))
}

fn controller_ref(obj: &Value) -> Option<&Value> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

pub fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

pub fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_some()
}

pub struct Computed {
    pub status: Value,
    /// When the earliest kept `disruptedPods` entry expires and the budget must be computed again.
    pub recheck: Option<Duration>,
}

/// `minAvailable`/`maxUnavailable` as an integer or a percentage of `total`, percentages rounded up.
fn scaled(v: &Value, total: i64) -> Result<i64, String> {
    if let Some(n) = v.as_i64() {
        return Ok(n);
    }
    let s = v.as_str().unwrap_or("");
    let pct = s
        .strip_suffix('%')
        .and_then(|p| p.parse::<i64>().ok())
        .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
    Ok((pct * total + 99) / 100)
}

/// The status the disruption controller would write for `pdb` given the pods its selector matches.
pub fn compute(
    pdb: &Value,
    pods: &[Arc<Value>],
    scale: &dyn Fn(&Value) -> Option<(String, i64)>,
    now: jiff::Timestamp,
) -> Computed {
    let old = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
    let generation = pdb
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let expected_scale = || {
        let mut controllers: HashMap<String, i64> = HashMap::new();
        let mut unowned = 0;
        for p in pods {
            match scale(p) {
                Some((uid, n)) => {
                    controllers.insert(uid, n);
                }
                None => unowned += 1,
            }
        }
        controllers.values().sum::<i64>() + unowned
    };
    let spec = pdb.get("spec").cloned().unwrap_or_default();
    let counts: Result<(i64, i64), String> = if let Some(max) = spec.get("maxUnavailable") {
        let expected = expected_scale();
        scaled(max, expected).map(|m| (expected, (expected - m).max(0)))
    } else if let Some(min) = spec.get("minAvailable") {
        if min.is_i64() {
            scaled(min, 0).map(|d| (pods.len() as i64, d))
        } else {
            let expected = expected_scale();
            scaled(min, expected).map(|d| (expected, d))
        }
    } else {
        Ok((0, 0))
    };
    let (expected, desired) = match counts {
        Ok(c) => c,
        Err(msg) => {
            // Fail safe: no disruption allowed, and observedGeneration stays behind.
            let mut status = old.clone();
            status["disruptionsAllowed"] = json!(0);
            set_condition(&mut status, &old, "False", "SyncFailed", &msg);
            return Computed {
                status,
                recheck: None,
            };
        }
    };
    let old_disrupted = old.get("disruptedPods").and_then(Value::as_object);
    let mut disrupted = Map::new();
    let mut recheck: Option<Duration> = None;
    for p in pods {
        if is_terminating(p) {
            continue;
        }
        let name = meta_str(p, "name").unwrap_or("");
        let Some(at) = old_disrupted.and_then(|m| m.get(name)) else {
            continue;
        };
        let Some(t) = at.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) else {
            continue;
        };
        let expires = t + DELETION_TIMEOUT;
        if expires <= now {
            continue;
        }
        let left = Duration::try_from(expires.duration_since(now)).unwrap_or_default();
        recheck = Some(recheck.map_or(left, |r| r.min(left)));
        disrupted.insert(name.to_string(), at.clone());
    }
    let healthy = pods
        .iter()
        .filter(|p| !is_terminating(p))
        .filter(|p| !disrupted.contains_key(meta_str(p, "name").unwrap_or("")))
        .filter(|p| is_ready(p))
        .count() as i64;
    // A budget matching no pods yet allows nothing, so that its first pods are safe before it is synced.
    let allowed = if expected <= 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    let mut status = json!({
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
    });
    if !disrupted.is_empty() {
        status["disruptedPods"] = Value::Object(disrupted);
    }
    let (state, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    set_condition(&mut status, &old, state, reason, "");
    Computed { status, recheck }
}

/// Sets the `DisruptionAllowed` condition, keeping its transition time while its status is unchanged.
pub fn set_condition(status: &mut Value, old: &Value, state: &str, reason: &str, message: &str) {
    let previous = old
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
        });
    let since = match previous {
        Some(c) if c.get("status").and_then(Value::as_str) == Some(state) => {
            c.get("lastTransitionTime").cloned().unwrap_or(json!(null))
        }
        _ => json!(super::meta::now_rfc3339()),
    };
    let observed = status
        .get("observedGeneration")
        .cloned()
        .unwrap_or(json!(0));
    let mut others: Vec<Value> = old
        .get("conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| c.get("type").and_then(Value::as_str) != Some("DisruptionAllowed"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    others.push(
        json!({"type": "DisruptionAllowed", "status": state, "reason": reason,
        "message": message, "observedGeneration": observed, "lastTransitionTime": since}),
    );
    status["conditions"] = Value::Array(others);
}

/// Pod names to eviction times, as `status.disruptedPods` holds them.
pub fn disrupted_pods(pdb: &Value) -> BTreeMap<String, String> {
    pdb.pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": {"app": "db"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
    }

    fn pdb(spec: Value) -> Value {
        let mut s = spec;
        s["selector"] = json!({"matchLabels": {"app": "db"}});
        json!({"metadata": {"name": "b", "generation": 2}, "spec": s})
    }

    fn no_scale(_: &Value) -> Option<(String, i64)> {
        None
    }

    #[test]
    fn min_available_counts_ready_pods() {
        let pods = [pod("a", true), pod("b", true), pod("c", false)];
        let c = compute(
            &pdb(json!({"minAvailable": 1})),
            &pods,
            &no_scale,
            jiff::Timestamp::now(),
        );
        assert_eq!(c.status["currentHealthy"], 2);
        assert_eq!(c.status["desiredHealthy"], 1);
        assert_eq!(c.status["expectedPods"], 3);
        assert_eq!(c.status["disruptionsAllowed"], 1);
        assert_eq!(c.status["observedGeneration"], 2);
        assert_eq!(c.status["conditions"][0]["reason"], "SufficientPods");
    }

    #[test]
    fn percentages_round_up_and_use_controller_scale() {
        let pods = [pod("a", true), pod("b", true)];
        let scale = |_: &Value| Some(("sts-uid".to_string(), 4));
        let c = compute(
            &pdb(json!({"maxUnavailable": "30%"})),
            &pods,
            &scale,
            jiff::Timestamp::now(),
        );
        // 30% of 4 rounds up to 2 unavailable: 2 desired, 2 healthy.
        assert_eq!(c.status["expectedPods"], 4);
        assert_eq!(c.status["desiredHealthy"], 2);
        assert_eq!(c.status["disruptionsAllowed"], 0);
        assert_eq!(c.status["conditions"][0]["reason"], "InsufficientPods");
    }

    #[test]
    fn recent_disruptions_are_not_healthy_and_expire() {
        let now = jiff::Timestamp::now();
        let mut b = pdb(json!({"maxUnavailable": 1}));
        let recent = (now - jiff::SignedDuration::from_secs(10)).to_string();
        let old = (now - jiff::SignedDuration::from_secs(300)).to_string();
        b["status"] = json!({"disruptedPods": {"a": recent, "b": old, "gone": recent}});
        let pods = [pod("a", true), pod("b", true), pod("c", true)];
        let c = compute(&b, &pods, &no_scale, now);
        assert_eq!(c.status["currentHealthy"], 2);
        assert_eq!(c.status["disruptedPods"].as_object().unwrap().len(), 1);
        assert!(c.recheck.unwrap() <= Duration::from_secs(110));
    }

    #[test]
    fn invalid_spec_fails_safe() {
        let c = compute(
            &pdb(json!({"minAvailable": "half"})),
            &[pod("a", true)],
            &no_scale,
            jiff::Timestamp::now(),
        );
        assert_eq!(c.status["disruptionsAllowed"], 0);
        assert_eq!(c.status["conditions"][0]["reason"], "SyncFailed");
        assert!(c.status.get("observedGeneration").is_none());
    }
}

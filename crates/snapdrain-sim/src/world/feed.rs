//! A controller's view of one resource: the objects at subscription time, then each change with the
//! object before and after it. A subscriber that falls behind the store's broadcast buffer re-reads
//! everything and gets the difference as ordinary changes, so no controller needs a special resync path.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{EventType, Store, WatchEvent};

/// `(namespace or "", name)`.
pub type ObjKey = (String, String);

pub fn obj_key(obj: &Value) -> ObjKey {
    (
        meta_str(obj, "namespace").unwrap_or("").to_string(),
        meta_str(obj, "name").unwrap_or("").to_string(),
    )
}

/// One change: `old` is None for an addition, `new` is None for a removal.
#[derive(Clone, Debug)]
pub struct Change {
    pub key: ObjKey,
    pub old: Option<Arc<Value>>,
    pub new: Option<Arc<Value>>,
}

pub struct Feed {
    store: Store,
    res: ResKey,
    rx: Receiver<Arc<WatchEvent>>,
    /// What this controller has seen, to turn a re-read after lagging into exact changes.
    known: HashMap<ObjKey, Arc<Value>>,
}

impl Feed {
    /// Subscribes and returns the current objects as additions.
    pub fn open(store: &Store, res: ResKey) -> (Self, Vec<Change>) {
        let (objects, rx) = store.subscribe(&res);
        let mut feed = Self {
            store: store.clone(),
            res,
            rx,
            known: HashMap::new(),
        };
        let changes = feed.replace_all(objects);
        (feed, changes)
    }

    /// Waits for the next changes (one event, or many after a re-read).
    pub async fn recv(&mut self) -> Vec<Change> {
        loop {
            match self.rx.recv().await {
                Ok(ev) => {
                    if let Some(c) = self.apply(&ev) {
                        return vec![c];
                    }
                }
                Err(RecvError::Lagged(_)) => return self.resync(),
                // The store holds the sender for its whole life: closing means the cluster is going away.
                Err(RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }

    /// Every change already waiting, without blocking. Controllers drain this before reconciling so that
    /// objects they created themselves are in their view (the store emits events as it writes).
    pub fn try_recv(&mut self) -> Vec<Change> {
        let mut out = Vec::new();
        loop {
            match self.rx.try_recv() {
                Ok(ev) => out.extend(self.apply(&ev)),
                Err(TryRecvError::Lagged(_)) => out.extend(self.resync()),
                Err(TryRecvError::Empty | TryRecvError::Closed) => return out,
            }
        }
    }

    fn apply(&mut self, ev: &WatchEvent) -> Option<Change> {
        let key = obj_key(&ev.object);
        match ev.type_ {
            EventType::Added | EventType::Modified => {
                let old = self.known.insert(key.clone(), ev.object.clone());
                Some(Change {
                    key,
                    old,
                    new: Some(ev.object.clone()),
                })
            }
            EventType::Deleted => {
                let old = self.known.remove(&key);
                Some(Change {
                    key,
                    old: old.or_else(|| ev.previous.clone()),
                    new: None,
                })
            }
        }
    }

    fn resync(&mut self) -> Vec<Change> {
        tracing::debug!(resource = %self.res.plural, "world controller fell behind; re-reading");
        let (objects, rx) = self.store.subscribe(&self.res);
        self.rx = rx;
        self.replace_all(objects)
    }

    fn replace_all(&mut self, objects: Vec<Arc<Value>>) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut fresh: HashMap<ObjKey, Arc<Value>> = HashMap::with_capacity(objects.len());
        // Additions and modifications in store order (namespace, name), so that initial work is ordered.
        for new in objects {
            let key = obj_key(&new);
            match self.known.get(&key) {
                Some(old) if Arc::ptr_eq(old, &new) => {}
                old => changes.push(Change {
                    key: key.clone(),
                    old: old.cloned(),
                    new: Some(new.clone()),
                }),
            }
            fresh.insert(key, new);
        }
        for (key, old) in &self.known {
            if !fresh.contains_key(key) {
                changes.push(Change {
                    key: key.clone(),
                    old: Some(old.clone()),
                    new: None,
                });
            }
        }
        self.known = fresh;
        changes
    }

    /// The object as this controller last saw it.
    pub fn get(&self, key: &ObjKey) -> Option<&Arc<Value>> {
        self.known.get(key)
    }

    pub fn objects(&self) -> impl Iterator<Item = &Arc<Value>> {
        self.known.values()
    }
}

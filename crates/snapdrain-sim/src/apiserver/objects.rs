//! One resource's stored objects and what the store keeps beside them: secondary indexes on the fields
//! the world's controllers look objects up by (a pod's node, a node's providerID, an owner's uid), and
//! each object's serialized JSON for lists. `insert` and `remove` are the only ways to change the
//! objects and they maintain both, so neither can disagree with the objects (at scale-5k a scan of
//! 150,000 pods per lookup, and serializing them all on every full list, were the hot spots).

use std::collections::btree_map::Range;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;

use super::resources::ResKey;

/// `(namespace or "", name)`: the storage key, in list order.
pub type ObjKey = (String, String);

/// A field objects are looked up by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// A string at a JSON pointer, e.g. `/spec/nodeName`.
    Pointer(&'static str),
    /// The uid of any of `metadata.ownerReferences`.
    OwnerUid,
}

pub const POD_NODE: Field = Field::Pointer("/spec/nodeName");
pub const NODE_PROVIDER_ID: Field = Field::Pointer("/spec/providerID");
pub const ATTACHMENT_NODE: Field = Field::Pointer("/spec/nodeName");
pub const CLAIM_PROVIDER_ID: Field = Field::Pointer("/status/providerID");

impl Field {
    /// The values this object is found under.
    pub fn values(self, obj: &Value) -> Vec<&str> {
        match self {
            Field::Pointer(p) => obj.pointer(p).and_then(Value::as_str).into_iter().collect(),
            Field::OwnerUid => obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
                .unwrap_or_default(),
        }
    }
}

/// The fields indexed for a resource: those the world's controllers look up on every pass.
pub fn indexed_fields(key: &ResKey) -> &'static [Field] {
    match (key.group.as_str(), key.plural.as_str()) {
        ("", "pods") => &[POD_NODE, Field::OwnerUid],
        ("", "nodes") => &[NODE_PROVIDER_ID],
        ("", "persistentvolumeclaims") => &[Field::OwnerUid],
        ("storage.k8s.io", "volumeattachments") => &[ATTACHMENT_NODE],
        ("karpenter.sh", "nodeclaims") => &[CLAIM_PROVIDER_ID],
        ("apps", "replicasets" | "controllerrevisions") => &[Field::OwnerUid],
        _ => &[],
    }
}

pub struct Objects {
    map: BTreeMap<ObjKey, Arc<Value>>,
    fields: &'static [Field],
    index: HashMap<(Field, String), BTreeSet<ObjKey>>,
    /// Serialized JSON of stored objects, filled by lists and dropped when the object changes.
    json: Mutex<HashMap<ObjKey, Bytes>>,
}

impl Objects {
    pub fn new(key: &ResKey) -> Self {
        Self {
            map: BTreeMap::new(),
            fields: indexed_fields(key),
            index: HashMap::new(),
            json: Mutex::new(HashMap::new()),
        }
    }

    fn json_cache(&self) -> std::sync::MutexGuard<'_, HashMap<ObjKey, Bytes>> {
        // A cache: a panic while it was held leaves entries that are still valid or absent.
        self.json.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: &ObjKey) -> Option<&Arc<Value>> {
        self.map.get(key)
    }

    pub fn contains_key(&self, key: &ObjKey) -> bool {
        self.map.contains_key(key)
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Value>> {
        self.map.values()
    }

    pub fn range(&self, start: Bound<ObjKey>) -> Range<'_, ObjKey, Arc<Value>> {
        self.map.range((start, Bound::Unbounded))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn insert(&mut self, key: ObjKey, obj: Arc<Value>) -> Option<Arc<Value>> {
        let old = self.map.insert(key.clone(), obj.clone());
        if let Some(old) = &old {
            self.unindex(&key, old);
        }
        self.json_cache().remove(&key);
        for &f in self.fields {
            for v in f.values(&obj) {
                self.index
                    .entry((f, v.to_string()))
                    .or_default()
                    .insert(key.clone());
            }
        }
        old
    }

    pub fn remove(&mut self, key: &ObjKey) -> Option<Arc<Value>> {
        let old = self.map.remove(key)?;
        self.unindex(key, &old);
        self.json_cache().remove(key);
        Some(old)
    }

    /// Every object, leaving the resource empty.
    pub fn take_all(&mut self) -> Vec<(ObjKey, Arc<Value>)> {
        self.index.clear();
        self.json_cache().clear();
        std::mem::take(&mut self.map).into_iter().collect()
    }

    fn unindex(&mut self, key: &ObjKey, old: &Value) {
        for &f in self.fields {
            for v in f.values(old) {
                let k = (f, v.to_string());
                if let Some(set) = self.index.get_mut(&k) {
                    set.remove(key);
                    if set.is_empty() {
                        self.index.remove(&k);
                    }
                }
            }
        }
    }

    /// Objects whose `field` has `value`, in storage order; a scan when the field is not indexed.
    pub fn by_field(&self, field: Field, value: &str) -> Vec<Arc<Value>> {
        if self.fields.contains(&field) {
            return self
                .index
                .get(&(field, value.to_string()))
                .into_iter()
                .flatten()
                .filter_map(|k| self.map.get(k).cloned())
                .collect();
        }
        self.map
            .values()
            .filter(|o| field.values(o).contains(&value))
            .cloned()
            .collect()
    }

    /// Writes `items` as JSON separated by commas, reusing each stored object's cached bytes. An item
    /// that is no longer the stored object (written since it was read) is serialized afresh, uncached.
    pub fn write_json(&self, items: &[Arc<Value>], buf: &mut Vec<u8>) -> serde_json::Result<()> {
        let mut cache = self.json_cache();
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            let key = key_of(item);
            let current = self.map.get(&key).is_some_and(|o| Arc::ptr_eq(o, item));
            if !current {
                serde_json::to_writer(&mut *buf, item.as_ref())?;
                continue;
            }
            match cache.get(&key) {
                Some(bytes) => buf.extend_from_slice(bytes),
                None => {
                    let bytes = Bytes::from(serde_json::to_vec(item.as_ref())?);
                    buf.extend_from_slice(&bytes);
                    cache.insert(key, bytes);
                }
            }
        }
        Ok(())
    }
}

fn key_of(obj: &Value) -> ObjKey {
    let s = |f: &str| {
        obj.pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("namespace"), s("name"))
}

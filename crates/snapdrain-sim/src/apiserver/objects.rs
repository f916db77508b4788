//! One resource's stored objects and what the store keeps beside them: secondary indexes on the fields
//! the world's controllers look objects up by (a pod's node, a node's providerID, an owner's uid), and
//! each object's serialized JSON for lists. `insert` and `remove` are the only ways to change the
//! objects and they maintain both, so neither can disagree with the objects (at scale-5k a scan of
//! 150,000 pods per lookup, and serializing them all on every full list, were the hot spots).

use std::collections::btree_map::Range;
use std::collections::{BTreeMap, HashMap};
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
pub const CLAIM_NODE: Field = Field::Pointer("/status/nodeName");

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
        ("karpenter.sh", "nodeclaims") => &[CLAIM_PROVIDER_ID, CLAIM_NODE],
        ("apps", "replicasets" | "controllerrevisions") => &[Field::OwnerUid],
        _ => &[],
    }
}

/// The address of a stored object's allocation: while the object is stored (the map holds its `Arc`)
/// no other object can have it, so it names the object without hashing its key's two strings.
type ObjId = usize;

fn id_of(obj: &Arc<Value>) -> ObjId {
    Arc::as_ptr(obj) as usize
}

/// Fibonacci hashing of an [`ObjId`]: allocation addresses share their low bits, which a plain
/// identity hash would put in the same buckets; SipHash of 150,000 keys per list showed in profiles.
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<ObjId, V, std::hash::BuildHasherDefault<IdHasher>>;

pub struct Objects {
    map: BTreeMap<ObjKey, Arc<Value>>,
    fields: &'static [Field],
    /// The objects under each indexed (field, value), by key: a lookup reads them from here rather
    /// than finding each key in `map` (string comparisons that dominated profiles of scale-5k).
    index: HashMap<(Field, String), BTreeMap<ObjKey, Arc<Value>>>,
    /// Serialized JSON of stored objects by [`ObjId`], filled by lists and dropped when the object is
    /// replaced or removed, so an entry always belongs to the object stored now.
    json: Mutex<IdMap<Bytes>>,
}

impl Objects {
    pub fn new(key: &ResKey) -> Self {
        Self {
            map: BTreeMap::new(),
            fields: indexed_fields(key),
            index: HashMap::new(),
            json: Mutex::new(IdMap::default()),
        }
    }

    fn json_cache(&self) -> std::sync::MutexGuard<'_, IdMap<Bytes>> {
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
            self.json_cache().remove(&id_of(old));
        }
        for &f in self.fields {
            for v in f.values(&obj) {
                self.index
                    .entry((f, v.to_string()))
                    .or_default()
                    .insert(key.clone(), obj.clone());
            }
        }
        old
    }

    pub fn remove(&mut self, key: &ObjKey) -> Option<Arc<Value>> {
        let old = self.map.remove(key)?;
        self.unindex(key, &old);
        self.json_cache().remove(&id_of(&old));
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
                .flat_map(|set| set.values().cloned())
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
        // Room for all of it at once: growing a 300 MiB buffer step by step copies it each time.
        let known: usize = items
            .iter()
            .filter_map(|i| cache.get(&id_of(i)).map(Bytes::len))
            .sum();
        buf.reserve(known + items.len());
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            let id = id_of(item);
            if let Some(bytes) = cache.get(&id) {
                buf.extend_from_slice(bytes);
                continue;
            }
            let current = self
                .map
                .get(&key_of(item))
                .is_some_and(|o| Arc::ptr_eq(o, item));
            if !current {
                serde_json::to_writer(&mut *buf, item.as_ref())?;
                continue;
            }
            let bytes = Bytes::from(serde_json::to_vec(item.as_ref())?);
            buf.extend_from_slice(&bytes);
            cache.insert(id, bytes);
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

//! One shared copy of what 150,000 cached pods repeat: strings (namespaces, node names, label keys,
//! owners' kinds, apiVersions and names, priority classes, phases), whole label sets (the pods of one
//! ReplicaSet or DaemonSet carry the same labels) and owner lists (the same owner). Each is a heap
//! allocation per pod otherwise (tens of MiB at scale); interned, a pod holds a pointer.
//!
//! Values nobody holds any more (a replaced node's name, a rolled-out ReplicaSet's labels) are dropped
//! when a pool has doubled since it was last pruned, so each pool stays within twice what is in use.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

/// Shared copies of values of one type, found by content.
pub struct Pool<T: ?Sized> {
    values: Mutex<Shared<T>>,
}

struct Shared<T: ?Sized> {
    set: HashSet<Arc<T>>,
    prune_at: usize,
}

const MIN_PRUNE_AT: usize = 4096;

impl<T: ?Sized + Hash + Eq> Pool<T> {
    pub fn new() -> Self {
        Self {
            values: Mutex::new(Shared {
                set: HashSet::new(),
                prune_at: MIN_PRUNE_AT,
            }),
        }
    }

    /// The shared copy of `value`, made by `make` when the pool has none.
    pub fn get(&self, value: &T, make: impl FnOnce(&T) -> Arc<T>) -> Arc<T> {
        // A panic while the lock is held leaves the set whole (one insert or one retain): go on with it.
        let mut pool = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = pool.set.get(value) {
            return shared.clone();
        }
        if pool.set.len() >= pool.prune_at {
            // Only the pool holds these.
            pool.set.retain(|v| Arc::strong_count(v) > 1);
            pool.prune_at = (pool.set.len() * 2).max(MIN_PRUNE_AT);
        }
        let shared = make(value);
        pool.set.insert(shared.clone());
        shared
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .len()
    }
}

impl<T: ?Sized + Hash + Eq> Default for Pool<T> {
    fn default() -> Self {
        Self::new()
    }
}

static STRINGS: LazyLock<Pool<str>> = LazyLock::new(Pool::new);

/// The shared copy of `s`.
pub fn intern(s: &str) -> Arc<str> {
    STRINGS.get(s, |s| Arc::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_copy() {
        let a = intern("tenant-07");
        let b = intern(&String::from("tenant-07"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(&*intern("tenant-08"), &*a);
    }

    #[test]
    fn values_nobody_holds_are_pruned_and_held_ones_stay() {
        let pool: Pool<str> = Pool::new();
        let held = pool.get("held-across-prunes", |s| Arc::from(s));
        // Enough unheld values to force at least one prune.
        for i in 0..MIN_PRUNE_AT * 3 {
            pool.get(&format!("transient-{i}"), |s| Arc::from(s));
        }
        assert!(
            pool.len() < MIN_PRUNE_AT * 3,
            "unheld values were dropped: {} left",
            pool.len()
        );
        assert!(Arc::ptr_eq(
            &held,
            &pool.get("held-across-prunes", |s| Arc::from(s))
        ));
    }

    #[test]
    fn slices_are_shared_by_content() {
        let pool: Pool<[(Arc<str>, Box<str>)]> = Pool::new();
        let set = |v: &str| -> Vec<(Arc<str>, Box<str>)> { vec![(intern("app"), v.into())] };
        let a = pool.get(&set("web"), |s| Arc::from(s));
        let b = pool.get(&set("web"), |s| Arc::from(s));
        let c = pool.get(&set("db"), |s| Arc::from(s));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}

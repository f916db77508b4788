//! One shared copy of the strings that 150,000 cached pods repeat: namespaces, node names, label keys,
//! owners' kinds, apiVersions and names, priority classes, phases. Each is a heap allocation per pod
//! otherwise (tens of MiB at scale); interned, a pod holds a pointer.
//!
//! Strings nobody holds any more (a replaced node's name, a rolled-out ReplicaSet's) are dropped when
//! the pool has doubled since it was last pruned, so the pool stays within twice what is in use.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

struct Pool {
    strings: HashSet<Arc<str>>,
    prune_at: usize,
}

const MIN_PRUNE_AT: usize = 4096;

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(|| {
    Mutex::new(Pool {
        strings: HashSet::new(),
        prune_at: MIN_PRUNE_AT,
    })
});

/// The shared copy of `s`.
pub fn intern(s: &str) -> Arc<str> {
    // A panic while the lock is held leaves the set whole (one insert or one retain): go on with it.
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(shared) = pool.strings.get(s) {
        return shared.clone();
    }
    if pool.strings.len() >= pool.prune_at {
        // Only the pool holds these.
        pool.strings.retain(|s| Arc::strong_count(s) > 1);
        pool.prune_at = (pool.strings.len() * 2).max(MIN_PRUNE_AT);
    }
    let shared: Arc<str> = Arc::from(s);
    pool.strings.insert(shared.clone());
    shared
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
    fn strings_nobody_holds_are_pruned_and_held_ones_stay() {
        let held = intern("held-across-prunes");
        // Enough unheld strings to force at least one prune.
        for i in 0..MIN_PRUNE_AT * 3 {
            intern(&format!("transient-{i}"));
        }
        let pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        assert!(pool.strings.contains("held-across-prunes"));
        assert!(
            pool.strings.len() < MIN_PRUNE_AT * 3,
            "unheld strings were dropped: {} left",
            pool.strings.len()
        );
        drop(pool);
        assert!(Arc::ptr_eq(&held, &intern("held-across-prunes")));
    }
}

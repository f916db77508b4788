//! What the soak does and how its figures are cut, decided without I/O: the churn schedule from a seed,
//! which node a disruption takes, the name of a NodeClaim that lands in a given zone, and the
//! per-decile arithmetic of API traffic.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use snapdrain_testkit::chaos::rng::Rng;

/// Where a plan comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// An Execute plan with a replacement launched after the drain.
    ExecuteReplace,
    /// An Execute plan, no replacement.
    Execute,
    /// What `snapdrain drain NODE --replace before-drain` creates: `source: manual`.
    Manual,
    /// Karpenter marks the NodeClaim `Drifted`: a Release plan, Karpenter replaces and drains.
    Drift,
    /// The NodePool's `consolidateAfter` is opened for a moment: Karpenter marks quiet NodeClaims
    /// `Consolidatable` (Release plans under `signals.consolidation: Release`) and deletes one whose
    /// pods fit elsewhere.
    Consolidation,
    /// The NodeClaim is deleted (expiry, a person): a forceful Release plan.
    NodeClaimDeleted,
    /// EC2's spot interruption notice: Karpenter deletes the NodeClaim, EC2 reclaims the instance.
    SpotInterruption,
}

pub const MODES: [Mode; 7] = [
    Mode::ExecuteReplace,
    Mode::Execute,
    Mode::Manual,
    Mode::Drift,
    Mode::Consolidation,
    Mode::NodeClaimDeleted,
    Mode::SpotInterruption,
];

/// The mix after the first round, in percent (same order as [`MODES`]): drift rollouts dominate a
/// Karpenter cluster's weeks, people's runs and spot reclaims come next.
const WEIGHTS: [u64; 7] = [15, 10, 10, 30, 10, 10, 15];

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExecuteReplace => "execute+replace",
            Self::Execute => "execute",
            Self::Manual => "manual",
            Self::Drift => "drift",
            Self::Consolidation => "consolidation",
            Self::NodeClaimDeleted => "nodeclaim-deleted",
            Self::SpotInterruption => "spot-interruption",
        }
    }

    /// Whether the disruption is aimed at one node the soak picks (consolidation's is Karpenter's).
    pub fn picks_node(self) -> bool {
        self != Self::Consolidation
    }

    /// Whether the node must be Karpenter's (the signal comes from its NodeClaim).
    /// Whether the node goes on a clock snapdrain does not control (a forceful signal): how soon its
    /// plan exists decides what the deadline leaves for the backup.
    pub fn forceful(self) -> bool {
        matches!(self, Self::NodeClaimDeleted | Self::SpotInterruption)
    }

    pub fn needs_nodeclaim(self) -> bool {
        matches!(
            self,
            Self::Drift | Self::NodeClaimDeleted | Self::SpotInterruption
        )
    }
}

/// `n` disruptions for `seed`: every mode once first (in an order the seed picks), then by [`WEIGHTS`].
pub fn schedule(seed: u64, n: usize) -> Vec<Mode> {
    let mut rng = Rng::new(seed);
    let mut first = MODES.to_vec();
    rng.shuffle(&mut first);
    let total: u64 = WEIGHTS.iter().sum();
    (0..n)
        .map(|i| match first.get(i) {
            Some(m) => *m,
            None => {
                let mut roll = rng.below(total);
                let mut chosen = MODES[0];
                for (m, w) in MODES.iter().zip(WEIGHTS) {
                    if roll < w {
                        chosen = *m;
                        break;
                    }
                    roll -= w;
                }
                chosen
            }
        })
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

const ZONE: &str = "topology.kubernetes.io/zone";

pub fn zone_of(node: &Value) -> Option<&str> {
    node.pointer("/metadata/labels")
        .and_then(|l| l.get(ZONE))
        .and_then(Value::as_str)
}

/// A node a disruption may take or a pod may land on: Ready, schedulable, not deleting, untainted.
pub fn open(node: &Value) -> bool {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    ready
        && node.pointer("/spec/unschedulable") != Some(&Value::Bool(true))
        && node.pointer("/metadata/deletionTimestamp").is_none()
        && node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

pub fn owned_by_nodeclaim(node: &Value) -> bool {
    node.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|r| r["kind"] == "NodeClaim"))
}

/// The node a disruption of `mode` takes: open, running a protected pod (`protected`, `ns/name`), with
/// another open node in its zone (the pods' volumes are zonal), not `busy`, Karpenter's when the mode
/// needs a NodeClaim; the `choice`-th of those by name (wrapping), so the seed spreads the picks.
pub fn pick_node(
    mode: Mode,
    nodes: &[Value],
    pods: &[Value],
    protected: &BTreeSet<String>,
    busy: &BTreeSet<String>,
    choice: u64,
) -> Option<String> {
    let runs_protected: BTreeSet<&str> = pods
        .iter()
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| {
            protected.contains(&format!(
                "{}/{}",
                str_at(p, "/metadata/namespace").unwrap_or_default(),
                str_at(p, "/metadata/name").unwrap_or_default()
            ))
        })
        .filter_map(|p| str_at(p, "/spec/nodeName"))
        .collect();
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes.iter().filter(|n| open(n)) {
        *per_zone.entry(zone_of(n).unwrap_or_default()).or_default() += 1;
    }
    let candidates: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| open(n) && (!mode.needs_nodeclaim() || owned_by_nodeclaim(n)))
        .filter(|n| per_zone.get(zone_of(n).unwrap_or_default()).copied() >= Some(2))
        .filter_map(|n| str_at(n, "/metadata/name"))
        .filter(|name| runs_protected.contains(name) && !busy.contains(*name))
        .collect();
    let count = candidates.len() as u64;
    (count > 0)
        .then(|| candidates.into_iter().nth((choice % count) as usize))
        .flatten()
        .map(str::to_string)
}

/// A NodeClaim name, from `base`, that the simulated Karpenter launches in subnet `zone_index` of
/// `zones`: it spreads NodeClaims over the scenario's subnets (one per zone, in zone-name order) by the
/// sum of the name's bytes (snapdrain-sim `world/karpenter/ec2.rs`, `launch`).
pub fn claim_name_in_zone(base: &str, zone_index: usize, zones: usize) -> String {
    let zones = zones.max(1);
    let sum: usize =
        base.bytes().map(usize::from).sum::<usize>() + usize::from(b'-') + usize::from(b'a');
    // One trailing letter from 'a' on shifts the sum by 0..zones.
    let shift = (zone_index % zones + zones - sum % zones) % zones;
    let letter = char::from(b'a' + u8::try_from(shift).unwrap_or(0));
    format!("{base}-{letter}")
}

/// Counts of requests by verb.
pub type Tally = BTreeMap<String, u64>;

/// The plan counts at which the run's deciles end: `plans` cut into ten (the last takes the rest).
pub fn decile_ends(plans: usize) -> Vec<usize> {
    (1..=10).map(|k| (plans * k).div_ceil(10)).collect()
}

/// Requests per plan of a decile: its tally over the plans it saw (none: the whole tally, as one).
pub fn per_plan(tally: &Tally, plans: usize) -> f64 {
    tally.values().sum::<u64>() as f64 / plans.max(1) as f64
}

/// `verb=n/plan` for each verb, largest first, at most `top`.
pub fn by_verb(tally: &Tally, plans: usize, top: usize) -> String {
    let mut v: Vec<(&String, &u64)> = tally.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .take(top)
        .map(|(verb, n)| format!("{verb}={:.1}", **n as f64 / plans.max(1) as f64))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_seed_gives_one_schedule_with_every_mode_first() {
        assert_eq!(schedule(3, 50), schedule(3, 50));
        assert_ne!(schedule(3, 50), schedule(4, 50));
        for seed in 0..20 {
            let s = schedule(seed, 200);
            let mut first = s[..MODES.len()].to_vec();
            first.sort();
            assert_eq!(first, MODES.to_vec(), "seed {seed}");
        }
        let s = schedule(1, 5000);
        let drift = s.iter().filter(|m| **m == Mode::Drift).count();
        // 30% of the mix, within a few points.
        assert!((1300..1700).contains(&drift), "{drift} drifts in 5000");
    }

    fn node(name: &str, zone: &str, karpenter: bool) -> Value {
        let owners = if karpenter {
            json!([{"kind": "NodeClaim", "name": format!("claim-{name}")}])
        } else {
            json!([])
        };
        json!({"metadata": {"name": name, "labels": {ZONE: zone}, "ownerReferences": owners},
               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn pod(name: &str, node: &str) -> Value {
        json!({"metadata": {"namespace": "shop", "name": name}, "spec": {"nodeName": node}})
    }

    #[test]
    fn a_node_is_picked_only_with_protected_pods_a_zone_sibling_and_no_running_plan() {
        let nodes = vec![
            node("a1", "a", true),
            node("a2", "a", false),
            node("b1", "b", true),
            node("c1", "c", true),
            node("c2", "c", true),
        ];
        let pods = vec![
            pod("db-0", "a1"),
            pod("db-1", "a2"),
            pod("db-2", "b1"),
            pod("db-3", "c1"),
            pod("web-0", "c2"),
        ];
        let protected: BTreeSet<String> = ["shop/db-0", "shop/db-1", "shop/db-2", "shop/db-3"]
            .map(String::from)
            .into();
        let none = BTreeSet::new();
        let all: BTreeSet<String> = (0..10)
            .filter_map(|c| pick_node(Mode::Execute, &nodes, &pods, &protected, &none, c))
            .collect();
        // b1 is alone in its zone; c2 runs nothing protected.
        assert_eq!(all, ["a1", "a2", "c1"].map(String::from).into());
        let karpenter: BTreeSet<String> = (0..10)
            .filter_map(|c| pick_node(Mode::Drift, &nodes, &pods, &protected, &none, c))
            .collect();
        assert_eq!(karpenter, ["a1", "c1"].map(String::from).into());
        let busy: BTreeSet<String> = ["a1", "c1"].map(String::from).into();
        assert_eq!(
            pick_node(Mode::Drift, &nodes, &pods, &protected, &busy, 0),
            None
        );
    }

    #[test]
    fn a_claim_name_lands_in_the_zone_asked_for() {
        for zones in 1..5 {
            for want in 0..zones {
                for k in 0..30 {
                    let name = claim_name_in_zone(&format!("soak-{k}"), want, zones);
                    let sum: usize = name.bytes().map(usize::from).sum();
                    assert_eq!(sum % zones, want, "{name} of {zones}");
                }
            }
        }
    }

    #[test]
    fn deciles_cut_the_run_and_traffic_is_per_plan() {
        assert_eq!(
            decile_ends(2000),
            [200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000]
        );
        assert_eq!(decile_ends(15), [2, 3, 5, 6, 8, 9, 11, 12, 14, 15]);
        let tally: Tally = [("get".to_string(), 30), ("patch".to_string(), 90)].into();
        assert_eq!(per_plan(&tally, 20), 6.0);
        assert_eq!(per_plan(&Tally::new(), 0), 0.0);
        assert_eq!(by_verb(&tally, 20, 1), "patch=4.5");
    }
}

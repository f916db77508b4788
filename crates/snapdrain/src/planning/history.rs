//! Which finished plans to delete: the policy's `history` (a TTL after the plan ended, the newest few of
//! each existing node kept beyond it, `snapdrain.io/keep: "true"` never deleted). Without it plans pile
//! up for good: a weekly drift of 5,000 nodes alone makes 65,000 in a quarter, and every replica keeps
//! them all in memory.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;

/// What the decision needs of one plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanAge {
    pub name: String,
    /// When it became Completed, Failed or Aborted; `None` while it runs.
    pub ended_at: Option<Timestamp>,
    /// The nodes it covers (its status, else its spec).
    pub nodes: Vec<String>,
    /// Annotated `snapdrain.io/keep: "true"`.
    pub keep: bool,
}

/// The history settings, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub ttl: Duration,
    pub keep_per_node: usize,
}

/// The plans to delete now, by name, oldest first. A plan is kept while it runs, while it is marked to
/// be kept, until `ttl` after it ended, and while it is among the `keep_per_node` newest finished plans
/// of a node in `live_nodes` (a node that is gone keeps nothing: Karpenter's node names never come
/// back, so keeping per gone node would grow without bound).
pub fn expired(
    plans: &[PlanAge],
    live_nodes: &HashSet<&str>,
    now: Timestamp,
    retention: Retention,
) -> Vec<String> {
    let mut newest_per_node: BTreeMap<&str, Vec<(Timestamp, &str)>> = BTreeMap::new();
    for p in plans {
        if let Some(ended) = p.ended_at {
            for n in &p.nodes {
                if live_nodes.contains(n.as_str()) {
                    newest_per_node
                        .entry(n)
                        .or_default()
                        .push((ended, p.name.as_str()));
                }
            }
        }
    }
    let mut kept_for_node: HashSet<&str> = HashSet::new();
    for ends in newest_per_node.values_mut() {
        // Newest first; equal times by name, so the choice does not depend on list order.
        ends.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        kept_for_node.extend(ends.iter().take(retention.keep_per_node).map(|(_, n)| *n));
    }
    let mut old: Vec<(Timestamp, &str)> = plans
        .iter()
        .filter(|p| !p.keep && !kept_for_node.contains(p.name.as_str()))
        .filter_map(|p| {
            let ended = p.ended_at?;
            let age = now.duration_since(ended);
            (age.is_positive() && age.unsigned_abs() >= retention.ttl)
                .then_some((ended, p.name.as_str()))
        })
        .collect();
    old.sort();
    old.into_iter().map(|(_, n)| n.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn now() -> Timestamp {
        "2026-12-03T12:00:00Z".parse().expect("a timestamp")
    }

    fn ended(name: &str, hours_ago: i64, nodes: &[&str]) -> PlanAge {
        PlanAge {
            name: name.into(),
            ended_at: Some(now() - jiff::SignedDuration::from_hours(hours_ago)),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            keep: false,
        }
    }

    fn live<'a>(nodes: &[&'a str]) -> HashSet<&'a str> {
        nodes.iter().copied().collect()
    }

    const THREE_DAYS_ONE_PER_NODE: Retention = Retention {
        ttl: Duration::from_secs(72 * 3600),
        keep_per_node: 1,
    };

    #[test]
    fn a_running_plan_is_never_deleted_however_old() {
        let running = PlanAge {
            ended_at: None,
            ..ended("running", 0, &["gone"])
        };
        assert!(expired(&[running], &live(&[]), now(), THREE_DAYS_ONE_PER_NODE).is_empty());
    }

    #[test]
    fn plans_older_than_the_ttl_go_oldest_first_but_the_newest_of_a_live_node_stays() {
        let plans = [
            ended("n1-run3", 100, &["n1"]),
            ended("n1-run1", 300, &["n1"]),
            ended("n1-run2", 200, &["n1"]),
            ended("n2-recent", 10, &["n2"]),
        ];
        assert_eq!(
            expired(&plans, &live(&["n1", "n2"]), now(), THREE_DAYS_ONE_PER_NODE),
            ["n1-run1", "n1-run2"]
        );
    }

    #[test]
    fn a_gone_node_keeps_nothing_past_the_ttl() {
        let plans = [ended("old", 100, &["gone"]), ended("young", 1, &["gone"])];
        assert_eq!(
            expired(&plans, &live(&["n1"]), now(), THREE_DAYS_ONE_PER_NODE),
            ["old"]
        );
    }

    #[test]
    fn a_plan_marked_keep_stays() {
        let kept = PlanAge {
            keep: true,
            ..ended("kept", 1000, &["gone"])
        };
        assert!(expired(&[kept], &live(&[]), now(), THREE_DAYS_ONE_PER_NODE).is_empty());
    }

    #[test]
    fn a_plan_over_several_nodes_stays_while_it_is_the_newest_of_any() {
        let plans = [
            ended("both", 200, &["n1", "n2"]),
            ended("n1-later", 100, &["n1"]),
        ];
        // `both` is still n2's newest.
        assert_eq!(
            expired(&plans, &live(&["n1", "n2"]), now(), THREE_DAYS_ONE_PER_NODE),
            Vec::<String>::new()
        );
        assert_eq!(
            expired(&plans, &live(&["n1"]), now(), THREE_DAYS_ONE_PER_NODE),
            ["both"]
        );
    }

    #[test]
    fn keep_per_node_zero_leaves_only_the_ttl() {
        let plans = [ended("a", 100, &["n1"]), ended("b", 1, &["n1"])];
        let r = Retention {
            ttl: 72 * HOUR,
            keep_per_node: 0,
        };
        assert_eq!(expired(&plans, &live(&["n1"]), now(), r), ["a"]);
    }

    #[test]
    fn a_plan_that_ends_in_the_future_by_clock_skew_is_not_old() {
        let skewed = ended("skewed", -5, &["gone"]);
        let r = Retention {
            ttl: Duration::ZERO,
            keep_per_node: 0,
        };
        assert!(expired(&[skewed], &live(&[]), now(), r).is_empty());
    }
}

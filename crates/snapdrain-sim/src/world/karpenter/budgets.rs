//! NodePool disruption budgets (`spec.disruption.budgets`): how many of a pool's nodes a graceful
//! method may disrupt at once. Pure, so it is unit-tested directly.

use serde_json::Value;

/// Allowed disruptions for `reason` in a pool of `total` nodes of which `disrupting` are already
/// being disrupted (deleting, NotReady or in a running command). The strictest matching budget wins;
/// no budgets means Karpenter's default `10%`. Percentages round up, as Karpenter scales them.
pub fn allowed(nodepool: &Value, reason: &str, total: usize, disrupting: usize) -> usize {
    let budgets: Vec<&Value> = nodepool
        .pointer("/spec/disruption/budgets")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let default = serde_json::json!({"nodes": "10%"});
    let budgets = if budgets.is_empty() {
        vec![&default]
    } else {
        budgets
    };
    let limit = budgets
        .iter()
        .filter(|b| {
            b.get("reasons")
                .and_then(Value::as_array)
                .is_none_or(|r| r.is_empty() || r.iter().any(|x| x.as_str() == Some(reason)))
        })
        .map(|b| {
            scaled(
                b.get("nodes").and_then(Value::as_str).unwrap_or("10%"),
                total,
            )
        })
        .min()
        .unwrap_or(usize::MAX);
    limit.saturating_sub(disrupting)
}

fn scaled(nodes: &str, total: usize) -> usize {
    match nodes.strip_suffix('%') {
        Some(p) => {
            let p: usize = p.trim().parse().unwrap_or(0);
            (total * p).div_ceil(100)
        }
        None => nodes.trim().parse().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strictest_matching_budget_wins_and_counts_in_flight() {
        let pool = json!({"spec": {"disruption": {"budgets": [
            {"nodes": "50%"}, {"nodes": "1", "reasons": ["Drifted"]}, {"nodes": "0", "reasons": ["Empty"]}]}}});
        assert_eq!(allowed(&pool, "Drifted", 10, 0), 1);
        assert_eq!(allowed(&pool, "Drifted", 10, 1), 0);
        assert_eq!(allowed(&pool, "Empty", 10, 0), 0);
        assert_eq!(allowed(&pool, "Underutilized", 10, 2), 3);
        // Default 10%, rounded up.
        assert_eq!(allowed(&json!({"spec": {}}), "Drifted", 3, 0), 1);
        assert_eq!(allowed(&json!({"spec": {}}), "Drifted", 25, 0), 3);
    }
}

//! `metav1.LabelSelector` objects (`matchLabels` and `matchExpressions`), as PodDisruptionBudgets and
//! admission webhooks (`namespaceSelector`, `objectSelector`) carry them. Query-string selectors
//! (`?labelSelector=`) live in `selectors.rs`.

use serde_json::Value;

use super::selectors::LabelSelector;

/// True when the selector has no requirement at all (`{}` or absent fields).
pub fn is_empty(selector: &Value) -> bool {
    let labels = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.is_empty());
    let exprs = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty());
    labels && exprs
}

/// Whether `labels` (a JSON map, or `None` for no labels) satisfies every requirement of `selector`.
/// An invalid selector (unknown operator, missing values) is an error, as in `LabelSelectorAsSelector`.
pub fn matches(selector: &Value, labels: Option<&Value>) -> Result<bool, String> {
    LabelSelector::from_metav1(Some(selector))
        .map(|s| s.matches(labels))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_and_expressions_all_apply() {
        let sel = json!({"matchLabels": {"app": "db"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "skip", "operator": "DoesNotExist"}]});
        assert!(matches(&sel, Some(&json!({"app": "db", "tier": "a"}))).unwrap());
        assert!(!matches(&sel, Some(&json!({"app": "db", "tier": "c"}))).unwrap());
        assert!(!matches(&sel, Some(&json!({"app": "db", "tier": "a", "skip": ""}))).unwrap());
        assert!(!matches(&sel, None).unwrap());
        let not_in =
            json!({"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["1"]}]});
        assert!(matches(&not_in, None).unwrap());
        assert!(
            matches(
                &json!({"matchExpressions": [{"key": "x", "operator": "Bad"}]}),
                None
            )
            .is_err()
        );
        assert!(is_empty(&json!({})) && !is_empty(&sel));
    }
}

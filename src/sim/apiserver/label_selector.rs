//! `metav1.LabelSelector` objects (`matchLabels` and `matchExpressions`), as PodDisruptionBudgets and
//! admission webhooks (`namespaceSelector`, `objectSelector`) carry them. Query-string selectors
//! (`?labelSelector=`) live in `selectors.rs`.

use serde_json::Value;

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
    let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    if let Some(m) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            let want = v
                .as_str()
                .ok_or_else(|| format!("matchLabels value of {k:?} is not a string"))?;
            if get(k) != Some(want) {
                return Ok(false);
            }
        }
    }
    let exprs = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for e in exprs {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let op = e.get("operator").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let actual = get(key);
        let ok = match op {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "{op:?} requires one or more values for key {key:?}"
                ));
            }
            "In" => actual.is_some_and(|a| values.contains(&a)),
            "NotIn" => actual.is_none_or(|a| !values.contains(&a)),
            "Exists" => actual.is_some(),
            "DoesNotExist" => actual.is_none(),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
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

//! Which webhooks a request must go through: `rules` (groups, versions, resources with subresources,
//! operations, scope), `namespaceSelector` and `objectSelector`, as in
//! `apiserver/pkg/admission/plugin/webhook/predicates`. `matchPolicy: Equivalent` is treated as `Exact`.

use serde_json::Value;

use super::super::label_selector;
use super::super::resources::ResKey;
use super::super::store::Store;
use super::Operation;

/// What of a request the rules look at.
pub struct RequestShape<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub operation: Operation,
    pub namespace: Option<&'a str>,
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn any_is(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// One `rules` entry against the request.
pub fn rule_matches(rule: &Value, req: &RequestShape<'_>) -> bool {
    let scope = rule.get("scope").and_then(Value::as_str).unwrap_or("*");
    // Namespace objects are cluster-scoped even though they name a namespace.
    let namespaced = req.namespace.is_some_and(|n| !n.is_empty())
        && !(req.group.is_empty() && req.resource == "namespaces");
    let scope_ok = match scope {
        "Cluster" => !namespaced,
        "Namespaced" => namespaced,
        _ => true,
    };
    let resource_ok = strings(rule.get("resources")).iter().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r, ""));
        (res == "*" || res == req.resource) && (sub == "*" || sub == req.subresource)
    });
    scope_ok
        && any_is(&strings(rule.get("operations")), req.operation.as_str())
        && any_is(&strings(rule.get("apiGroups")), req.group)
        && any_is(&strings(rule.get("apiVersions")), req.version)
        && resource_ok
}

pub fn rules_match(webhook: &Value, req: &RequestShape<'_>) -> bool {
    webhook
        .get("rules")
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|r| rule_matches(r, req)))
}

/// `namespaceSelector` against the labels of the request's namespace (for a Namespace itself, its own
/// labels). Cluster-scoped requests always match. A selector that cannot be evaluated is an error.
pub fn namespace_matches(
    webhook: &Value,
    store: &Store,
    req: &RequestShape<'_>,
    object: Option<&Value>,
    old_object: Option<&Value>,
) -> Result<bool, String> {
    let Some(sel) = webhook
        .get("namespaceSelector")
        .filter(|s| !label_selector::is_empty(s))
    else {
        return Ok(true);
    };
    if req.group.is_empty() && req.resource == "namespaces" {
        let own = object.or(old_object);
        return label_selector::matches(sel, own.and_then(|o| o.pointer("/metadata/labels")));
    }
    let Some(ns) = req.namespace.filter(|n| !n.is_empty()) else {
        return Ok(true);
    };
    let namespace = store
        .get(&ResKey::core("namespaces"), None, ns)
        .ok_or_else(|| format!("namespace \"{ns}\" not found"))?;
    label_selector::matches(sel, namespace.pointer("/metadata/labels"))
}

/// `objectSelector` against the labels of `object` or `oldObject`. For subresources such as
/// `pods/eviction` the object is the Eviction, not the pod: its labels (usually none) are what counts.
pub fn object_matches(
    webhook: &Value,
    object: Option<&Value>,
    old_object: Option<&Value>,
) -> Result<bool, String> {
    let Some(sel) = webhook
        .get("objectSelector")
        .filter(|s| !label_selector::is_empty(s))
    else {
        return Ok(true);
    };
    for o in [object, old_object].into_iter().flatten() {
        if label_selector::matches(sel, o.pointer("/metadata/labels"))? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eviction() -> RequestShape<'static> {
        RequestShape {
            group: "",
            version: "v1",
            resource: "pods",
            subresource: "eviction",
            operation: Operation::Create,
            namespace: Some("db"),
        }
    }

    #[test]
    fn subresources_need_naming() {
        let rule = |res: &str| json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [res]});
        assert!(rule_matches(&rule("pods/eviction"), &eviction()));
        assert!(rule_matches(&rule("*/eviction"), &eviction()));
        assert!(rule_matches(&rule("pods/*"), &eviction()));
        assert!(!rule_matches(&rule("pods"), &eviction()));
        assert!(!rule_matches(&rule("*"), &eviction()));
    }

    #[test]
    fn operations_groups_and_scope() {
        let r = json!({"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*/*"], "scope": "Cluster"});
        assert!(!rule_matches(&r, &eviction()));
        let r = json!({"apiGroups": ["apps"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["*/*"]});
        assert!(!rule_matches(&r, &eviction()));
    }

    #[test]
    fn object_selector_sees_the_eviction_labels() {
        let hook = json!({"objectSelector": {"matchLabels": {"app": "db"}}});
        let eviction = json!({"metadata": {"name": "db-0"}});
        assert_eq!(object_matches(&hook, Some(&eviction), None), Ok(false));
        let labelled = json!({"metadata": {"labels": {"app": "db"}}});
        assert_eq!(object_matches(&hook, None, Some(&labelled)), Ok(true));
    }
}

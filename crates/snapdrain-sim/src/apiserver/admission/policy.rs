//! ValidatingAdmissionPolicies (`admissionregistration.k8s.io/v1`), evaluated as kube-apiserver's
//! `apiserver/pkg/admission/plugin/policy/validating` does for the parts simulated here:
//! - every ValidatingAdmissionPolicyBinding whose `validationActions` include `Deny` applies its policy
//!   (`policyName`); a binding naming a missing policy does nothing;
//! - the policy's `matchConstraints` (`resourceRules` with `resourceNames`, `excludeResourceRules`,
//!   `namespaceSelector`, `objectSelector`), then every `matchConditions` expression must be true;
//! - `variables` are evaluated in order and visible as `variables.<name>`; then each `validations`
//!   expression, with `object`, `oldObject` (null when absent) and `request` (the AdmissionReview's
//!   request) bound;
//! - the first false validation denies the request with `message` (or `failed expression: <expr>`) and
//!   `reason` (default Invalid, 422), worded as `dispatcher.go` words it; an expression that cannot be
//!   compiled or evaluated denies under `failurePolicy: Fail` (the default) and is skipped under
//!   `Ignore`;
//! - requests on policies and bindings themselves are never checked (`isPolicyResource`); webhook
//!   configurations are (unlike for webhooks);
//! - a policy with `paramKind` is evaluated once per parameter object its binding's `paramRef` selects,
//!   with `params` bound to it, after `matchConstraints` and before `matchConditions` (which may read
//!   `params`); see [`collect_params`].
//!
//! Not simulated: the binding's `matchResources`, `messageExpression`, `auditAnnotations`,
//! `namespaceObject`, `authorizer`, and `Warn`/`Audit` actions.

use std::collections::HashMap;

use serde_json::Value;

use super::super::cel;
use super::super::errors::{ApiError, ApiResult};
use super::super::resources::ResKey;
use super::super::store::Store;
use super::AdmissionAttributes;
use super::matching::{self, RequestShape};

const GROUP: &str = "admissionregistration.k8s.io";

fn policies() -> ResKey {
    ResKey::new(GROUP, "validatingadmissionpolicies")
}

fn bindings() -> ResKey {
    ResKey::new(GROUP, "validatingadmissionpolicybindings")
}

/// `isPolicyResource`: changes to policies and bindings are never held up by a policy.
fn exempt(attrs: &AdmissionAttributes<'_>) -> bool {
    attrs.target.def.group == GROUP
        && matches!(
            attrs.target.def.plural.as_str(),
            "validatingadmissionpolicies" | "validatingadmissionpolicybindings"
        )
}

/// Runs every bound policy that matches the request; the first denial fails it.
pub fn validate(store: &Store, attrs: &AdmissionAttributes<'_>, uid: &str) -> ApiResult<()> {
    if exempt(attrs) {
        return Ok(());
    }
    let (mut bound, _) = store.snapshot(&bindings());
    if bound.is_empty() {
        return Ok(());
    }
    bound.sort_by(|a, b| name(a).cmp(name(b)));
    let t = attrs.target;
    let shape = RequestShape {
        group: &t.def.group,
        version: &t.version,
        resource: &t.def.plural,
        subresource: t.subresource.as_deref().unwrap_or(""),
        operation: attrs.operation,
        namespace: t.namespace.as_deref(),
    };
    let request = super::review::request(attrs, uid)["request"].clone();
    for binding in &bound {
        let denies = binding
            .pointer("/spec/validationActions")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "Deny"));
        let Some(policy_name) = binding.pointer("/spec/policyName").and_then(Value::as_str) else {
            continue;
        };
        if !denies {
            continue;
        }
        let Some(policy) = store.get(&policies(), None, policy_name) else {
            continue;
        };
        let spec = &policy["spec"];
        if !matches(store, &spec["matchConstraints"], &shape, attrs)? {
            continue;
        }
        let denial = match collect_params(
            store,
            &spec["paramKind"],
            &binding["spec"]["paramRef"],
            t.namespace.as_deref(),
        ) {
            Ok(params) => params
                .iter()
                .find_map(|p| evaluate(spec, attrs, &request, p).err()),
            // A configuration error, under the policy's failurePolicy as any other error.
            Err(_) if spec.get("failurePolicy").and_then(Value::as_str) == Some("Ignore") => None,
            Err(e) => Some(Denial {
                text: format!("failed to configure binding: {e}"),
                reason: "Invalid".into(),
            }),
        };
        if let Some(message) = denial {
            let why = format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{}' denied request: {}",
                name(binding),
                message.text
            );
            let (code, reason) = match message.reason.as_str() {
                "Forbidden" => (403, "Forbidden"),
                "Unauthorized" => (401, "Unauthorized"),
                "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
                _ => (422, "Invalid"),
            };
            let resource = if t.def.group.is_empty() {
                t.def.plural.clone()
            } else {
                format!("{}.{}", t.def.plural, t.def.group)
            };
            let mut e = ApiError::new(
                code,
                reason,
                format!("{resource} \"{}\" is forbidden: {why}", attrs.name),
            )
            .with_cause("", "", why);
            e.name = Some(attrs.name.to_string());
            e.group = Some(t.def.group.clone());
            e.kind = Some(t.def.plural.clone());
            return Err(e);
        }
    }
    Ok(())
}

fn name(o: &Value) -> &str {
    o.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `matchConstraints`: a resource rule (and its `resourceNames`) selects the request, no exclude rule
/// does, and the namespace and object selectors hold.
fn matches(
    store: &Store,
    constraints: &Value,
    shape: &RequestShape<'_>,
    attrs: &AdmissionAttributes<'_>,
) -> ApiResult<bool> {
    let rule_selects = |rule: &Value| {
        let names: Vec<&str> = rule
            .get("resourceNames")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        matching::rule_matches(rule, shape) && (names.is_empty() || names.contains(&attrs.name))
    };
    let list = |key: &str| {
        constraints
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    if !list("resourceRules").iter().any(rule_selects)
        || list("excludeResourceRules").iter().any(rule_selects)
    {
        return Ok(false);
    }
    let selected =
        matching::namespace_matches(constraints, store, shape, attrs.object, attrs.old_object)
            .and_then(|ns| {
                Ok(ns && matching::object_matches(constraints, attrs.object, attrs.old_object)?)
            })
            .map_err(|e| ApiError::internal(format!("Internal error occurred: {e}")))?;
    Ok(selected)
}

/// The parameter objects one binding evaluates its policy with, as kube-apiserver's `CollectParams`
/// (`staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/generic/policy_dispatcher.go`) finds
/// them: no `paramKind`, or a binding without `paramRef`, evaluates once with `params` null; a
/// cluster-scoped kind refuses `paramRef.namespace`; a namespaced kind looks in `paramRef.namespace`,
/// else the request's namespace (an error for a cluster-scoped request); `name` gets that one object,
/// `selector` lists every object its labels match (both set, or neither, is an error); when none is
/// found, `parameterNotFoundAction: Deny` is an error ("no params found ...") and `Allow` (or unset)
/// evaluates nothing, so the binding admits. The `Err` texts are upstream's, which the caller wraps
/// in "failed to configure binding: ...".
fn collect_params(
    store: &Store,
    param_kind: &Value,
    param_ref: &Value,
    request_namespace: Option<&str>,
) -> Result<Vec<Value>, String> {
    let (Some(kind), Some(param_ref)) = (
        param_kind.as_object().filter(|k| !k.is_empty()),
        param_ref.as_object(),
    ) else {
        return Ok(vec![Value::Null]);
    };
    let api_version = kind.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind_name = kind.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(def) = store.def_by_kind(api_version, kind_name) else {
        return Err(format!(
            "paramKind kind `{api_version}, Kind={kind_name}` not known"
        ));
    };
    let ref_namespace = param_ref
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty());
    let namespace = if def.namespaced {
        match ref_namespace.or(request_namespace.filter(|n| !n.is_empty())) {
            Some(ns) => Some(ns),
            None => {
                return Err("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".into());
            }
        }
    } else if ref_namespace.is_some() {
        return Err(
            "paramRef.namespace must not be provided for a cluster-scoped `paramKind`".into(),
        );
    } else {
        None
    };
    let name = param_ref
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty());
    let selector = param_ref.get("selector").filter(|s| !s.is_null());
    let found: Vec<Value> = match (name, selector) {
        (Some(_), Some(_)) => {
            return Err("paramRef.name and paramRef.selector are mutually exclusive".into());
        }
        (Some(name), None) => store
            .get(&def.key(), namespace, name)
            .map(|o| vec![(*o).clone()])
            .unwrap_or_default(),
        (None, Some(selector)) => {
            let selector = super::super::selectors::LabelSelector::from_metav1(Some(selector))
                .map_err(|e| e.to_string())?;
            store
                .list(
                    &def.key(),
                    namespace,
                    &|o| selector.matches(o.pointer("/metadata/labels")),
                    None,
                    None,
                )
                .items
                .iter()
                .map(|o| (**o).clone())
                .collect()
        }
        (None, None) => return Err("one of name or selector must be provided".into()),
    };
    if found.is_empty()
        && param_ref
            .get("parameterNotFoundAction")
            .and_then(Value::as_str)
            == Some("Deny")
    {
        return Err(
            "no params found for policy binding with `Deny` parameterNotFoundAction".into(),
        );
    }
    Ok(found)
}

/// Why a policy denied: the validation's message and reason.
struct Denial {
    text: String,
    reason: String,
}

/// `Ok(())` when every match condition and validation holds (or a match condition is false).
fn evaluate(
    spec: &Value,
    attrs: &AdmissionAttributes<'_>,
    request: &Value,
    params: &Value,
) -> Result<(), Denial> {
    let ignore_errors = spec.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
    let error = |text: String| {
        if ignore_errors {
            Ok(())
        } else {
            Err(Denial {
                text,
                reason: "Invalid".into(),
            })
        }
    };
    let mut ctx = cel::context();
    let bind = |ctx: &mut ::cel::Context<'_, '_>, name: &str, v: &Value| {
        ::cel::to_value(v)
            .map_err(|e| e.to_string())
            .and_then(|v| ctx.add_variable(name, v).map_err(|e| e.to_string()))
    };
    let inputs = [
        ("object", attrs.object.cloned().unwrap_or(Value::Null)),
        (
            "oldObject",
            attrs.old_object.cloned().unwrap_or(Value::Null),
        ),
        ("request", request.clone()),
        ("params", params.clone()),
    ];
    for (name, value) in &inputs {
        if let Err(e) = bind(&mut ctx, name, value) {
            return error(format!("cannot bind {name}: {e}"));
        }
    }
    let run = |ctx: &::cel::Context<'_, '_>, expr: &str| -> Result<::cel::Value, String> {
        cel::compile(expr)
            .map_err(|e| format!("compilation failed: {e}"))?
            .execute(ctx)
            .map_err(|e| format!("expression '{expr}' resulted in error: {e}"))
    };
    let mut variables: HashMap<String, ::cel::Value> = HashMap::new();
    for v in spec
        .get("variables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(name), Some(expr)) = (
            v.get("name").and_then(Value::as_str),
            v.get("expression").and_then(Value::as_str),
        ) else {
            continue;
        };
        match run(&ctx, expr) {
            Ok(value) => {
                variables.insert(name.to_string(), value);
            }
            Err(e) => return error(e),
        }
        if let Err(e) = ctx.add_variable("variables", ::cel::Value::from(variables.clone())) {
            return error(e.to_string());
        }
    }
    if variables.is_empty() {
        let empty: HashMap<String, ::cel::Value> = HashMap::new();
        if let Err(e) = ctx.add_variable("variables", ::cel::Value::from(empty)) {
            return error(e.to_string());
        }
    }
    for condition in spec
        .get("matchConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let expr = condition
            .get("expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        match run(&ctx, expr) {
            Ok(::cel::Value::Bool(true)) => {}
            Ok(::cel::Value::Bool(false)) => return Ok(()),
            Ok(other) => {
                return error(format!(
                    "matchCondition '{expr}' gave {other:?}, not a bool"
                ));
            }
            Err(e) => return error(e),
        }
    }
    for validation in spec
        .get("validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let expr = validation
            .get("expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        match run(&ctx, expr) {
            Ok(::cel::Value::Bool(true)) => {}
            Ok(::cel::Value::Bool(false)) => {
                let text = validation
                    .get("message")
                    .and_then(Value::as_str)
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("failed expression: {expr}"));
                let reason = validation
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("Invalid")
                    .to_string();
                return Err(Denial { text, reason });
            }
            Ok(other) => return error(format!("validation '{expr}' gave {other:?}, not a bool")),
            Err(e) => return error(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::super::auth::UserInfo;
    use super::super::super::request::Target;
    use super::super::super::resources::Registry;
    use super::super::{AdmissionAttributes, Operation};
    use super::*;
    use crate::apiserver::store::WriteOptions;
    use serde_json::json;

    /// A policy pair for tests: `expression` must hold for `resource` updates by `user`.
    fn fixture(resource: &str, user: &str, expression: &str) -> (Value, Value) {
        (
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                   "metadata": {"name": "p"},
                   "spec": {"failurePolicy": "Fail",
                            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                "operations": ["UPDATE"], "resources": [resource]}]},
                            "matchConditions": [{"name": "user",
                                "expression": format!("request.userInfo.username == '{user}'")}],
                            "variables": [{"name": "labels",
                                "expression": "has(object.metadata.labels) ? object.metadata.labels : {}"}],
                            "validations": [{"expression": expression, "message": "no", "reason": "Forbidden"}]}}),
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                   "metadata": {"name": "b"},
                   "spec": {"policyName": "p", "validationActions": ["Deny"]}}),
        )
    }

    fn store_with(objects: &[Value]) -> Store {
        let store = Store::new();
        for o in objects {
            let key = match o["kind"].as_str() {
                Some("ValidatingAdmissionPolicy") => policies(),
                Some("ValidatingAdmissionPolicyBinding") => bindings(),
                Some("ConfigMap") => ResKey::core("configmaps"),
                _ => ResKey::core("namespaces"),
            };
            let ns = o.pointer("/metadata/namespace").and_then(Value::as_str);
            store
                .create(&key, ns, o.clone(), WriteOptions::default())
                .expect("store the object");
        }
        store
    }

    fn update_pod(store: &Store, user: &str, old: &Value, new: &Value) -> ApiResult<()> {
        let def = Registry::with_builtins()
            .get(&ResKey::core("pods"))
            .expect("pods are built in")
            .clone();
        let target = Target {
            def,
            version: "v1".into(),
            namespace: Some("db".into()),
            name: Some("pg-0".into()),
            subresource: None,
        };
        let user = UserInfo {
            name: user.into(),
            groups: vec![],
        };
        validate(
            store,
            &AdmissionAttributes {
                operation: Operation::Update,
                target: &target,
                name: "pg-0",
                object: Some(new),
                old_object: Some(old),
                dry_run: false,
                user_agent: None,
                user: &user,
            },
            "uid",
        )
    }

    #[test]
    fn a_false_validation_denies_the_bound_user_only() {
        let (p, b) = fixture(
            "pods",
            "sa",
            "variables.labels == oldObject.metadata.labels",
        );
        let store = store_with(&[p, b]);
        let old = json!({"metadata": {"name": "pg-0", "labels": {"a": "1"}}});
        let new = json!({"metadata": {"name": "pg-0", "labels": {"a": "2"}}});
        let e = update_pod(&store, "sa", &old, &new).expect_err("denied");
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "pods \"pg-0\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"
        );
        assert!(update_pod(&store, "someone-else", &old, &new).is_ok());
        assert!(update_pod(&store, "sa", &old, &old).is_ok());
    }

    /// A policy whose `params` is a ConfigMap: `object`'s label `tier` must be one its data allows.
    fn with_params(param_ref: Value) -> (Value, Value) {
        let (mut p, mut b) = fixture(
            "pods",
            "sa",
            "has(object.metadata.labels) && object.metadata.labels.tier in params.data.tiers.split(',')",
        );
        p["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        b["spec"]["paramRef"] = param_ref;
        (p, b)
    }

    fn cfg_namespace() -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cfg"}})
    }

    fn tiers(name: &str, allowed: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "cfg", "labels": labels},
               "data": {"tiers": allowed}})
    }

    /// `CollectParams` (kube-apiserver `plugin/policy/generic/policy_dispatcher.go`): the named object is
    /// `params`; when it is missing, `Deny` refuses as a configuration error and `Allow` admits.
    #[test]
    fn a_named_param_is_bound_and_a_missing_one_follows_the_not_found_action() {
        let old = json!({"metadata": {"name": "pg-0", "labels": {"tier": "gold"}}});
        let bronze = json!({"metadata": {"name": "pg-0", "labels": {"tier": "bronze"}}});
        let (p, b) = with_params(
            json!({"name": "limits", "namespace": "cfg", "parameterNotFoundAction": "Deny"}),
        );
        let store = store_with(&[
            cfg_namespace(),
            p.clone(),
            b,
            tiers("limits", "gold,silver", json!({})),
        ]);
        assert!(update_pod(&store, "sa", &old, &old).is_ok());
        let e = update_pod(&store, "sa", &old, &bronze).expect_err("not an allowed tier");
        assert!(e.message.ends_with("denied request: no"), "{}", e.message);

        let (_, b) = with_params(
            json!({"name": "absent", "namespace": "cfg", "parameterNotFoundAction": "Deny"}),
        );
        let store = store_with(&[p.clone(), b]);
        let e = update_pod(&store, "sa", &old, &old).expect_err("Deny without params");
        assert!(
            e.message.ends_with("denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"),
            "{}",
            e.message
        );
        let (_, b) = with_params(
            json!({"name": "absent", "namespace": "cfg", "parameterNotFoundAction": "Allow"}),
        );
        let store = store_with(&[p, b]);
        assert!(
            update_pod(&store, "sa", &old, &bronze).is_ok(),
            "Allow: no params, nothing evaluated"
        );
    }

    /// A selector evaluates the policy once per object it selects: any one refusing refuses; the
    /// request's namespace is searched when `paramRef.namespace` is unset.
    #[test]
    fn a_selector_evaluates_every_param_it_selects() {
        let (p, b) = with_params(json!({"selector": {"matchLabels": {"use": "tiers"}},
                                        "namespace": "cfg", "parameterNotFoundAction": "Deny"}));
        let gold = json!({"metadata": {"name": "pg-0", "labels": {"tier": "gold"}}});
        let store = store_with(&[
            cfg_namespace(),
            p.clone(),
            b.clone(),
            tiers("a", "gold", json!({"use": "tiers"})),
            tiers("ignored", "none", json!({})),
        ]);
        assert!(update_pod(&store, "sa", &gold, &gold).is_ok());
        let store = store_with(&[
            cfg_namespace(),
            p,
            b,
            tiers("a", "gold", json!({"use": "tiers"})),
            tiers("b", "silver", json!({"use": "tiers"})),
        ]);
        let e = update_pod(&store, "sa", &gold, &gold).expect_err("b does not allow gold");
        assert!(e.message.ends_with("denied request: no"), "{}", e.message);
    }

    /// A cluster-scoped `paramKind` takes no `paramRef.namespace` (a configuration error).
    #[test]
    fn a_namespace_for_a_cluster_scoped_param_kind_is_a_configuration_error() {
        let (mut p, mut b) = fixture("pods", "sa", "true");
        p["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "Namespace"});
        b["spec"]["paramRef"] =
            json!({"name": "cfg", "namespace": "cfg", "parameterNotFoundAction": "Deny"});
        let old = json!({"metadata": {"name": "pg-0"}});
        let store = store_with(&[p, b]);
        let e = update_pod(&store, "sa", &old, &old).expect_err("misconfigured");
        assert!(
            e.message.ends_with("failed to configure binding: paramRef.namespace must not be provided for a cluster-scoped `paramKind`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn errors_deny_under_fail_and_unbound_policies_do_nothing() {
        let (p, b) = fixture("pods", "sa", "object.spec.nothing == 1");
        let old = json!({"metadata": {"name": "pg-0"}, "spec": {}});
        let store = store_with(std::slice::from_ref(&p));
        assert!(update_pod(&store, "sa", &old, &old).is_ok(), "no binding");
        let store = store_with(&[p, b]);
        let e = update_pod(&store, "sa", &old, &old).expect_err("an error fails closed");
        assert_eq!(e.code, 422, "{e:?}");
    }
}

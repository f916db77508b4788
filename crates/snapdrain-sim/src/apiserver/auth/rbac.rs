//! RBAC authorization as kube-apiserver's RBAC authorizer decides it
//! (kubernetes `plugin/pkg/auth/authorizer/rbac/rbac.go` and `rbac/v1/evaluation_helpers.go`):
//! allowed when any rule of a role bound to the user (ClusterRoleBindings everywhere, RoleBindings in
//! the request's namespace) matches. Rules only allow; there is no deny. Pure over the objects given.

use serde_json::Value;

use super::UserInfo;

/// What a request asks to do, as the authorizer's Attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        resource: String,
        subresource: Option<String>,
        namespace: Option<String>,
        name: Option<String>,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

impl Attributes {
    /// The 403 message of kube-apiserver (`responsewriters/errors.go` `forbiddenMessage`, wrapped by
    /// `errors.NewForbidden`: `<resource>[.<group>] ["<name>" ]is forbidden: ...`).
    pub fn forbidden_message(&self, user: &str) -> String {
        match self {
            Attributes::NonResource { verb, path } => {
                format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\"")
            }
            Attributes::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => {
                let full = match subresource {
                    Some(s) => format!("{resource}/{s}"),
                    None => resource.clone(),
                };
                let reason = match namespace {
                    Some(ns) => format!(
                        "User \"{user}\" cannot {verb} resource \"{full}\" in API group \"{group}\" in the namespace \"{ns}\""
                    ),
                    None => format!(
                        "User \"{user}\" cannot {verb} resource \"{full}\" in API group \"{group}\" at the cluster scope"
                    ),
                };
                let qualified = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                match name {
                    Some(n) => format!("{qualified} \"{n}\" is forbidden: {reason}"),
                    None => format!("{qualified} is forbidden: {reason}"),
                }
            }
        }
    }
}

/// The role objects RBAC reads.
pub struct Policy<'a> {
    pub cluster_roles: &'a [Value],
    pub cluster_role_bindings: &'a [Value],
    pub roles: &'a [Value],
    pub role_bindings: &'a [Value],
}

/// True when a rule of a role bound to `user` allows `attrs`.
pub fn allows(policy: &Policy, user: &UserInfo, attrs: &Attributes) -> bool {
    let cluster_role = |name: &str| {
        policy
            .cluster_roles
            .iter()
            .find(|r| meta(r, "name") == Some(name))
    };
    for b in policy.cluster_role_bindings {
        if binds(b, user, None)
            && role_ref_kind(b) == Some("ClusterRole")
            && let Some(role) = role_ref_name(b).and_then(cluster_role)
            && role_allows(role, attrs)
        {
            return true;
        }
    }
    let Attributes::Resource {
        namespace: Some(ns),
        ..
    } = attrs
    else {
        return false;
    };
    for b in policy
        .role_bindings
        .iter()
        .filter(|b| meta(b, "namespace") == Some(ns))
    {
        if !binds(b, user, Some(ns)) {
            continue;
        }
        let role = match (role_ref_kind(b), role_ref_name(b)) {
            (Some("ClusterRole"), Some(n)) => cluster_role(n),
            (Some("Role"), Some(n)) => policy
                .roles
                .iter()
                .find(|r| meta(r, "namespace") == Some(ns) && meta(r, "name") == Some(n)),
            _ => None,
        };
        if role.is_some_and(|r| role_allows(r, attrs)) {
            return true;
        }
    }
    false
}

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn role_ref_kind(binding: &Value) -> Option<&str> {
    binding.pointer("/roleRef/kind")?.as_str()
}

fn role_ref_name(binding: &Value) -> Option<&str> {
    binding.pointer("/roleRef/name")?.as_str()
}

/// `appliesTo` in rbac.go: a User subject by name, a Group by membership, a ServiceAccount by
/// `system:serviceaccount:<ns>:<name>` (its namespace defaulting to the binding's).
fn binds(binding: &Value, user: &UserInfo, binding_ns: Option<&str>) -> bool {
    let Some(subjects) = binding.get("subjects").and_then(Value::as_array) else {
        return false;
    };
    subjects.iter().any(|s| {
        let kind = s.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = s.get("name").and_then(Value::as_str).unwrap_or("");
        match kind {
            "User" => user.name == name,
            "Group" => user.groups.iter().any(|g| g == name),
            "ServiceAccount" => {
                let ns = s
                    .get("namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .or(binding_ns)
                    .unwrap_or("");
                user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        }
    })
}

fn role_allows(role: &Value, attrs: &Attributes) -> bool {
    role.get("rules")
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, attrs)))
}

fn strings(rule: &Value, field: &str) -> Vec<String> {
    rule.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|v| v == "*" || v == want)
}

/// `RuleAllows` in evaluation_helpers.go.
pub fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    match attrs {
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            let combined = match subresource {
                Some(s) => format!("{resource}/{s}"),
                None => resource.clone(),
            };
            let resources = strings(rule, "resources");
            // `ResourceMatches`: "*" matches everything, "*/sub" any resource's subresource.
            let resource_ok = resources.iter().any(|r| {
                r == "*"
                    || *r == combined
                    || subresource.as_ref().is_some_and(|s| *r == format!("*/{s}"))
            });
            let names = strings(rule, "resourceNames");
            let name_ok =
                names.is_empty() || name.as_ref().is_some_and(|n| names.iter().any(|x| x == n));
            has(&strings(rule, "verbs"), verb)
                && has(&strings(rule, "apiGroups"), group)
                && resource_ok
                && name_ok
        }
        Attributes::NonResource { verb, path } => {
            let urls = strings(rule, "nonResourceURLs");
            // A trailing "*" is a prefix match (`NonResourceURLMatches`).
            has(&strings(rule, "verbs"), verb)
                && urls.iter().any(|u| {
                    u == "*"
                        || u == path
                        || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sa(ns: &str, name: &str) -> UserInfo {
        UserInfo::service_account(ns, name)
    }

    fn res(verb: &str, group: &str, resource: &str, ns: Option<&str>) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: None,
            namespace: ns.map(str::to_string),
            name: None,
        }
    }

    #[test]
    fn cluster_bindings_apply_everywhere_role_bindings_in_their_namespace() {
        let cluster_roles = [json!({"metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})];
        let roles = [
            json!({"metadata": {"name": "leases", "namespace": "snapdrain"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]}),
        ];
        let crb = [
            json!({"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "read-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": "snapdrain"}]}),
        ];
        let rb = [
            json!({"metadata": {"name": "b", "namespace": "snapdrain"}, "roleRef": {"kind": "Role", "name": "leases"},
            "subjects": [{"kind": "ServiceAccount", "name": "ctl"}]}),
        ];
        let p = Policy {
            cluster_roles: &cluster_roles,
            cluster_role_bindings: &crb,
            roles: &roles,
            role_bindings: &rb,
        };
        let me = sa("snapdrain", "ctl");
        assert!(allows(&p, &me, &res("list", "", "pods", Some("shop"))));
        assert!(allows(&p, &me, &res("list", "", "pods", None)));
        assert!(!allows(&p, &me, &res("delete", "", "pods", Some("shop"))));
        assert!(allows(
            &p,
            &me,
            &res("update", "coordination.k8s.io", "leases", Some("snapdrain"))
        ));
        assert!(!allows(
            &p,
            &me,
            &res("update", "coordination.k8s.io", "leases", Some("default"))
        ));
        assert!(!allows(
            &p,
            &sa("other", "ctl"),
            &res("list", "", "pods", None)
        ));
    }

    #[test]
    fn subresources_names_and_non_resource_urls_match_as_rbac_does() {
        let evict = json!({"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]});
        let mut a = res("create", "", "pods", Some("shop"));
        assert!(!rule_allows(&evict, &a), "pods is not pods/eviction");
        if let Attributes::Resource { subresource, .. } = &mut a {
            *subresource = Some("eviction".into());
        }
        assert!(rule_allows(&evict, &a));
        assert!(rule_allows(
            &json!({"apiGroups": ["*"], "resources": ["*/eviction"], "verbs": ["*"]}),
            &a
        ));
        let named = json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cloud"], "verbs": ["get"]});
        let mut get = res("get", "", "secrets", Some("velero"));
        assert!(!rule_allows(&named, &get), "a list is not a named get");
        if let Attributes::Resource { name, .. } = &mut get {
            *name = Some("cloud".into());
        }
        assert!(rule_allows(&named, &get));
        let urls = json!({"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]});
        let path = |p: &str| Attributes::NonResource {
            verb: "get".into(),
            path: p.into(),
        };
        assert!(rule_allows(&urls, &path("/healthz")));
        assert!(rule_allows(&urls, &path("/apis/apps/v1")));
        assert!(!rule_allows(&urls, &path("/metrics")));
    }

    #[test]
    fn forbidden_messages_are_the_api_servers() {
        let mut a = res("create", "", "pods", Some("shop"));
        if let Attributes::Resource {
            subresource, name, ..
        } = &mut a
        {
            *subresource = Some("eviction".into());
            *name = Some("web-1".into());
        }
        assert_eq!(
            a.forbidden_message("system:serviceaccount:snapdrain:snapdrain"),
            "pods \"web-1\" is forbidden: User \"system:serviceaccount:snapdrain:snapdrain\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"shop\""
        );
        assert_eq!(
            res("list", "velero.io", "backups", None).forbidden_message("u"),
            "backups.velero.io is forbidden: User \"u\" cannot list resource \"backups\" in API group \"velero.io\" at the cluster scope"
        );
    }
}

//! rbac.authorization.k8s.io/v1 Role, ClusterRole, RoleBinding, ClusterRoleBinding
//! (`k8s.io/api/rbac/v1/generated.proto`), as `kubectl create role|clusterrole|rolebinding|
//! clusterrolebinding` fill them (`kubectl/pkg/cmd/create/create_role.go`, `create_rolebinding.go`).

use k8s_pb::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::meta;

pub fn role(r: Role) -> Result<Value> {
    let Role { metadata, rules } = r;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.list("rules", rules, policy_rule)?;
    o.done()
}

pub fn cluster_role(r: ClusterRole) -> Result<Value> {
    let ClusterRole {
        metadata,
        rules,
        aggregation_rule,
    } = r;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.list("rules", rules, policy_rule)?;
    o.unmapped("aggregationRule", &aggregation_rule)?;
    o.done()
}

fn policy_rule(path: &str, r: PolicyRule) -> Result<Value> {
    let PolicyRule {
        verbs,
        api_groups,
        resources,
        resource_names,
        non_resource_ur_ls,
    } = r;
    let mut o = Obj::new(path);
    o.strings("verbs", verbs);
    o.strings("apiGroups", api_groups);
    o.strings("resources", resources);
    o.strings("resourceNames", resource_names);
    o.strings("nonResourceURLs", non_resource_ur_ls);
    o.done()
}

pub fn role_binding(b: RoleBinding) -> Result<Value> {
    let RoleBinding {
        metadata,
        subjects,
        role_ref,
    } = b;
    binding(metadata, subjects, role_ref)
}

pub fn cluster_role_binding(b: ClusterRoleBinding) -> Result<Value> {
    let ClusterRoleBinding {
        metadata,
        subjects,
        role_ref,
    } = b;
    binding(metadata, subjects, role_ref)
}

fn binding(
    metadata: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    subjects: Vec<Subject>,
    role_ref: Option<RoleRef>,
) -> Result<Value> {
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.list("subjects", subjects, |path, s| {
        let Subject {
            kind,
            api_group,
            name,
            namespace,
        } = s;
        let mut o = Obj::new(path);
        o.string("kind", kind);
        o.string("apiGroup", api_group);
        o.string("name", name);
        o.string("namespace", namespace);
        o.done()
    })?;
    o.embedded("roleRef", role_ref, |path, r| {
        let RoleRef {
            api_group,
            kind,
            name,
        } = r;
        let mut o = Obj::new(path);
        o.string("apiGroup", api_group);
        o.string("kind", kind);
        o.string("name", name);
        o.done()
    })?;
    o.done()
}

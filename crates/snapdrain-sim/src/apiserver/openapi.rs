//! OpenAPI v3 documents: the `/openapi/v3` index and one document per group-version.
//!
//! kubectl 1.32 reads them before `apply`, `create` and `replace`: when the PATCH operation of a kind lists
//! the `fieldValidation` query parameter, kubectl skips its own schema validation (which needs the
//! protobuf v2 document) and sends `fieldValidation=Strict` instead. `kubectl explain` reads the schemas
//! in `components`: CRD kinds get their `openAPIV3Schema`, built-ins the k8s-openapi schemas.
//!
//! Built-in PATCH operations do not list the strategic merge content type (the server accepts it all the
//! same): `kubectl apply` would otherwise compute strategic patches from these schemas, which lack the
//! `x-kubernetes-patch-merge-key` hints, instead of from its compiled-in types.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::resources::{Registry, ResKey, ResourceDef};
use super::schema::schema_of;
use super::store::Store;

mod builtin;

/// `api/v1` or `apis/{group}/{version}`: how the index names a group-version.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn group_versions(registry: &Registry) -> Vec<(String, String)> {
    let mut gvs: Vec<(String, String)> = registry
        .all()
        .flat_map(|d| d.versions.iter().map(|v| (d.group.clone(), v.clone())))
        .collect();
    gvs.sort();
    gvs.dedup();
    gvs
}

/// `GET /openapi/v3`. The hash changes with the document, so clients caching by URL see new CRDs. It is
/// taken over what the document is made from (the served definitions and their CRDs' versions), which is
/// much cheaper than rendering every document.
pub fn index(store: &Store) -> Value {
    let registry = store.registry();
    let mut paths = Map::new();
    for (group, version) in group_versions(&registry) {
        let mut hasher = Sha256::new();
        for def in registry
            .all()
            .filter(|d| d.group == group && d.serves(&version))
        {
            hasher.update(format!("{def:?}"));
            if def.custom {
                let crd = store.get(&crd_key(), None, &format!("{}.{}", def.plural, def.group));
                let rv = crd
                    .as_deref()
                    .and_then(|c| super::meta::meta_str(c, "resourceVersion"));
                hasher.update(rv.unwrap_or(""));
            }
        }
        let hash = hex(&hasher.finalize());
        let path = gv_path(&group, &version);
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

fn crd_key() -> ResKey {
    ResKey::new("apiextensions.k8s.io", "customresourcedefinitions")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// `GET /openapi/v3/{api/v1 | apis/group/version}`; None when nothing is served there.
pub fn group_version_document(store: &Store, segments: &[&str]) -> Option<Value> {
    let (group, version) = match segments {
        ["api", version] => ("", *version),
        ["apis", group, version] => (*group, *version),
        _ => return None,
    };
    let registry = store.registry();
    if !registry
        .all()
        .any(|d| d.group == group && d.serves(version))
    {
        return None;
    }
    Some(document(store, &registry, group, version))
}

fn document(store: &Store, registry: &Registry, group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for def in registry
        .all()
        .filter(|d| d.group == group && d.serves(version))
    {
        resource_paths(def, version, &mut paths);
        if def.custom {
            if let Some(schema) = crd_schema(store, def, version) {
                schemas.insert(schema_name(def, version), schema);
            }
        } else if let Some(builtin) = builtin::schemas(&def.group, &def.kind) {
            schemas.extend(builtin.clone());
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0-snapdrain-sim"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// `io.velero.v1.Backup`, the way the real server names CRD schemas (group labels reversed).
fn schema_name(def: &ResourceDef, version: &str) -> String {
    let mut labels: Vec<&str> = def.group.split('.').collect();
    labels.reverse();
    format!("{}.{version}.{}", labels.join("."), def.kind)
}

/// The CRD's `openAPIV3Schema` for `version`, tagged with the kind it describes.
fn crd_schema(store: &Store, def: &ResourceDef, version: &str) -> Option<Value> {
    let crd = store.get(&crd_key(), None, &format!("{}.{}", def.plural, def.group))?;
    let mut schema = schema_of(&crd, version)?.clone();
    schema["x-kubernetes-group-version-kind"] =
        json!([{"group": def.group, "version": version, "kind": def.kind}]);
    Some(schema)
}

fn query_param(name: &str, type_: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": type_, "uniqueItems": true}})
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

fn operation(def: &ResourceDef, action: &str, gvk: &Value, params: &[Value]) -> Value {
    let id = format!("{action}{}", def.kind);
    json!({
        "operationId": id,
        "parameters": params,
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    })
}

/// Paths for one resource: what the real server lists, down to the query parameters kubectl looks for.
fn resource_paths(def: &ResourceDef, version: &str, paths: &mut Map<String, Value>) {
    let gvk = json!({"group": def.group, "version": version, "kind": def.kind});
    let base = format!("/{}", gv_path(&def.group, version));
    let collection = if def.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", def.plural)
    } else {
        format!("{base}/{}", def.plural)
    };
    let item = format!("{collection}/{{name}}");
    let write = [
        query_param("dryRun", "string"),
        query_param("fieldManager", "string"),
        query_param("fieldValidation", "string"),
    ];
    let mut patch_params = write.to_vec();
    patch_params.push(query_param("force", "boolean"));
    let patch_types = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    let body_content: Map<String, Value> = patch_types
        .iter()
        .map(|t| (t.to_string(), json!({"schema": {"type": "object"}})))
        .collect();
    let mut patch = operation(def, "patch", &gvk, &patch_params);
    patch["requestBody"] = json!({"required": true, "content": body_content});
    let json_body =
        json!({"required": true, "content": {"application/json": {"schema": {"type": "object"}}}});
    let mut create = operation(def, "post", &gvk, &write);
    create["requestBody"] = json_body.clone();
    let mut replace = operation(def, "put", &gvk, &write);
    replace["requestBody"] = json_body;
    let list_params = [
        query_param("labelSelector", "string"),
        query_param("fieldSelector", "string"),
        query_param("limit", "integer"),
        query_param("continue", "string"),
        query_param("resourceVersion", "string"),
        query_param("watch", "boolean"),
    ];
    let scope_params: Vec<Value> = if def.namespaced {
        vec![path_param("namespace")]
    } else {
        vec![]
    };
    let mut item_params = vec![path_param("name")];
    item_params.extend(scope_params.iter().cloned());
    paths.insert(
        collection.clone(),
        json!({
            "get": operation(def, "list", &gvk, &list_params),
            "post": create,
            "delete": operation(def, "deletecollection", &gvk, &[]),
            "parameters": scope_params,
        }),
    );
    paths.insert(
        item.clone(),
        json!({
            "get": operation(def, "get", &gvk, &[]),
            "put": replace.clone(),
            "patch": patch.clone(),
            "delete": operation(def, "delete", &gvk, &[]),
            "parameters": item_params,
        }),
    );
    if def.namespaced {
        paths.insert(
            format!("{base}/{}", def.plural),
            json!({"get": operation(def, "list", &gvk, &list_params)}),
        );
    }
    if def.status_subresource {
        paths.insert(
            format!("{item}/status"),
            json!({"get": operation(def, "get", &gvk, &[]), "put": replace, "patch": patch,
                "parameters": item_params}),
        );
    }
}

/// A built-in kind's schema and the definitions it refers to, for strict field validation.
pub fn builtin_root(
    group: &str,
    kind: &str,
) -> Option<(&'static Map<String, Value>, &'static Value)> {
    let schemas = builtin::schemas(group, kind)?;
    let root = schemas.values().find(|s| {
        s.pointer("/x-kubernetes-group-version-kind/0/kind")
            .and_then(Value::as_str)
            == Some(kind)
    })?;
    Some((schemas, root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lists_core_and_groups_with_hashes() {
        let store = Store::new();
        let idx = index(&store);
        let url = idx["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="));
        assert!(idx["paths"]["apis/apps/v1"].is_object());
    }

    #[test]
    fn patch_operations_advertise_field_validation() {
        let store = Store::new();
        let doc = group_version_document(&store, &["apis", "apps", "v1"]).unwrap();
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "StatefulSet"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        let types = patch["requestBody"]["content"].as_object().unwrap();
        assert!(!types.contains_key("application/strategic-merge-patch+json"));
        assert!(
            doc["components"]["schemas"]["io.k8s.api.apps.v1.StatefulSet"]["x-kubernetes-group-version-kind"]
                [0]["kind"]
                == "StatefulSet"
        );
        assert!(group_version_document(&store, &["apis", "apps", "v9"]).is_none());
    }
}

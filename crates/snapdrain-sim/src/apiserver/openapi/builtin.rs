//! Schemas of the built-in kinds for `/openapi/v3` documents, from k8s-openapi's schemars support,
//! generated once: `{name: schema}` for the kind (tagged with its group-version-kind) and every
//! definition it refers to, with references in OpenAPI v3 form (`#/components/schemas/...`).

use std::collections::HashMap;
use std::sync::OnceLock;

use k8s_openapi::api::{
    admissionregistration, apps, batch, coordination, core, events, networking, policy, rbac,
    storage,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

type Schemas = Map<String, Value>;

fn generate<T: JsonSchema + k8s_openapi::Resource>() -> Schemas {
    let root = SchemaSettings::openapi3()
        .into_generator()
        .into_root_schema_for::<T>();
    let mut root = root.to_value();
    let mut out = match root.pointer_mut("/components/schemas").map(Value::take) {
        Some(Value::Object(defs)) => defs,
        _ => Map::new(),
    };
    if let Some(obj) = root.as_object_mut() {
        obj.remove("components");
        obj.remove("$schema");
    }
    root["x-kubernetes-group-version-kind"] =
        json!([{"group": T::GROUP, "version": T::VERSION, "kind": T::KIND}]);
    out.insert(T::schema_name().into_owned(), root);
    out
}

/// Keyed by `group/kind`.
fn all() -> &'static HashMap<String, Schemas> {
    static ALL: OnceLock<HashMap<String, Schemas>> = OnceLock::new();
    ALL.get_or_init(|| {
        macro_rules! kinds {
            ($($ty:ty),* $(,)?) => {
                HashMap::from([$(
                    (
                        format!("{}/{}", <$ty as k8s_openapi::Resource>::GROUP, <$ty as k8s_openapi::Resource>::KIND),
                        generate::<$ty>(),
                    ),
                )*])
            };
        }
        kinds![
            core::v1::Namespace,
            core::v1::Node,
            core::v1::Pod,
            core::v1::PersistentVolumeClaim,
            core::v1::PersistentVolume,
            core::v1::Secret,
            core::v1::ConfigMap,
            core::v1::Service,
            core::v1::ServiceAccount,
            core::v1::Event,
            apps::v1::StatefulSet,
            apps::v1::Deployment,
            apps::v1::ReplicaSet,
            apps::v1::DaemonSet,
            batch::v1::Job,
            policy::v1::PodDisruptionBudget,
            networking::v1::NetworkPolicy,
            coordination::v1::Lease,
            events::v1::Event,
            storage::v1::VolumeAttachment,
            storage::v1::StorageClass,
            admissionregistration::v1::ValidatingWebhookConfiguration,
            apiextensions::v1::CustomResourceDefinition,
            rbac::v1::ClusterRole,
            rbac::v1::ClusterRoleBinding,
            rbac::v1::Role,
            rbac::v1::RoleBinding,
        ]
    })
}

/// The schemas for a built-in kind, or None for kinds k8s-openapi does not know.
pub fn schemas(group: &str, kind: &str) -> Option<&'static Schemas> {
    all().get(&format!("{group}/{kind}"))
}

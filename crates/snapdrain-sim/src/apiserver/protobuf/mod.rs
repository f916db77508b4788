//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's typed clients
//! send for built-in kinds (`kubectl create namespace|configmap|secret|deployment|job|token`,
//! `kubectl auth can-i`). Each is decoded with k8s-pb's definitions and converted to the JSON the
//! same object would have been sent as, so validation, defaults, RBAC and strict checks apply to it
//! unchanged. A field no converter maps is refused by name rather than dropped.

mod apps;
mod auth;
mod batch;
mod core;
mod envelope;
mod error;
mod fields;
pub mod kinds;
mod meta;
mod policy;
mod rbac;

use prost::Message;
use serde_json::{Map, Value};

pub use error::ProtobufError;
pub use kinds::ACCEPTED_KINDS;

/// The JSON object a protobuf request body holds, `apiVersion` and `kind` first.
pub fn to_json(body: &[u8]) -> Result<Value, ProtobufError> {
    let env = envelope::open(body)?;
    let raw = env.raw.as_slice();
    let object = match (env.api_version.as_str(), env.kind.as_str()) {
        ("v1", "Namespace") => core::namespace(decode(&env, raw)?),
        ("v1", "ConfigMap") => core::config_map(decode(&env, raw)?),
        ("v1", "Secret") => core::secret(decode(&env, raw)?),
        ("v1", "ServiceAccount") => core::service_account(decode(&env, raw)?),
        ("v1", "Service") => core::service(decode(&env, raw)?),
        ("apps/v1", "Deployment") => apps::deployment(decode(&env, raw)?),
        ("batch/v1", "Job") => batch::job(decode(&env, raw)?),
        ("batch/v1", "CronJob") => batch::cron_job(decode(&env, raw)?),
        ("policy/v1", "PodDisruptionBudget") => policy::pod_disruption_budget(decode(&env, raw)?),
        ("authentication.k8s.io/v1", "TokenRequest") => auth::token_request(decode(&env, raw)?),
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            auth::self_subject_access_review(decode(&env, raw)?)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => rbac::role(decode(&env, raw)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => rbac::cluster_role(decode(&env, raw)?),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => rbac::role_binding(decode(&env, raw)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            rbac::cluster_role_binding(decode(&env, raw)?)
        }
        _ => {
            return Err(ProtobufError::UnsupportedKind {
                api_version: env.api_version,
                kind: env.kind,
            });
        }
    }
    .map_err(|e| e.in_kind(&env.kind))?;
    let mut out = Map::new();
    out.insert("apiVersion".into(), env.api_version.into());
    out.insert("kind".into(), env.kind.into());
    if let Value::Object(fields) = object {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

fn decode<M: Message + Default>(env: &envelope::Envelope, raw: &[u8]) -> Result<M, ProtobufError> {
    M::decode(raw).map_err(|source| ProtobufError::Decode {
        api_version: env.api_version.clone(),
        kind: env.kind.clone(),
        source,
    })
}

#[cfg(test)]
mod tests;

//! Which kinds a protobuf body may hold. A leaf: the API error for an unknown media type names them too,
//! and that must not tie `errors` to the decoders.

/// The kinds decoded from protobuf, as `apiVersion/kind`.
pub const ACCEPTED_KINDS: &[&str] = &[
    "v1/Namespace",
    "v1/ConfigMap",
    "v1/Secret",
    "v1/ServiceAccount",
    "v1/Service",
    "apps/v1/Deployment",
    "batch/v1/Job",
    "batch/v1/CronJob",
    "policy/v1/PodDisruptionBudget",
    "authentication.k8s.io/v1/TokenRequest",
    "authorization.k8s.io/v1/SelfSubjectAccessReview",
    "rbac.authorization.k8s.io/v1/Role",
    "rbac.authorization.k8s.io/v1/ClusterRole",
    "rbac.authorization.k8s.io/v1/RoleBinding",
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding",
];

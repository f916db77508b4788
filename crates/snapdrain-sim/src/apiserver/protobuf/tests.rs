//! Round trips: a k8s-pb message encoded with prost as client-go's serializer writes it (non-pointer
//! zero values included, see `fields.rs`), decoded here, compared as JSON.

use k8s_pb::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus, DeploymentStrategy};
use k8s_pb::api::authentication::v1::{TokenRequest, TokenRequestSpec, TokenRequestStatus};
use k8s_pb::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SubjectAccessReviewStatus,
};
use k8s_pb::api::batch::v1::{Job, JobSpec};
use k8s_pb::api::core::v1::{
    ConfigMap, Container, ContainerPort, Namespace, NamespaceSpec, NamespaceStatus, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, Secret,
};
use k8s_pb::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_pb::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_pb::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_pb::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Value, json};

use super::super::errors::ApiError;
use super::envelope::wrap;
use super::{ProtobufError, to_json};

fn body(api_version: &str, kind: &str, m: &impl Message) -> Vec<u8> {
    wrap(api_version, kind, m.encode_to_vec())
}

/// ObjectMeta as Go writes it for a generator's object: every non-pointer string, the zero time.
fn meta(name: &str, labels: &[(&str, &str)]) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: Some(name.into()),
        generate_name: Some(String::new()),
        namespace: Some(String::new()),
        self_link: Some(String::new()),
        uid: Some(String::new()),
        resource_version: Some(String::new()),
        generation: Some(0),
        creation_timestamp: Some(Time::default()),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

fn container(name: &str, image: &str) -> Container {
    Container {
        name: Some(name.into()),
        image: Some(image.into()),
        working_dir: Some(String::new()),
        resources: Some(ResourceRequirements::default()),
        termination_message_path: Some(String::new()),
        termination_message_policy: Some(String::new()),
        image_pull_policy: Some(String::new()),
        stdin: Some(false),
        stdin_once: Some(false),
        tty: Some(false),
        ..Default::default()
    }
}

fn pod_spec(containers: Vec<Container>, restart: &str) -> Option<PodSpec> {
    Some(PodSpec {
        containers,
        restart_policy: Some(restart.into()),
        dns_policy: Some(String::new()),
        service_account_name: Some(String::new()),
        service_account: Some(String::new()),
        node_name: Some(String::new()),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        hostname: Some(String::new()),
        subdomain: Some(String::new()),
        scheduler_name: Some(String::new()),
        priority_class_name: Some(String::new()),
        ..Default::default()
    })
}

fn deployment(c: Container) -> Deployment {
    let labels = [("app", "web")];
    Deployment {
        metadata: meta("web", &labels),
        spec: Some(DeploymentSpec {
            replicas: Some(0),
            selector: Some(LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                match_expressions: vec![],
            }),
            template: Some(PodTemplateSpec {
                metadata: meta("", &labels),
                spec: pod_spec(vec![c], ""),
            }),
            strategy: Some(DeploymentStrategy {
                r#type: Some(String::new()),
                rolling_update: None,
            }),
            min_ready_seconds: Some(0),
            paused: Some(false),
            ..Default::default()
        }),
        status: Some(DeploymentStatus {
            observed_generation: Some(0),
            replicas: Some(0),
            updated_replicas: Some(0),
            ready_replicas: Some(0),
            available_replicas: Some(0),
            unavailable_replicas: Some(0),
            ..Default::default()
        }),
    }
}

#[test]
fn namespace_configmap_and_secret() {
    let ns = Namespace {
        metadata: meta("team-a", &[("env", "dev")]),
        spec: Some(NamespaceSpec::default()),
        status: Some(NamespaceStatus {
            phase: Some(String::new()),
            conditions: vec![],
        }),
    };
    assert_eq!(
        to_json(&body("v1", "Namespace", &ns)).unwrap(),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "team-a", "labels": {"env": "dev"}}})
    );
    let cm = ConfigMap {
        metadata: meta("settings", &[]),
        data: [("a".to_string(), "b".to_string())].into(),
        binary_data: [("bin".to_string(), vec![0xff, 0x00])].into(),
        immutable: None,
    };
    assert_eq!(
        to_json(&body("v1", "ConfigMap", &cm)).unwrap(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
               "data": {"a": "b"}, "binaryData": {"bin": "/wA="}})
    );
    let secret = Secret {
        metadata: meta("creds", &[]),
        data: [("password".to_string(), b"s3cr3t".to_vec())].into(),
        r#type: Some("Opaque".into()),
        ..Default::default()
    };
    assert_eq!(
        to_json(&body("v1", "Secret", &secret)).unwrap(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
               "data": {"password": "czNjcjN0"}, "type": "Opaque"})
    );
}

#[test]
fn deployment_as_kubectl_create_deployment_builds_it() {
    let mut c = container("nginx", "nginx:1.27");
    c.ports = vec![ContainerPort {
        name: Some(String::new()),
        host_port: Some(0),
        container_port: Some(8080),
        protocol: Some(String::new()),
        host_ip: Some(String::new()),
    }];
    let got = to_json(&body("apps/v1", "Deployment", &deployment(c))).unwrap();
    assert_eq!(
        got,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27",
                        "ports": [{"containerPort": 8080}]}]}}}})
    );
}

#[test]
fn job_token_request_review_and_binding() {
    let mut c = container("job", "busybox");
    c.command = vec!["date".into()];
    let job = Job {
        metadata: meta("once", &[]),
        spec: Some(JobSpec {
            template: Some(PodTemplateSpec {
                metadata: meta("", &[]),
                spec: pod_spec(vec![c], "Never"),
            }),
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    assert_eq!(
        to_json(&body("batch/v1", "Job", &job)).unwrap()["spec"],
        json!({"template": {"spec": {"containers": [
            {"name": "job", "image": "busybox", "command": ["date"]}], "restartPolicy": "Never"}}})
    );
    let token = TokenRequest {
        metadata: meta("", &[]),
        spec: Some(TokenRequestSpec {
            audiences: vec!["vault".into()],
            expiration_seconds: Some(600),
            bound_object_ref: None,
        }),
        status: Some(TokenRequestStatus {
            token: Some(String::new()),
            expiration_timestamp: Some(Time::default()),
        }),
    };
    assert_eq!(
        to_json(&body("authentication.k8s.io/v1", "TokenRequest", &token)).unwrap(),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"audiences": ["vault"], "expirationSeconds": 600}})
    );
    let review = SelfSubjectAccessReview {
        metadata: meta("", &[]),
        spec: Some(SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some("apps".into()),
                verb: Some("create".into()),
                group: Some(String::new()),
                version: Some(String::new()),
                resource: Some("pods".into()),
                subresource: Some("eviction".into()),
                name: Some(String::new()),
                ..Default::default()
            }),
            non_resource_attributes: None,
        }),
        status: Some(SubjectAccessReviewStatus {
            allowed: Some(false),
            denied: Some(false),
            reason: Some(String::new()),
            evaluation_error: Some(String::new()),
        }),
    };
    assert_eq!(
        to_json(&body(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            &review
        ))
        .unwrap()["spec"],
        json!({"resourceAttributes": {"namespace": "apps", "verb": "create", "resource": "pods",
               "subresource": "eviction"}})
    );
    let binding = RoleBinding {
        metadata: meta("runner", &[]),
        subjects: vec![Subject {
            kind: Some("ServiceAccount".into()),
            api_group: Some(String::new()),
            name: Some("runner".into()),
            namespace: Some("apps".into()),
        }],
        role_ref: Some(RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: Some("Role".into()),
            name: Some("evictor".into()),
        }),
    };
    assert_eq!(
        to_json(&body(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            &binding
        ))
        .unwrap()["subjects"],
        json!([{"kind": "ServiceAccount", "name": "runner", "namespace": "apps"}])
    );
}

#[test]
fn an_unmapped_field_is_refused_by_path_and_kind() {
    let mut c = container("nginx", "nginx");
    c.liveness_probe = Some(Probe {
        period_seconds: Some(5),
        ..Default::default()
    });
    let err = to_json(&body("apps/v1", "Deployment", &deployment(c))).unwrap_err();
    assert!(
        matches!(&err, ProtobufError::Unmapped { kind, path }
            if kind == "Deployment" && path == "spec.template.spec.containers[0].livenessProbe"),
        "{err:?}"
    );
    let status = ApiError::from(err);
    assert_eq!(status.code, 415);
    assert!(
        status.message.contains("send this object as JSON or YAML"),
        "{}",
        status.message
    );
}

#[test]
fn an_unsupported_kind_is_a_415_naming_the_accepted_kinds() {
    let err = to_json(&wrap("v1", "Pod", vec![])).unwrap_err();
    let status = ApiError::from(err);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    assert!(
        status.message.contains("v1/Pod")
            && status.message.contains("apps/v1/Deployment")
            && status
                .message
                .contains("JSON and YAML bodies are accepted for every kind"),
        "{}",
        status.message
    );
    let garbage = ApiError::from(to_json(b"not protobuf").unwrap_err());
    assert_eq!(garbage.code, 400);
    let v: Value = serde_json::to_value(garbage.to_status()).unwrap();
    assert_eq!(v["reason"], "BadRequest");
}

#[test]
fn service_and_pod_disruption_budget_with_int_or_string() {
    let svc = Service {
        metadata: meta("web", &[("app", "web")]),
        spec: Some(ServiceSpec {
            ports: vec![ServicePort {
                name: Some("80-8080".into()),
                protocol: Some("TCP".into()),
                port: Some(80),
                target_port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: Some(String::new()),
                }),
                node_port: Some(0),
                ..Default::default()
            }],
            selector: [("app".to_string(), "web".to_string())].into(),
            cluster_ip: Some(String::new()),
            r#type: Some("ClusterIP".into()),
            session_affinity: Some(String::new()),
            health_check_node_port: Some(0),
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    assert_eq!(
        to_json(&body("v1", "Service", &svc)).unwrap()["spec"],
        json!({"ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
               "selector": {"app": "web"}, "type": "ClusterIP"})
    );
    let pdb = PodDisruptionBudget {
        metadata: meta("web", &[]),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString {
                r#type: Some(1),
                int_val: Some(0),
                str_val: Some("25%".into()),
            }),
            selector: Some(LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                match_expressions: vec![],
            }),
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    assert_eq!(
        to_json(&body("policy/v1", "PodDisruptionBudget", &pdb)).unwrap()["spec"],
        json!({"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": "25%"})
    );
}

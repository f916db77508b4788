//! core/v1 kinds (`k8s.io/api/core/v1/generated.proto`): what kubectl's generators send
//! (`kubectl/pkg/cmd/create/create_namespace.go`, `create_configmap.go`, `create_secret*.go`,
//! `create_serviceaccount.go`, `create_service.go`) and the pod template the workload generators fill.

use k8s_pb::api::core::v1::{
    ConfigMap, Container, ContainerPort, EnvVar, LocalObjectReference, Namespace, NamespaceSpec,
    PodSpec, PodTemplateSpec, ResourceRequirements, Secret, Service, ServiceAccount, ServicePort,
    ServiceSpec, Toleration, VolumeMount,
};
use serde_json::Value;

use super::fields::{Obj, Result};
use super::meta;

pub fn namespace(n: Namespace) -> Result<Value> {
    let Namespace {
        metadata,
        spec,
        status,
    } = n;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, |path, s: NamespaceSpec| {
        let NamespaceSpec { finalizers } = s;
        let mut o = Obj::new(path);
        o.strings("finalizers", finalizers);
        o.done()
    })?;
    o.unmapped("status", &status)?;
    o.done()
}

pub fn config_map(c: ConfigMap) -> Result<Value> {
    let ConfigMap {
        metadata,
        immutable,
        data,
        binary_data,
    } = c;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.ptr("immutable", immutable);
    o.string_map("data", data);
    o.bytes_map("binaryData", binary_data);
    o.done()
}

pub fn secret(s: Secret) -> Result<Value> {
    let Secret {
        metadata,
        immutable,
        data,
        string_data,
        r#type,
    } = s;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.ptr("immutable", immutable);
    o.bytes_map("data", data);
    o.string_map("stringData", string_data);
    o.string("type", r#type);
    o.done()
}

pub fn service_account(s: ServiceAccount) -> Result<Value> {
    let ServiceAccount {
        metadata,
        secrets,
        image_pull_secrets,
        automount_service_account_token,
    } = s;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.unmapped_list("secrets", &secrets)?;
    o.list("imagePullSecrets", image_pull_secrets, local_reference)?;
    o.ptr(
        "automountServiceAccountToken",
        automount_service_account_token,
    );
    o.done()
}

fn local_reference(path: &str, r: LocalObjectReference) -> Result<Value> {
    let LocalObjectReference { name } = r;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.done()
}

pub fn pod_template_spec(path: &str, t: PodTemplateSpec) -> Result<Value> {
    let PodTemplateSpec { metadata, spec } = t;
    let mut o = Obj::new(path);
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, pod_spec)?;
    o.done()
}

/// The PodSpec fields kubectl's generators set, the scheduling fields the simulator models, and
/// every pointer field whose zero differs from its default; the rest are refused when set.
pub fn pod_spec(path: &str, s: PodSpec) -> Result<Value> {
    let PodSpec {
        volumes,
        init_containers,
        containers,
        ephemeral_containers,
        restart_policy,
        termination_grace_period_seconds,
        active_deadline_seconds,
        dns_policy,
        node_selector,
        service_account_name,
        service_account,
        automount_service_account_token,
        node_name,
        host_network,
        host_pid,
        host_ipc,
        share_process_namespace,
        security_context,
        image_pull_secrets,
        hostname,
        subdomain,
        affinity,
        scheduler_name,
        tolerations,
        host_aliases,
        priority_class_name,
        priority,
        dns_config,
        readiness_gates,
        runtime_class_name,
        enable_service_links,
        preemption_policy,
        overhead,
        topology_spread_constraints,
        set_hostname_as_fqdn,
        os,
        host_users,
        scheduling_gates,
        resource_claims,
        resources,
        hostname_override,
        workload_ref,
    } = s;
    let mut o = Obj::new(path);
    o.unmapped_list("volumes", &volumes)?;
    o.list("initContainers", init_containers, container)?;
    o.list("containers", containers, container)?;
    o.unmapped_list("ephemeralContainers", &ephemeral_containers)?;
    o.string("restartPolicy", restart_policy);
    o.ptr(
        "terminationGracePeriodSeconds",
        termination_grace_period_seconds,
    );
    o.ptr("activeDeadlineSeconds", active_deadline_seconds);
    o.string("dnsPolicy", dns_policy);
    o.string_map("nodeSelector", node_selector);
    o.string("serviceAccountName", service_account_name);
    o.string("serviceAccount", service_account);
    o.ptr(
        "automountServiceAccountToken",
        automount_service_account_token,
    );
    o.string("nodeName", node_name);
    o.flag("hostNetwork", host_network);
    o.flag("hostPID", host_pid);
    o.flag("hostIPC", host_ipc);
    o.ptr("shareProcessNamespace", share_process_namespace);
    o.unmapped("securityContext", &security_context)?;
    o.list("imagePullSecrets", image_pull_secrets, local_reference)?;
    o.string("hostname", hostname);
    o.string("subdomain", subdomain);
    o.unmapped("affinity", &affinity)?;
    o.string("schedulerName", scheduler_name);
    o.list("tolerations", tolerations, toleration)?;
    o.unmapped_list("hostAliases", &host_aliases)?;
    o.string("priorityClassName", priority_class_name);
    o.ptr("priority", priority);
    o.unmapped("dnsConfig", &dns_config)?;
    o.unmapped_list("readinessGates", &readiness_gates)?;
    o.ptr("runtimeClassName", runtime_class_name);
    o.ptr("enableServiceLinks", enable_service_links);
    o.ptr("preemptionPolicy", preemption_policy);
    o.unmapped_map("overhead", &overhead)?;
    o.unmapped_list("topologySpreadConstraints", &topology_spread_constraints)?;
    o.ptr("setHostnameAsFQDN", set_hostname_as_fqdn);
    o.unmapped("os", &os)?;
    o.ptr("hostUsers", host_users);
    o.unmapped_list("schedulingGates", &scheduling_gates)?;
    o.unmapped_list("resourceClaims", &resource_claims)?;
    o.unmapped("resources", &resources)?;
    o.ptr("hostnameOverride", hostname_override);
    o.unmapped("workloadRef", &workload_ref)?;
    o.done()
}

/// What `kubectl create deployment|job|cronjob` and `kubectl run` put in a container (name, image,
/// command, args, ports, env, resources), plus the plain fields; probes, lifecycle and security
/// context are refused when set.
pub fn container(path: &str, c: Container) -> Result<Value> {
    let Container {
        name,
        image,
        command,
        args,
        working_dir,
        ports,
        env_from,
        env,
        resources,
        resize_policy,
        restart_policy,
        restart_policy_rules,
        volume_mounts,
        volume_devices,
        liveness_probe,
        readiness_probe,
        startup_probe,
        lifecycle,
        termination_message_path,
        termination_message_policy,
        image_pull_policy,
        security_context,
        stdin,
        stdin_once,
        tty,
    } = c;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.string("image", image);
    o.strings("command", command);
    o.strings("args", args);
    o.string("workingDir", working_dir);
    o.list("ports", ports, container_port)?;
    o.unmapped_list("envFrom", &env_from)?;
    o.list("env", env, env_var)?;
    o.embedded("resources", resources, resource_requirements)?;
    o.unmapped_list("resizePolicy", &resize_policy)?;
    o.ptr("restartPolicy", restart_policy);
    o.unmapped_list("restartPolicyRules", &restart_policy_rules)?;
    o.list("volumeMounts", volume_mounts, volume_mount)?;
    o.unmapped_list("volumeDevices", &volume_devices)?;
    o.unmapped("livenessProbe", &liveness_probe)?;
    o.unmapped("readinessProbe", &readiness_probe)?;
    o.unmapped("startupProbe", &startup_probe)?;
    o.unmapped("lifecycle", &lifecycle)?;
    o.string("terminationMessagePath", termination_message_path);
    o.string("terminationMessagePolicy", termination_message_policy);
    o.string("imagePullPolicy", image_pull_policy);
    o.unmapped("securityContext", &security_context)?;
    o.flag("stdin", stdin);
    o.flag("stdinOnce", stdin_once);
    o.flag("tty", tty);
    o.done()
}

fn container_port(path: &str, p: ContainerPort) -> Result<Value> {
    let ContainerPort {
        name,
        host_port,
        container_port,
        protocol,
        host_ip,
    } = p;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.int("hostPort", host_port);
    // Not omitempty in the Go type: always written.
    o.set("containerPort", container_port.unwrap_or(0).into());
    o.string("protocol", protocol);
    o.string("hostIP", host_ip);
    o.done()
}

fn env_var(path: &str, e: EnvVar) -> Result<Value> {
    let EnvVar {
        name,
        value,
        value_from,
    } = e;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.string("value", value);
    o.unmapped("valueFrom", &value_from)?;
    o.done()
}

fn resource_requirements(path: &str, r: ResourceRequirements) -> Result<Value> {
    let ResourceRequirements {
        limits,
        requests,
        claims,
    } = r;
    let mut o = Obj::new(path);
    if !limits.is_empty() {
        let v = meta::quantities(&o.at("limits"), limits)?;
        o.set("limits", v);
    }
    if !requests.is_empty() {
        let v = meta::quantities(&o.at("requests"), requests)?;
        o.set("requests", v);
    }
    o.unmapped_list("claims", &claims)?;
    o.done()
}

fn volume_mount(path: &str, m: VolumeMount) -> Result<Value> {
    let VolumeMount {
        name,
        read_only,
        recursive_read_only,
        mount_path,
        sub_path,
        mount_propagation,
        sub_path_expr,
    } = m;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.flag("readOnly", read_only);
    o.ptr("recursiveReadOnly", recursive_read_only);
    o.string("mountPath", mount_path);
    o.string("subPath", sub_path);
    o.ptr("mountPropagation", mount_propagation);
    o.string("subPathExpr", sub_path_expr);
    o.done()
}

fn toleration(path: &str, t: Toleration) -> Result<Value> {
    let Toleration {
        key,
        operator,
        value,
        effect,
        toleration_seconds,
    } = t;
    let mut o = Obj::new(path);
    o.string("key", key);
    o.string("operator", operator);
    o.string("value", value);
    o.string("effect", effect);
    o.ptr("tolerationSeconds", toleration_seconds);
    o.done()
}

/// What `kubectl create service clusterip|nodeport|loadbalancer|externalname` sets (ports, selector,
/// type, clusterIP, externalName) and the plain fields; session affinity config is refused when set.
pub fn service(s: Service) -> Result<Value> {
    let Service {
        metadata,
        spec,
        status,
    } = s;
    let mut o = Obj::new("");
    o.embedded("metadata", metadata, meta::object_meta)?;
    o.embedded("spec", spec, service_spec)?;
    o.unmapped("status", &status)?;
    o.done()
}

fn service_spec(path: &str, s: ServiceSpec) -> Result<Value> {
    let ServiceSpec {
        ports,
        selector,
        cluster_ip,
        cluster_ips,
        r#type,
        external_ips,
        session_affinity,
        load_balancer_ip,
        load_balancer_source_ranges,
        external_name,
        external_traffic_policy,
        health_check_node_port,
        publish_not_ready_addresses,
        session_affinity_config,
        ip_families,
        ip_family_policy,
        allocate_load_balancer_node_ports,
        load_balancer_class,
        internal_traffic_policy,
        traffic_distribution,
    } = s;
    let mut o = Obj::new(path);
    o.list("ports", ports, service_port)?;
    o.string_map("selector", selector);
    o.string("clusterIP", cluster_ip);
    o.strings("clusterIPs", cluster_ips);
    o.string("type", r#type);
    o.strings("externalIPs", external_ips);
    o.string("sessionAffinity", session_affinity);
    o.string("loadBalancerIP", load_balancer_ip);
    o.strings("loadBalancerSourceRanges", load_balancer_source_ranges);
    o.string("externalName", external_name);
    o.string("externalTrafficPolicy", external_traffic_policy);
    o.int("healthCheckNodePort", health_check_node_port);
    o.flag("publishNotReadyAddresses", publish_not_ready_addresses);
    o.unmapped("sessionAffinityConfig", &session_affinity_config)?;
    o.strings("ipFamilies", ip_families);
    o.ptr("ipFamilyPolicy", ip_family_policy);
    o.ptr(
        "allocateLoadBalancerNodePorts",
        allocate_load_balancer_node_ports,
    );
    o.ptr("loadBalancerClass", load_balancer_class);
    o.ptr("internalTrafficPolicy", internal_traffic_policy);
    o.ptr("trafficDistribution", traffic_distribution);
    o.done()
}

fn service_port(path: &str, p: ServicePort) -> Result<Value> {
    let ServicePort {
        name,
        protocol,
        app_protocol,
        port,
        target_port,
        node_port,
    } = p;
    let mut o = Obj::new(path);
    o.string("name", name);
    o.string("protocol", protocol);
    o.ptr("appProtocol", app_protocol);
    // Not omitempty in the Go type: always written.
    o.set("port", port.unwrap_or(0).into());
    // A non-pointer IntOrString: its zero (int 0) means "same as port" and is omitted.
    if let Some(t) = target_port {
        let v = meta::int_or_string(&o.at("targetPort"), t)?;
        if v != 0 && v != "" {
            o.set("targetPort", v);
        }
    }
    o.int("nodePort", node_port);
    o.done()
}

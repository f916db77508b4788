//! From a scenario to objects in the store: namespaces, Karpenter classes and pools, Nodes (with their
//! NodeClaims), workloads, PDBs, Velero, raw objects. Validation happens first, so a bad scenario
//! leaves the store untouched.

use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine;
use serde_json::{Value, json};

use super::format::*;
use super::manifest::load_object;
use super::timeline::TimelineEntry;
use super::{ScenarioError, builtin, materialize};
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{Store, WriteOptions};
use crate::apiserver::validation::{is_dns1123_label, is_dns1123_subdomain};
use crate::world::Timings;
use crate::world::objects::*;

/// What the cluster needs after loading: how fast the world moves, the timeline, and the EC2 instances
/// behind the nodes (for the EC2 simulator to know them as running).
#[derive(Clone, Debug, Default)]
pub struct LoadedScenario {
    pub name: String,
    pub timings: Timings,
    pub timeline: Vec<TimelineEntry>,
    pub instances: Vec<NodeInstance>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeInstance {
    pub instance_id: String,
    pub node_name: String,
    pub zone: String,
    pub instance_type: String,
    pub private_ip: String,
    pub provider_id: String,
    pub image_id: String,
    /// The NodePool when Karpenter manages the node.
    pub node_pool: Option<String>,
    /// Launched with the node role's instance profile.
    pub instance_profile: bool,
    /// Launched with Bottlerocket user data naming the cluster.
    pub user_data: bool,
}

/// A built-in scenario by name, or a scenario file by path. Returns it with the label errors use.
pub fn resolve(name_or_file: &str) -> Result<(Scenario, String), ScenarioError> {
    if let Some(s) = builtin::get(name_or_file) {
        return Ok((s?, format!("built-in {name_or_file}")));
    }
    let path = Path::new(name_or_file);
    if !path.exists() && !name_or_file.contains(['/', '.']) {
        return Err(ScenarioError::Unknown {
            name: name_or_file.to_string(),
            available: builtin::NAMES.join(", "),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError::Read {
        file: name_or_file.to_string(),
        source: e,
    })?;
    Ok((parse(&text, name_or_file)?, name_or_file.to_string()))
}

/// Parses and validates scenario YAML; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
    let scenario: Scenario = serde_saphyr::from_str(text).map_err(|e| {
        // The parser's text repeats the position and adds a source snippet; keep the sentence only.
        let full = e.to_string();
        let first = full
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        let message = match first.split_once(": ") {
            Some((pos, rest)) if pos.starts_with("line ") => rest.to_string(),
            _ => first.to_string(),
        };
        match e.location() {
            Some(loc) => ScenarioError::Syntax {
                file: file.to_string(),
                line: loc.line(),
                column: loc.column(),
                message,
            },
            None => ScenarioError::Invalid {
                file: file.to_string(),
                path: "(document)".into(),
                message,
            },
        }
    })?;
    validate(&scenario, file)?;
    Ok(scenario)
}

fn invalid(file: &str, path: String, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        file: file.to_string(),
        path,
        message: message.into(),
    }
}

fn validate(s: &Scenario, file: &str) -> Result<(), ScenarioError> {
    let mut node_names = BTreeSet::new();
    for (i, g) in s.nodes.iter().enumerate() {
        let path = |f: &str| format!("nodes[{i}].{f}");
        match (&g.name, g.count) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    file,
                    path("count"),
                    "give either name or count, not both",
                ));
            }
            (None, None) => {
                return Err(invalid(
                    file,
                    path("name"),
                    "give a name, or a count of nodes to generate",
                ));
            }
            (Some(n), None) if !is_dns1123_subdomain(n) => {
                return Err(invalid(
                    file,
                    path("name"),
                    format!(
                        "{n:?} is not a valid node name (lowercase letters, digits, '-' and '.')"
                    ),
                ));
            }
            (Some(n), None) => {
                node_names.insert(n.clone());
            }
            (None, Some(_)) => {
                if let Some(p) = &g.prefix {
                    if !is_dns1123_label(p) {
                        return Err(invalid(
                            file,
                            path("prefix"),
                            format!("{p:?} is not a valid name prefix"),
                        ));
                    }
                    for n in 0..g.count.unwrap_or(0) {
                        node_names.insert(format!("{p}-{n}"));
                    }
                }
            }
        }
        if g.zone.is_none() && g.zones.is_empty() {
            return Err(invalid(
                file,
                path("zone"),
                "every node needs a zone (zone: us-east-1a, or zones: [...])",
            ));
        }
        for (j, t) in g.taints.iter().enumerate() {
            if !matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ) {
                return Err(invalid(
                    file,
                    format!("nodes[{i}].taints[{j}].effect"),
                    format!(
                        "{:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                        t.effect
                    ),
                ));
            }
        }
        if let Some(p) = &g.provider_id
            && (!p.starts_with("aws:///") || p.split('/').count() != 5)
        {
            return Err(invalid(
                file,
                path("providerID"),
                format!("{p:?} is not of the form aws:///<zone>/<instance-id>"),
            ));
        }
    }
    for ns in &s.namespaces {
        if !is_dns1123_label(ns) {
            return Err(invalid(
                file,
                "namespaces".into(),
                format!("{ns:?} is not a valid namespace name"),
            ));
        }
    }
    let workloads = s
        .stateful_sets
        .iter()
        .map(|w| ("statefulSets", &w.name, &w.namespace, &w.pdb))
        .chain(
            s.deployments
                .iter()
                .map(|w| ("deployments", &w.name, &w.namespace, &w.pdb)),
        );
    for (i, (kind, name, ns, pdb)) in workloads.enumerate() {
        if !is_dns1123_label(name) || !is_dns1123_label(ns) {
            return Err(invalid(
                file,
                format!("{kind} (entry {i})"),
                format!("{ns}/{name} is not a valid namespace/name"),
            ));
        }
        if let Some(b) = pdb
            && b.min_available.is_some() == b.max_unavailable.is_some()
        {
            return Err(invalid(
                file,
                format!("{kind}.{name}.pdb"),
                "set exactly one of minAvailable and maxUnavailable",
            ));
        }
    }
    for (i, p) in s.pdbs.iter().enumerate() {
        if p.min_available.is_some() == p.max_unavailable.is_some() {
            return Err(invalid(
                file,
                format!("pdbs[{i}]"),
                "set exactly one of minAvailable and maxUnavailable",
            ));
        }
    }
    for (i, e) in s.timeline.iter().enumerate() {
        for n in e.action.nodes() {
            // Generated EC2-style names are only known at load time; check the ones we can.
            if !node_names.is_empty()
                && !node_names.contains(n)
                && s.nodes
                    .iter()
                    .all(|g| g.name.is_some() || g.prefix.is_some())
            {
                return Err(invalid(
                    file,
                    format!("timeline[{i}].action"),
                    format!("node {n:?} is not one of the scenario's nodes"),
                ));
            }
        }
        if let super::timeline::Action::InjectFault(rule) = &e.action {
            rule.validate()
                .map_err(|m| invalid(file, format!("timeline[{i}].action.injectFault"), m))?;
        }
    }
    for (i, o) in s.objects.iter().enumerate() {
        if o.get("apiVersion").and_then(Value::as_str).is_none()
            || o.get("kind").and_then(Value::as_str).is_none()
        {
            return Err(invalid(
                file,
                format!("objects[{i}]"),
                "every object needs apiVersion and kind",
            ));
        }
    }
    Ok(())
}

/// (cpu, memory, pods) of an instance type: a few common ones, else 4 vCPU / 16 GiB.
pub(super) fn instance_capacity(instance_type: &str) -> (u32, u32, u32) {
    let size = instance_type.split('.').nth(1).unwrap_or("xlarge");
    let family = instance_type.split('.').next().unwrap_or("m6i");
    let cpu = match size {
        "medium" => 1,
        "large" => 2,
        "xlarge" => 4,
        "2xlarge" => 8,
        "4xlarge" => 16,
        "8xlarge" => 32,
        "12xlarge" => 48,
        "16xlarge" => 64,
        _ => 4,
    };
    let gib_per_cpu = match family.chars().next() {
        Some('c') => 2,
        Some('r') => 8,
        _ => 4,
    };
    // The ENI-based max-pods of Nitro instances, roughly.
    let pods = match cpu {
        1 | 2 => 29,
        4 | 8 => 58,
        _ => 234,
    };
    (cpu, cpu * gib_per_cpu, pods)
}

struct Ctx<'a> {
    store: &'a Store,
    file: &'a str,
}

impl Ctx<'_> {
    fn create(&self, what: &str, obj: Value) -> Result<Value, ScenarioError> {
        self.create_in(what, obj, true)
    }

    fn create_in(
        &self,
        what: &str,
        obj: Value,
        internal_write: bool,
    ) -> Result<Value, ScenarioError> {
        let err = |message: String| ScenarioError::Load {
            file: self.file.to_string(),
            what: what.to_string(),
            message,
        };
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let def = self
            .store
            .def_by_kind(api_version, kind)
            .ok_or_else(|| err(format!("no resource serves {api_version} {kind}")))?;
        let ns = def.namespaced.then(|| namespace(&obj).to_string());
        let opts = WriteOptions {
            internal: internal_write,
            ..Default::default()
        };
        self.store
            .create(&def.key(), ns.as_deref(), obj, opts)
            .map(|o| (*o).clone())
            .map_err(|e| err(e.message))
    }
}

fn ensure_namespace(store: &Store, ns: &str) -> Result<(), String> {
    if store.get(&ResKey::core("namespaces"), None, ns).is_some() {
        return Ok(());
    }
    store
        .create(
            &ResKey::core("namespaces"),
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            WriteOptions::default(),
        )
        .map(|_| ())
        .map_err(|e| e.message)
}

/// Loads `s` (from `file`) into the store; `s3_url` replaces `${S3_URL}`.
pub fn load(
    store: &Store,
    s: &Scenario,
    file: &str,
    s3_url: &str,
) -> Result<LoadedScenario, ScenarioError> {
    load_with_ca(store, s, file, s3_url, None)
}

/// [`load`] for an S3 endpoint served over TLS: the BSL carries `ca_pem` as its `objectStorage.caCert`
/// (unless the scenario's `velero.tlsCa` puts it elsewhere).
pub fn load_with_ca(
    store: &Store,
    s: &Scenario,
    file: &str,
    s3_url: &str,
    ca_pem: Option<&str>,
) -> Result<LoadedScenario, ScenarioError> {
    let c = Ctx { store, file };
    let mut namespaces: BTreeSet<String> = s.namespaces.iter().cloned().collect();
    namespaces.extend(s.stateful_sets.iter().map(|w| w.namespace.clone()));
    namespaces.extend(s.deployments.iter().map(|w| w.namespace.clone()));
    namespaces.extend(s.jobs.iter().map(|w| w.namespace.clone()));
    namespaces.extend(s.daemon_sets.iter().map(|w| w.namespace.clone()));
    namespaces.extend(s.pdbs.iter().map(|w| w.namespace.clone()));
    if s.velero.is_some() {
        namespaces.insert("velero".into());
    }
    for ns in &namespaces {
        ensure_namespace(store, ns).map_err(|message| ScenarioError::Load {
            file: file.into(),
            what: format!("namespace {ns}"),
            message,
        })?;
    }
    let instances = super::nodes::load(store, s, file)?;
    for w in &s.stateful_sets {
        let obj = statefulset_object(w);
        c.create(&format!("statefulSet {}/{}", w.namespace, w.name), obj)?;
        c.create_in(&format!("service {}/{}", w.namespace, w.name), json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": w.service_name.clone().unwrap_or(w.name.clone()), "namespace": w.namespace, "labels": {"app": w.name}},
            "spec": {"clusterIP": "None", "selector": {"app": w.name}, "ports": [{"name": "main", "port": 80}]},
        }), false).or_else(ignore_exists)?;
        if let Some(b) = &w.pdb {
            c.create(
                &format!("pdb {}/{}", w.namespace, w.name),
                pdb_object(&w.name, &w.namespace, &[("app", &w.name)], b),
            )?;
        }
    }
    for w in &s.deployments {
        c.create(
            &format!("deployment {}/{}", w.namespace, w.name),
            deployment_object(&w.name, &w.namespace, w.replicas, &w.pod),
        )?;
        if let Some(b) = &w.pdb {
            c.create(
                &format!("pdb {}/{}", w.namespace, w.name),
                pdb_object(&w.name, &w.namespace, &[("app", &w.name)], b),
            )?;
        }
    }
    for w in &s.daemon_sets {
        c.create(
            &format!("daemonSet {}/{}", w.namespace, w.name),
            daemonset_object(w),
        )?;
    }
    for w in &s.jobs {
        c.create(&format!("job {}/{}", w.namespace, w.name), job_object(w))?;
    }
    for p in &s.pdbs {
        let labels: Vec<(&str, &str)> = p
            .match_labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let b = Budget {
            min_available: p.min_available.clone(),
            max_unavailable: p.max_unavailable.clone(),
        };
        c.create(
            &format!("pdb {}/{}", p.namespace, p.name),
            pdb_object(&p.name, &p.namespace, &labels, &b),
        )?;
    }
    if let Some(v) = &s.velero {
        for obj in velero_objects(v, s3_url, ca_pem) {
            let what = format!(
                "velero {}",
                obj.get("kind").and_then(Value::as_str).unwrap_or("")
            );
            c.create(&what, obj)?;
        }
    }
    for (i, obj) in s.objects.iter().enumerate() {
        let obj = substitute(obj.clone(), s3_url);
        load_object(store, obj).map_err(|message| ScenarioError::Load {
            file: file.into(),
            what: format!("objects[{i}]"),
            message,
        })?;
    }
    if s.materialize {
        materialize::run(store, file).map_err(|message| ScenarioError::Load {
            file: file.into(),
            what: "materialized workloads".into(),
            message,
        })?;
    }
    Ok(LoadedScenario {
        name: s.name.clone().unwrap_or_else(|| file.to_string()),
        timings: s.timings.clone().unwrap_or_default(),
        timeline: s.timeline.clone(),
        instances,
    })
}

fn ignore_exists(e: ScenarioError) -> Result<Value, ScenarioError> {
    match &e {
        ScenarioError::Load { message, .. } if message.contains("already exists") => {
            Ok(Value::Null)
        }
        _ => Err(e),
    }
}

/// Replaces `${S3_URL}` in every string.
pub fn substitute(v: Value, s3_url: &str) -> Value {
    match v {
        Value::String(s) if s.contains(super::S3_URL_PLACEHOLDER) => {
            Value::String(s.replace(super::S3_URL_PLACEHOLDER, s3_url))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(|x| substitute(x, s3_url)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| (k, substitute(x, s3_url)))
                .collect(),
        ),
        other => other,
    }
}

fn pod_template(app: &str, shape: &PodShape, mounts: &[&str]) -> Value {
    let mut labels = json!({"app": app});
    for (k, v) in &shape.labels {
        labels[k] = json!(v);
    }
    let mut container = json!({
        "name": "main",
        "image": shape.image,
        "resources": {"requests": {"cpu": shape.cpu, "memory": shape.memory}},
    });
    if !mounts.is_empty() {
        container["volumeMounts"] = json!(
            mounts
                .iter()
                .map(|m| json!({"name": m, "mountPath": format!("/var/lib/{m}")}))
                .collect::<Vec<_>>()
        );
    }
    let mut t = json!({"metadata": {"labels": labels}, "spec": {"containers": [container]}});
    if !shape.annotations.is_empty() {
        t["metadata"]["annotations"] = json!(shape.annotations);
    }
    if !shape.node_selector.is_empty() {
        t["spec"]["nodeSelector"] = json!(shape.node_selector);
    }
    if !shape.tolerations.is_empty() {
        t["spec"]["tolerations"] = json!(shape.tolerations);
    }
    if let Some(g) = shape.termination_grace_period_seconds {
        t["spec"]["terminationGracePeriodSeconds"] = json!(g);
    }
    t
}

pub fn statefulset_object(w: &StatefulSetSpec) -> Value {
    let mounts: Vec<&str> = w
        .volume_claim_templates
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let claims: Vec<Value> = w
        .volume_claim_templates
        .iter()
        .map(|t| {
            let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": t.size}}});
            if let Some(sc) = &t.storage_class {
                spec["storageClassName"] = json!(sc);
            }
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": t.name}, "spec": spec})
        })
        .collect();
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": w.name, "namespace": w.namespace, "labels": {"app": w.name}},
        "spec": {
            "replicas": w.replicas,
            "serviceName": w.service_name.clone().unwrap_or(w.name.clone()),
            "podManagementPolicy": w.pod_management_policy.clone().unwrap_or("OrderedReady".into()),
            "selector": {"matchLabels": {"app": w.name}},
            "template": pod_template(&w.name, &w.pod, &mounts),
            "volumeClaimTemplates": claims,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "revisionHistoryLimit": 10,
        },
    })
}

pub fn deployment_object(name_: &str, ns: &str, replicas: u32, pod: &PodShape) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name_, "namespace": ns, "labels": {"app": name_}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name_}},
            "template": pod_template(name_, pod, &[]),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
        },
    })
}

pub fn daemonset_object(w: &DaemonSetSpec) -> Value {
    let mut template = pod_template(&w.name, &w.pod, &[]);
    if w.tolerate_all {
        let mut t = template["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        t.push(json!({"operator": "Exists"}));
        template["spec"]["tolerations"] = json!(t);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": w.name, "namespace": w.namespace, "labels": {"app": w.name}},
        "spec": {"selector": {"matchLabels": {"app": w.name}}, "template": template,
                 "updateStrategy": {"type": "RollingUpdate"}},
    })
}

fn job_object(w: &JobSpec) -> Value {
    let mut template = pod_template(&w.name, &w.pod, &[]);
    template["spec"]["restartPolicy"] = json!("Never");
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": w.name, "namespace": w.namespace, "labels": {"app": w.name}},
        "spec": {"parallelism": w.parallelism, "completions": w.completions.unwrap_or(w.parallelism),
                 "backoffLimit": 6, "template": template},
    });
    if let Some(ms) = w.run_for_ms {
        job["metadata"]["annotations"] = json!({crate::world::kubelet::RUN_FOR_MS: ms.to_string()});
    }
    job
}

fn pdb_object(name_: &str, ns: &str, labels: &[(&str, &str)], b: &Budget) -> Value {
    let ml: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({"selector": {"matchLabels": ml}});
    if let Some(m) = &b.min_available {
        spec["minAvailable"] = m.clone();
    }
    if let Some(m) = &b.max_unavailable {
        spec["maxUnavailable"] = m.clone();
    }
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name_, "namespace": ns}, "spec": spec})
}

/// What `velero install --provider aws --use-node-agent` (pkg/install/deployment.go, secret.go) or the
/// vmware-tanzu Helm chart (charts/velero/templates/deployment.yaml, secret.yaml, `_helpers.tpl`
/// `velero.secretName`) creates that snapdrain reads. Both mount the credentials Secret as volume
/// `cloud-credentials` at `/credentials` and point `AWS_SHARED_CREDENTIALS_FILE` at `/credentials/cloud`;
/// the CLI names the Secret `cloud-credentials`, the chart after the release (`velero`). With IRSA there
/// is no Secret, and the EKS pod identity webhook injects `AWS_ROLE_ARN` and
/// `AWS_WEB_IDENTITY_TOKEN_FILE` instead.
fn velero_objects(v: &VeleroSpec, s3_url: &str, ca_pem: Option<&str>) -> Vec<Value> {
    let ini = format!(
        "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
        v.access_key, v.secret_key
    );
    let mut storage = json!({"bucket": v.bucket});
    if let Some(p) = &v.prefix {
        storage["prefix"] = json!(p);
    }
    if let Some(pem) = ca_pem.filter(|_| v.tls_ca == TlsCa::Location) {
        storage["caCert"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    let (secret_name, labels) = match v.install {
        VeleroInstall::Cli => ("cloud-credentials", json!({"component": "velero"})),
        VeleroInstall::Helm => (
            "velero",
            json!({"app.kubernetes.io/name": "velero", "app.kubernetes.io/instance": "velero",
                   "app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "velero-11.1.1"}),
        ),
    };
    let mut config = if v.aws_s3 {
        json!({})
    } else {
        json!({"region": v.region, "s3ForcePathStyle": "true",
               "s3Url": v.s3_url.replace(super::S3_URL_PLACEHOLDER, s3_url)})
    };
    if v.sse_c {
        config["customerKeyEncryptionFile"] = json!("/sse-c/key");
    }
    if let Some(flag) = &v.insecure_skip_tls_verify {
        config["insecureSkipTLSVerify"] = json!(flag);
    }
    let mut deployment = deployment_object(
        "velero",
        "velero",
        1,
        &PodShape {
            image: "velero/velero:v1.18.2".into(),
            ..Default::default()
        },
    );
    deployment["metadata"]["labels"] = labels.clone();
    // The server pod's labels: `velero install` gives `component: velero` and `deploy: velero`
    // (velero pkg/install/deployment.go, resources.go `podLabels`); the chart `name: velero` and its
    // app.kubernetes.io labels (charts/velero/templates/deployment.yaml).
    let pod_labels = match v.install {
        VeleroInstall::Cli => json!({"component": "velero", "deploy": "velero"}),
        VeleroInstall::Helm => json!({"name": "velero", "app.kubernetes.io/name": "velero",
                                      "app.kubernetes.io/instance": "velero",
                                      "app.kubernetes.io/managed-by": "Helm"}),
    };
    if let (Some(into), Some(from)) = (
        deployment["spec"]["template"]["metadata"]["labels"].as_object_mut(),
        pod_labels.as_object(),
    ) {
        into.extend(from.clone());
    }
    let pod = &mut deployment["spec"]["template"]["spec"];
    let mut env = vec![json!({"name": "VELERO_NAMESPACE", "value": "velero"})];
    let mut out = Vec::new();
    match v.credentials {
        VeleroCredentials::Secret => {
            out.push(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": "velero", "labels": labels},
                "type": "Opaque",
                "data": {"cloud": base64::engine::general_purpose::STANDARD.encode(ini)}}));
            env.push(json!({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/credentials/cloud"}));
            pod["volumes"] =
                json!([{"name": "cloud-credentials", "secret": {"secretName": secret_name}}]);
            pod["containers"][0]["volumeMounts"] =
                json!([{"name": "cloud-credentials", "mountPath": "/credentials"}]);
        }
        VeleroCredentials::Irsa => {
            env.push(json!({"name": crate::sts::ROLE_ARN_ENV, "value": v.role_arn}));
            env.push(json!({"name": crate::sts::WEB_IDENTITY_TOKEN_FILE_ENV,
                            "value": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"}));
        }
    }
    if v.sse_c {
        // 32 bytes, as the plugin requires; mounted like a chart's `extraVolumes`/`extraVolumeMounts`.
        out.push(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "velero-sse-c", "namespace": "velero"}, "type": "Opaque",
            "data": {"key": base64::engine::general_purpose::STANDARD.encode("0123456789abcdef0123456789abcdef")}}));
        let mut volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        volumes.push(json!({"name": "sse-c", "secret": {"secretName": "velero-sse-c"}}));
        pod["volumes"] = json!(volumes);
        let mut mounts = pod["containers"][0]["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        mounts.push(json!({"name": "sse-c", "mountPath": "/sse-c"}));
        pod["containers"][0]["volumeMounts"] = json!(mounts);
    }
    pod["containers"][0]["name"] = json!("velero");
    pod["containers"][0]["env"] = json!(env);
    out.push(json!({"apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
           "metadata": {"name": v.location_name, "namespace": "velero", "labels": {"component": "velero"}},
           "spec": {"provider": "aws", "default": true, "accessMode": "ReadWrite", "objectStorage": storage,
                    "config": config},
           "status": {"phase": "Available", "lastValidationTime": now()}}));
    out.push(deployment);
    if v.node_agent {
        let mut ds = daemonset_object(&DaemonSetSpec {
            name: "node-agent".into(),
            namespace: "velero".into(),
            pod: PodShape {
                image: "velero/velero:v1.18.2".into(),
                cpu: "50m".into(),
                memory: "64Mi".into(),
                ..Default::default()
            },
            tolerate_all: false,
        });
        // `velero install` labels node-agent pods `name: node-agent`; Velero finds them by it.
        ds["spec"]["template"]["metadata"]["labels"]["name"] = json!("node-agent");
        out.push(ds);
    }
    out
}

//! The simulated Bottlerocket host: what it does with the user data it boots with, and how Karpenter writes
//! that user data for its nodes. Written from Bottlerocket's settings reference
//! (bottlerocket.dev, "API → settings → kubernetes" and "kernel"), not from snapdrain's renderer, so a
//! mistake in the product's user data is caught here instead of being shared.
//!
//! What the host refuses:
//! - user data that is not TOML (plain or gzip) or has no `[settings]` table: the settings API rejects it
//!   and the host shuts down, which is how the simulator reports it ([`BootError::Settings`]);
//! - missing `settings.kubernetes.cluster-name`, `api-server` or `cluster-certificate` (needed by every
//!   `aws-k8s-*` variant), a non-base64 certificate, malformed node labels, taints or sysctl keys;
//! - node labels kubelet refuses to register (`--node-labels` in the `kubernetes.io`/`k8s.io` namespaces
//!   outside kubelet's allowed set, kubernetes `cmd/kubelet/app/options/options.go` and
//!   `pkg/kubelet/apis/well_known_labels.go`): the host runs but kubelet exits, so no Node ever joins
//!   ([`BootError::KubeletRefused`]).
//!
//! Settings the simulator does not model (host containers, credential providers...) are accepted as is.

use std::collections::BTreeMap;
use std::io::Read as _;

use base64::Engine as _;
use toml::{Table, Value};

/// EC2 refuses user data over 16 KB before base64 (EC2 API reference, RunInstances `UserData`).
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// What a booted host hands to kubelet.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostSettings {
    pub cluster_name: String,
    pub api_server: String,
    /// `settings.kubernetes.max-pods`, when set.
    pub max_pods: Option<u32>,
    pub node_labels: BTreeMap<String, String>,
    /// (key, value, effect); the value may be empty.
    pub node_taints: Vec<(String, String, String)>,
    pub sysctls: BTreeMap<String, String>,
}

/// Why a host does not join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootError {
    /// The settings API refused the user data; the host shuts down.
    Settings(String),
    /// The host is up but kubelet refuses its flags and exits; no Node registers.
    KubeletRefused(String),
}

impl std::fmt::Display for BootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootError::Settings(m) => write!(f, "Bottlerocket rejected the user data: {m}"),
            BootError::KubeletRefused(m) => write!(f, "kubelet refused to start: {m}"),
        }
    }
}

/// The settings a node needs to join this cluster, as Karpenter's EC2NodeClass supplies them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterJoin {
    pub cluster_name: String,
    pub api_server: String,
    /// Base64 CA bundle.
    pub cluster_certificate: String,
}

/// Boots a host with raw (already base64-decoded) user data.
pub fn boot(raw: &[u8]) -> Result<HostSettings, BootError> {
    let settings = read_settings(raw).map_err(BootError::Settings)?;
    let host = host_settings(&settings).map_err(BootError::Settings)?;
    kubelet_accepts(&host.node_labels).map_err(BootError::KubeletRefused)?;
    Ok(host)
}

/// User data for a Karpenter node, shaped as karpenter-provider-aws's Bottlerocket bootstrap writes it
/// (`pkg/providers/amifamily/bootstrap/bottlerocket.go`: cluster name, API server, CA, node labels and
/// node taints under `settings.kubernetes`).
pub fn karpenter_user_data(
    join: &ClusterJoin,
    labels: &BTreeMap<String, String>,
    taints: &[(String, String, String)],
) -> String {
    let mut k8s = Table::new();
    k8s.insert("cluster-name".into(), join.cluster_name.clone().into());
    k8s.insert("api-server".into(), join.api_server.clone().into());
    k8s.insert(
        "cluster-certificate".into(),
        join.cluster_certificate.clone().into(),
    );
    if !labels.is_empty() {
        let t: Table = labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        k8s.insert("node-labels".into(), t.into());
    }
    if !taints.is_empty() {
        let mut t: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (k, v, effect) in taints {
            t.entry(k.clone())
                .or_default()
                .push(format!("{v}:{effect}").into());
        }
        let t: Table = t.into_iter().map(|(k, v)| (k, Value::Array(v))).collect();
        k8s.insert("node-taints".into(), t.into());
    }
    let mut settings = Table::new();
    settings.insert("kubernetes".into(), k8s.into());
    let mut doc = Table::new();
    doc.insert("settings".into(), settings.into());
    doc.to_string()
}

fn read_settings(raw: &[u8]) -> Result<Table, String> {
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = String::new();
        flate2::read::GzDecoder::new(raw)
            .read_to_string(&mut out)
            .map_err(|e| format!("gzip user data does not decompress to text: {e}"))?;
        out
    } else {
        String::from_utf8(raw.to_vec()).map_err(|_| "user data is not UTF-8 TOML".to_string())?
    };
    let doc: Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("not TOML: {}", e.message()))?;
    match doc.get("settings") {
        Some(Value::Table(t)) => Ok(t.clone()),
        _ => Err("no [settings] table".into()),
    }
}

fn host_settings(settings: &Table) -> Result<HostSettings, String> {
    let k8s = settings
        .get("kubernetes")
        .and_then(Value::as_table)
        .ok_or("settings.kubernetes is missing")?;
    let required = |key: &str| {
        k8s.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(format!(
                "settings.kubernetes.{key} is missing or not a string"
            ))
    };
    let cluster_name = required("cluster-name")?;
    let api_server = required("api-server")?;
    let ca = required("cluster-certificate")?;
    base64::engine::general_purpose::STANDARD
        .decode(ca.trim())
        .map_err(|e| format!("settings.kubernetes.cluster-certificate is not base64: {e}"))?;
    if !(api_server.starts_with("https://") || api_server.starts_with("http://")) {
        return Err(format!(
            "settings.kubernetes.api-server {api_server:?} is not a URL"
        ));
    }
    let max_pods = match k8s.get("max-pods") {
        None => None,
        Some(v) => Some(
            v.as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("settings.kubernetes.max-pods is not a positive integer")?,
        ),
    };
    let mut host = HostSettings {
        cluster_name,
        api_server,
        max_pods,
        ..HostSettings::default()
    };
    if let Some(labels) = k8s.get("node-labels") {
        let labels = labels
            .as_table()
            .ok_or("settings.kubernetes.node-labels is not a table")?;
        for (k, v) in labels {
            let v = v.as_str().ok_or(format!(
                "settings.kubernetes.node-labels.{k:?} is not a string"
            ))?;
            if !is_label_key(k) || !is_label_value(v) {
                return Err(format!(
                    "settings.kubernetes.node-labels.{k:?} = {v:?} is not a valid label"
                ));
            }
            host.node_labels.insert(k.clone(), v.to_string());
        }
    }
    if let Some(taints) = k8s.get("node-taints") {
        let taints = taints
            .as_table()
            .ok_or("settings.kubernetes.node-taints is not a table")?;
        for (k, entries) in taints {
            if !is_label_key(k) {
                return Err(format!(
                    "settings.kubernetes.node-taints.{k:?}: not a valid taint key"
                ));
            }
            let entries = entries.as_array().ok_or(format!(
                "settings.kubernetes.node-taints.{k:?} is not a list of \"value:Effect\""
            ))?;
            for e in entries {
                let e = e.as_str().ok_or(format!(
                    "settings.kubernetes.node-taints.{k:?} has an entry that is not a string"
                ))?;
                let (value, effect) = e.rsplit_once(':').ok_or(format!(
                    "settings.kubernetes.node-taints.{k:?}: {e:?} has no effect"
                ))?;
                if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
                    || !is_label_value(value)
                {
                    return Err(format!(
                        "settings.kubernetes.node-taints.{k:?}: {e:?} is not value:Effect (NoSchedule, PreferNoSchedule or NoExecute)"
                    ));
                }
                host.node_taints
                    .push((k.clone(), value.to_string(), effect.to_string()));
            }
        }
    }
    if let Some(sysctl) = settings
        .get("kernel")
        .and_then(Value::as_table)
        .and_then(|k| k.get("sysctl"))
    {
        let sysctl = sysctl
            .as_table()
            .ok_or("settings.kernel.sysctl is not a table")?;
        for (k, v) in sysctl {
            let v = v
                .as_str()
                .ok_or(format!("settings.kernel.sysctl.{k:?} is not a string"))?;
            let ok_key = !k.is_empty()
                && k.len() <= 128
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "./_-".contains(c));
            if !ok_key {
                return Err(format!(
                    "settings.kernel.sysctl.{k:?}: not a valid sysctl key"
                ));
            }
            host.sysctls.insert(k.clone(), v.to_string());
        }
    }
    Ok(host)
}

/// Kubelet's rule for `--node-labels`: keys in the `kubernetes.io` or `k8s.io` namespaces must be in the
/// allowed set or under an allowed prefix, anything else makes kubelet exit.
fn kubelet_accepts(labels: &BTreeMap<String, String>) -> Result<(), String> {
    const ALLOWED: &[&str] = &[
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "beta.kubernetes.io/os",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "kubernetes.io/arch",
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    const ALLOWED_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];
    let refused: Vec<&str> = labels
        .keys()
        .filter(|k| {
            let Some((ns, _)) = k.split_once('/') else {
                return false;
            };
            let restricted = ns == "kubernetes.io"
                || ns.ends_with(".kubernetes.io")
                || ns == "k8s.io"
                || ns.ends_with(".k8s.io");
            let allowed = ALLOWED.contains(&k.as_str())
                || ALLOWED_NAMESPACES
                    .iter()
                    .any(|a| ns == *a || ns.ends_with(&format!(".{a}")));
            restricted && !allowed
        })
        .map(String::as_str)
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {refused:?}"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn is_label_key(k: &str) -> bool {
    match k.rsplit_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|part| {
                    let b = part.as_bytes();
                    !b.is_empty()
                        && b.len() <= 63
                        && b[0].is_ascii_alphanumeric()
                        && b[b.len() - 1].is_ascii_alphanumeric()
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                })
                && is_label_name(name)
        }
        None => is_label_name(k),
    }
}

fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_label_name(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join() -> ClusterJoin {
        ClusterJoin {
            cluster_name: "c".into(),
            api_server: "https://api.example".into(),
            cluster_certificate: "Y2E=".into(),
        }
    }

    #[test]
    fn karpenter_user_data_boots_with_its_labels_and_taints() {
        let labels = BTreeMap::from([("karpenter.sh/nodepool".to_string(), "p".to_string())]);
        let taints = vec![("dedicated".into(), "db".into(), "NoSchedule".into())];
        let host = boot(karpenter_user_data(&join(), &labels, &taints).as_bytes()).unwrap();
        assert_eq!(host.cluster_name, "c");
        assert_eq!(host.node_labels, labels);
        assert_eq!(host.node_taints, taints);
    }

    #[test]
    fn missing_cluster_settings_are_refused_by_the_settings_api() {
        let err = boot(b"[settings.kubernetes]\ncluster-name = \"c\"\n").unwrap_err();
        assert!(matches!(err, BootError::Settings(m) if m.contains("api-server")));
        assert!(matches!(boot(b"not toml ["), Err(BootError::Settings(_))));
    }

    #[test]
    fn kubelet_refuses_restricted_node_labels_but_not_the_allowed_ones() {
        let with = |key: &str| {
            let labels = BTreeMap::from([(key.to_string(), "x".to_string())]);
            boot(karpenter_user_data(&join(), &labels, &[]).as_bytes())
        };
        assert!(matches!(
            with("node-role.kubernetes.io/worker"),
            Err(BootError::KubeletRefused(_))
        ));
        assert!(matches!(
            with("example.k8s.io/a"),
            Err(BootError::KubeletRefused(_))
        ));
        assert!(with("node.kubernetes.io/pool").is_ok());
        assert!(with("topology.kubernetes.io/zone").is_ok());
        assert!(with("example.com/pool").is_ok());
    }

    #[test]
    fn malformed_taints_and_labels_are_refused() {
        let bad_taint = "[settings.kubernetes]\ncluster-name=\"c\"\napi-server=\"https://a\"\ncluster-certificate=\"Y2E=\"\n[settings.kubernetes.node-taints]\nk = [\"v:Sometimes\"]\n";
        assert!(matches!(
            boot(bad_taint.as_bytes()),
            Err(BootError::Settings(_))
        ));
        let bad_label = "[settings.kubernetes]\ncluster-name=\"c\"\napi-server=\"https://a\"\ncluster-certificate=\"Y2E=\"\n[settings.kubernetes.node-labels]\n\"-x\" = \"v\"\n";
        assert!(matches!(
            boot(bad_label.as_bytes()),
            Err(BootError::Settings(_))
        ));
    }
}

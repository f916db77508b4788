//! Bottlerocket user data: render it from node settings, and validate it the way the host would.
//!
//! Used by the controller to launch replacement capacity: nothing invalid is ever sent to EC2.

mod cluster;
mod error;
pub(crate) mod rules;
mod validate;

use std::collections::BTreeMap;

use base64::Engine as _;
use toml::{Table, Value};

pub use cluster::{ClusterSettings, cluster_settings};
pub use error::UserDataError;
pub use validate::{MAX_USER_DATA_BYTES, ParsedUserData, Taint, validate, validate_bytes};

/// What a replacement node should look like, in Bottlerocket terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSettings {
    pub cluster_name: String,
    pub api_server: String,
    /// Base64-encoded cluster CA bundle, as EKS's DescribeCluster returns it.
    pub cluster_certificate: String,
    pub cluster_dns_ip: Option<String>,
    pub max_pods: Option<u32>,
    pub node_labels: BTreeMap<String, String>,
    /// Taint key → entries `"value:Effect"` (value may be empty).
    pub node_taints: BTreeMap<String, Vec<String>>,
    pub sysctls: BTreeMap<String, String>,
    /// Free-form settings merged under `[settings]`; the explicit fields above win.
    pub extra: Table,
}

/// Renders Bottlerocket TOML user data and validates the result, so nothing invalid is ever launched.
pub fn render(settings: &NodeSettings) -> Result<String, UserDataError> {
    let mut kubernetes = Table::new();
    kubernetes.insert("cluster-name".into(), settings.cluster_name.clone().into());
    kubernetes.insert("api-server".into(), settings.api_server.clone().into());
    kubernetes.insert(
        "cluster-certificate".into(),
        settings.cluster_certificate.clone().into(),
    );
    if let Some(ip) = &settings.cluster_dns_ip {
        kubernetes.insert("cluster-dns-ip".into(), ip.clone().into());
    }
    if let Some(n) = settings.max_pods {
        kubernetes.insert("max-pods".into(), i64::from(n).into());
    }
    if !settings.node_labels.is_empty() {
        let labels: Table = settings
            .node_labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        kubernetes.insert("node-labels".into(), labels.into());
    }
    if !settings.node_taints.is_empty() {
        let taints: Table = settings
            .node_taints
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        kubernetes.insert("node-taints".into(), taints.into());
    }
    let mut explicit = Table::new();
    explicit.insert("kubernetes".into(), kubernetes.into());
    if !settings.sysctls.is_empty() {
        let sysctl: Table = settings
            .sysctls
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        let mut kernel = Table::new();
        kernel.insert("sysctl".into(), sysctl.into());
        explicit.insert("kernel".into(), kernel.into());
    }

    let mut merged = settings.extra.clone();
    merge_into(&mut merged, explicit);
    let mut doc = Table::new();
    doc.insert("settings".into(), merged.into());
    let text = toml::to_string(&doc).map_err(|e| UserDataError::Render(e.to_string()))?;
    validate(&text)?;
    Ok(text)
}

/// Base64 as EC2's UserData parameter expects it.
pub fn encode_base64(user_data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(user_data.as_bytes())
}

/// Deep merge: tables merge key by key, anything else in `over` replaces what is in `base`.
pub fn merge_into(base: &mut Table, over: Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => merge_into(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;

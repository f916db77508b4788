//! The cluster a running Bottlerocket node was told to join, read back from its user data.
//!
//! Karpenter's Bottlerocket bootstrap always writes `settings.kubernetes.cluster-name`, `api-server` and
//! `cluster-certificate` into the TOML user data of its nodes, over whatever the EC2NodeClass's user
//! data said (karpenter-provider-aws `pkg/providers/amifamily/bootstrap/bottlerocket.go`, `Script`), and
//! an EKS node group's launch template for Bottlerocket carries the same keys (Bottlerocket
//! QUICKSTART-EKS). So a replacement can join like the node it replaces without being told the cluster.

use super::error::UserDataError;
use super::validate::{read_settings, string, table};

/// What a node's user data says about its cluster; a key it does not set is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    pub cluster_name: Option<String>,
    pub api_server: Option<String>,
    /// Base64 CA bundle, as written.
    pub cluster_certificate: Option<String>,
}

/// Reads `settings.kubernetes.{cluster-name, api-server, cluster-certificate}` from raw (base64-decoded)
/// user data, plain or gzip TOML. Missing keys are `None`; user data that is not Bottlerocket TOML (an
/// Amazon Linux shell script or MIME document, say), or a key that is not a string, is an error naming it.
pub fn cluster_settings(raw: &[u8]) -> Result<ClusterSettings, UserDataError> {
    let settings = read_settings(raw)?;
    let Some(k8s) = settings.get("kubernetes") else {
        return Ok(ClusterSettings::default());
    };
    let k8s = table(k8s, "settings.kubernetes")?;
    let key = |name: &str| -> Result<Option<String>, UserDataError> {
        k8s.get(name)
            .map(|v| string(v, &format!("settings.kubernetes.{name}")).map(str::to_string))
            .transpose()
            // An empty value sets nothing (Bottlerocket treats it as unset too).
            .map(|v| v.filter(|s| !s.trim().is_empty()))
    };
    Ok(ClusterSettings {
        cluster_name: key("cluster-name")?,
        api_server: key("api-server")?,
        cluster_certificate: key("cluster-certificate")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// Shaped as Karpenter's `Script` writes it for a NodePool with one label and one taint.
    const KARPENTER: &str = r#"[settings]
[settings.kubernetes]
api-server = "https://ABC.gr7.us-west-2.eks.amazonaws.com"
cluster-certificate = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
cluster-name = "prod"

[settings.kubernetes.node-labels]
"karpenter.sh/nodepool" = "default"

[settings.kubernetes.node-taints]
"example.com/dedicated" = ["db:NoSchedule"]
"#;

    #[test]
    fn karpenters_user_data_names_the_cluster() {
        let c = cluster_settings(KARPENTER.as_bytes()).unwrap();
        assert_eq!(c.cluster_name.as_deref(), Some("prod"));
        assert_eq!(
            c.api_server.as_deref(),
            Some("https://ABC.gr7.us-west-2.eks.amazonaws.com")
        );
        assert_eq!(
            c.cluster_certificate.as_deref(),
            Some("LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==")
        );
    }

    #[test]
    fn gzip_user_data_is_read_too() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(KARPENTER.as_bytes()).unwrap();
        let c = cluster_settings(&gz.finish().unwrap()).unwrap();
        assert_eq!(c.cluster_name.as_deref(), Some("prod"));
    }

    #[test]
    fn missing_keys_are_none_and_empty_ones_too() {
        let c = cluster_settings(
            b"[settings.kubernetes]\ncluster-name = \"prod\"\napi-server = \"\"\n",
        )
        .unwrap();
        assert_eq!(
            c,
            ClusterSettings {
                cluster_name: Some("prod".into()),
                ..Default::default()
            }
        );
        assert_eq!(
            cluster_settings(b"[settings.host-containers.admin]\nenabled = true\n").unwrap(),
            ClusterSettings::default()
        );
    }

    #[test]
    fn user_data_that_is_not_bottlerocket_toml_is_an_error_naming_why() {
        let script = b"#!/bin/bash\n/etc/eks/bootstrap.sh prod\n";
        let e = cluster_settings(script).unwrap_err();
        assert!(matches!(e, UserDataError::Toml(_)), "{e}");
        assert!(e.to_string().contains("not valid TOML"), "{e}");
        let e = cluster_settings(b"[kubernetes]\ncluster-name = \"prod\"\n").unwrap_err();
        assert_eq!(e, UserDataError::MissingSettings);
        let e = cluster_settings(b"[settings]\nkubernetes = 3\n").unwrap_err();
        assert_eq!(e.path(), Some("settings.kubernetes"));
        let e = cluster_settings(b"[settings.kubernetes]\ncluster-name = 7\n").unwrap_err();
        assert_eq!(e.path(), Some("settings.kubernetes.cluster-name"));
        assert!(e.to_string().contains("not a string"), "{e}");
        assert_eq!(
            cluster_settings(&[0xff, 0xfe]).unwrap_err(),
            UserDataError::NotUtf8
        );
    }
}

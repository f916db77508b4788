//! Which Secret holds the credentials Velero uses for a BackupStorageLocation. Pure: the caller lists the
//! Velero namespace's Deployments and reads the Secret.
//!
//! Velero's order, which snapdrain follows:
//! 1. the BSL's `spec.credential` (Velero core writes that key to a file and passes it to the plugin as
//!    `credentialsFile`);
//! 2. otherwise the file named by `AWS_SHARED_CREDENTIALS_FILE` in the Velero server's container
//!    (velero-plugin-for-aws `config.go` `WithCredentialsFile`). Both `velero install` and the Helm chart
//!    set it to `/credentials/cloud` and mount a Secret volume named `cloud-credentials` there; the Helm
//!    chart names the Secret after the release (vmware-tanzu/helm-charts `velero/templates/_helpers.tpl`
//!    `velero.secretName`, `deployment.yaml`), so the Secret's name is read from the Deployment;
//! 3. no file at all (IRSA, EKS Pod Identity, `velero install --no-secret`): the AWS default chain, which
//!    for snapdrain means its own identity.
//!
//! `--velero-credentials-secret` replaces step 2 for installs snapdrain cannot read.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::api::velero::{BackupStorageLocation, SecretKeyRef};

/// The environment variable the AWS SDK (and so the plugin) reads the shared credentials file from.
pub const SHARED_CREDENTIALS_ENV: &str = "AWS_SHARED_CREDENTIALS_FILE";
/// The volume `velero install` and the Helm chart mount the credentials Secret as.
pub const CREDENTIALS_VOLUME: &str = "cloud-credentials";
/// The file (Secret key) in that volume.
pub const CREDENTIALS_KEY: &str = "cloud";

/// Where the credentials Secret was found, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialOrigin {
    /// The BSL's `spec.credential`.
    Location,
    /// snapdrain's `--velero-credentials-secret`.
    Override,
    /// Mounted by the Velero server Deployment of this name.
    Deployment(String),
}

impl std::fmt::Display for CredentialOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Location => f.write_str("spec.credential of the location"),
            Self::Override => f.write_str("snapdrain's --velero-credentials-secret"),
            Self::Deployment(d) => write!(f, "mounted by the Velero Deployment {d}"),
        }
    }
}

/// A credentials Secret key and why it is the one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialSecret {
    pub secret: SecretKeyRef,
    pub origin: CredentialOrigin,
}

/// `name` or `name/key` (key `cloud` by default), as `--velero-credentials-secret` takes it.
pub fn parse_override(value: &str) -> Result<SecretKeyRef, String> {
    let (name, key) = match value.split_once('/') {
        Some((n, k)) => (n.trim(), k.trim()),
        None => (value.trim(), CREDENTIALS_KEY),
    };
    if name.is_empty() || key.is_empty() || key.contains('/') {
        return Err(format!(
            "--velero-credentials-secret {value:?} is not NAME or NAME/KEY (a Secret in the Velero namespace and its key)"
        ));
    }
    Ok(SecretKeyRef {
        name: name.to_owned(),
        key: key.to_owned(),
    })
}

/// The credentials Secret for `bsl`, or None when Velero runs without one (its ambient AWS identity).
pub fn credential_secret(
    bsl: &BackupStorageLocation,
    override_: Option<&SecretKeyRef>,
    deployments: &[Deployment],
) -> Option<CredentialSecret> {
    if let Some(c) = &bsl.spec.credential {
        return Some(CredentialSecret {
            secret: c.clone(),
            origin: CredentialOrigin::Location,
        });
    }
    if let Some(o) = override_ {
        return Some(CredentialSecret {
            secret: o.clone(),
            origin: CredentialOrigin::Override,
        });
    }
    mounted_credentials(deployments).map(|(deployment, secret)| CredentialSecret {
        secret,
        origin: CredentialOrigin::Deployment(deployment),
    })
}

/// The Secret key the Velero server reads its credentials file from, with the Deployment's name. The
/// server is the Deployment with a container named `velero` (both installers name it so), or else any
/// container setting `AWS_SHARED_CREDENTIALS_FILE`; Deployments named `velero` are looked at first.
pub fn mounted_credentials(deployments: &[Deployment]) -> Option<(String, SecretKeyRef)> {
    let mut ordered: Vec<&Deployment> = deployments.iter().collect();
    ordered.sort_by_key(|d| {
        let name = d.metadata.name.clone().unwrap_or_default();
        (name != "velero", name)
    });
    ordered.into_iter().find_map(|d| {
        let pod = d.spec.as_ref()?.template.spec.as_ref()?;
        let name = d.metadata.name.clone().unwrap_or_default();
        let mut containers: Vec<&Container> = pod.containers.iter().collect();
        containers.sort_by_key(|c| c.name != "velero");
        containers
            .into_iter()
            .find_map(|c| container_credentials(pod, c))
            .map(|s| (name, s))
    })
}

fn container_credentials(pod: &PodSpec, c: &Container) -> Option<SecretKeyRef> {
    let path = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == SHARED_CREDENTIALS_ENV)?
        .value
        .clone()?;
    container_file(pod, c, &path)
}

/// The Secret key behind file `path` in the Velero server container (a Secret volume mounted over it),
/// e.g. the `customerKeyEncryptionFile` of a location.
pub fn mounted_file(deployments: &[Deployment], path: &str) -> Option<SecretKeyRef> {
    let mut ordered: Vec<&Deployment> = deployments.iter().collect();
    ordered.sort_by_key(|d| d.metadata.name.as_deref() != Some("velero"));
    ordered.into_iter().find_map(|d| {
        let pod = d.spec.as_ref()?.template.spec.as_ref()?;
        pod.containers
            .iter()
            .filter(|c| c.name == "velero")
            .find_map(|c| container_file(pod, c, path))
    })
}

fn container_file(pod: &PodSpec, c: &Container, path: &str) -> Option<SecretKeyRef> {
    let (mount, rel) = c.volume_mounts.iter().flatten().find_map(|m| {
        let dir = m.mount_path.trim_end_matches('/');
        let rel = path.strip_prefix(dir)?.strip_prefix('/')?;
        Some((m, rel))
    })?;
    // A subPath mount would name one file of the volume; the installers never use it.
    let source = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)?
        .secret
        .as_ref()?;
    let key = match &source.items {
        Some(items) => items.iter().find(|i| i.path == rel)?.key.clone(),
        None => rel.to_owned(),
    };
    Some(SecretKeyRef {
        name: source.secret_name.clone()?,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(name: &str, secret: Option<&str>) -> Deployment {
        let mut d = json!({
            "metadata": {"name": name, "namespace": "velero"},
            "spec": {"selector": {}, "template": {"spec": {
                "containers": [{"name": "velero", "image": "velero/velero:v1.18.2",
                                "env": [{"name": "VELERO_NAMESPACE", "value": "velero"}],
                                "volumeMounts": [{"name": "plugins", "mountPath": "/plugins"}]}],
                "volumes": [{"name": "plugins", "emptyDir": {}}]}}}
        });
        if let Some(s) = secret {
            let c = &mut d["spec"]["template"]["spec"]["containers"][0];
            c["env"].as_array_mut().expect("env is an array").push(
                json!({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/credentials/cloud"}),
            );
            c["volumeMounts"]
                .as_array_mut()
                .expect("mounts are an array")
                .push(json!({"name": "cloud-credentials", "mountPath": "/credentials"}));
            d["spec"]["template"]["spec"]["volumes"]
                .as_array_mut()
                .expect("volumes are an array")
                .push(json!({"name": "cloud-credentials", "secret": {"secretName": s}}));
        }
        serde_json::from_value(d).expect("deployment")
    }

    fn bsl(credential: Option<serde_json::Value>) -> BackupStorageLocation {
        let mut b = json!({"metadata": {"name": "default", "namespace": "velero"},
                           "spec": {"provider": "aws", "objectStorage": {"bucket": "b"}}});
        if let Some(c) = credential {
            b["spec"]["credential"] = c;
        }
        serde_json::from_value(b).expect("bsl")
    }

    fn key(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn helm_release_secret_is_read_from_the_deployment() {
        let found = credential_secret(&bsl(None), None, &[deployment("velero", Some("velero"))]);
        assert_eq!(
            found,
            Some(CredentialSecret {
                secret: key("velero", "cloud"),
                origin: CredentialOrigin::Deployment("velero".into())
            })
        );
        let cli = mounted_credentials(&[deployment("velero", Some("cloud-credentials"))]);
        assert_eq!(
            cli,
            Some(("velero".into(), key("cloud-credentials", "cloud")))
        );
    }

    #[test]
    fn no_secret_means_the_ambient_identity() {
        assert_eq!(
            credential_secret(&bsl(None), None, &[deployment("velero", None)]),
            None
        );
        assert_eq!(credential_secret(&bsl(None), None, &[]), None);
    }

    #[test]
    fn location_credential_then_override_win() {
        let deps = [deployment("velero", Some("velero"))];
        let b = bsl(Some(json!({"name": "per-bsl", "key": "aws"})));
        let o = key("mine", "cloud");
        assert_eq!(
            credential_secret(&b, Some(&o), &deps).map(|c| (c.secret, c.origin)),
            Some((key("per-bsl", "aws"), CredentialOrigin::Location))
        );
        assert_eq!(
            credential_secret(&bsl(None), Some(&o), &deps).map(|c| c.origin),
            Some(CredentialOrigin::Override)
        );
    }

    #[test]
    fn items_remap_the_file_to_its_key() {
        let mut d = deployment("my-velero", Some("s"));
        let vols = d
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|p| p.volumes.as_mut())
            .expect("volumes");
        vols[1].secret.as_mut().expect("secret volume").items =
            Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                key: "aws-ini".into(),
                path: "cloud".into(),
                mode: None,
            }]);
        assert_eq!(
            mounted_credentials(&[deployment("other", None), d]),
            Some(("my-velero".into(), key("s", "aws-ini")))
        );
    }

    #[test]
    fn override_syntax() {
        assert_eq!(parse_override("velero"), Ok(key("velero", "cloud")));
        assert_eq!(parse_override("creds/aws"), Ok(key("creds", "aws")));
        for bad in ["", "/k", "n/", "a/b/c"] {
            assert!(parse_override(bad).is_err(), "{bad:?}");
        }
    }
}

//! Keeps the webhook's certificates in a Secret, serves the one stored there, renews it when due, and
//! patches the ValidatingWebhookConfiguration's caBundle to the CAs that must be trusted.
//!
//! Every replica runs a keeper. Any of them may renew: a Secret is created only if absent (409: another
//! replica won, read its bundle) and replaced only at the resourceVersion read (409: another replica
//! renewed first, serve its bundle). So two replicas never both rotate, and all converge on one bundle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::certs::{self, Bundle, Issued, Lifetimes};
use super::error::CertError;
use super::server::CertSlot;
use crate::telemetry::Metrics;

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const PREVIOUS_CA: &str = "ca-previous.crt";
const NEXT_CA_CERT: &str = "ca-next.crt";
const NEXT_CA_KEY: &str = "ca-next.key";
/// Validity times, kept as annotations because rcgen issues certificates but does not parse them.
const CA_NOT_BEFORE: &str = "snapdrain.io/ca-not-before";
const CA_NOT_AFTER: &str = "snapdrain.io/ca-not-after";
const CERT_NOT_BEFORE: &str = "snapdrain.io/cert-not-before";
const CERT_NOT_AFTER: &str = "snapdrain.io/cert-not-after";
const PREVIOUS_CA_NOT_AFTER: &str = "snapdrain.io/ca-previous-not-after";
const NEXT_CA_NOT_BEFORE: &str = "snapdrain.io/ca-next-not-before";
const NEXT_CA_NOT_AFTER: &str = "snapdrain.io/ca-next-not-after";

/// Where the certificates live and whom they are for.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    pub namespace: String,
    pub secret: String,
    pub service: String,
    /// The ValidatingWebhookConfiguration whose caBundle is kept.
    pub configuration: String,
    pub lifetimes: Lifetimes,
    /// How often the Secret is read again, to pick up another replica's renewal.
    pub resync: Duration,
}

pub struct Keeper {
    client: Client,
    config: KeeperConfig,
    slot: Arc<CertSlot>,
    metrics: Metrics,
}

impl Keeper {
    pub fn new(
        client: Client,
        config: KeeperConfig,
        slot: Arc<CertSlot>,
        metrics: Metrics,
    ) -> Self {
        Self {
            client,
            config,
            slot,
            metrics,
        }
    }

    /// How long a next CA is trusted before it signs: two resyncs, so every replica has read the
    /// Secret (and confirmed the caBundle) in between.
    fn promote_after(&self) -> Duration {
        self.config.resync * 2
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn secret_error(&self, action: &'static str, source: kube::Error) -> CertError {
        CertError::Secret {
            action,
            namespace: self.config.namespace.clone(),
            name: self.config.secret.clone(),
            source,
        }
    }

    /// One pass: the stored bundle (made or renewed if needed) is served and trusted. Returns when the
    /// next pass is due.
    pub async fn sync(&self) -> Result<jiff::Timestamp, CertError> {
        let now = jiff::Timestamp::now();
        let names = certs::service_names(&self.config.service, &self.config.namespace);
        let api = self.secrets();
        let stored = api
            .get_opt(&self.config.secret)
            .await
            .map_err(|e| self.secret_error("read", e))?;
        let bundle = match stored {
            None => {
                let fresh = certs::renew(
                    None,
                    &names,
                    self.config.lifetimes,
                    self.promote_after(),
                    now,
                )?
                .ok_or_else(|| self.bad("*", "nothing issued".into()))?;
                let secret = self.bundle_secret(&fresh, None);
                match api.create(&PostParams::default(), &secret).await {
                    Ok(_) => {
                        tracing::info!(secret = %self.config.secret, "eviction gate: issued its CA and certificate");
                        fresh
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => self.read_winner().await?,
                    Err(e) => return Err(self.secret_error("create", e)),
                }
            }
            Some(secret) => {
                let current = self.read_bundle(&secret)?;
                match certs::renew(
                    Some(&current),
                    &names,
                    self.config.lifetimes,
                    self.promote_after(),
                    now,
                )? {
                    None => current,
                    Some(renewed) => {
                        let replacement = self.bundle_secret(&renewed, secret.resource_version());
                        match api
                            .replace(&self.config.secret, &PostParams::default(), &replacement)
                            .await
                        {
                            Ok(_) => {
                                tracing::info!(secret = %self.config.secret, "eviction gate: renewed its certificates");
                                renewed
                            }
                            Err(kube::Error::Api(s)) if s.code == 409 => self.read_winner().await?,
                            Err(e) => return Err(self.secret_error("update", e)),
                        }
                    }
                }
            }
        };
        // Trust first, then serve: a certificate is never served before its CA is in the caBundle.
        self.trust(&certs::ca_bundle(&bundle, now)).await?;
        self.slot
            .install(&bundle.serving.cert_pem, &bundle.serving.key_pem)?;
        self.metrics
            .set_certificate_expiry(bundle.serving.not_after, bundle.ca.not_after);
        Ok(certs::next_due(&bundle, self.promote_after()))
    }

    /// Another replica wrote first: its bundle is the one.
    async fn read_winner(&self) -> Result<Bundle, CertError> {
        let secret = self
            .secrets()
            .get(&self.config.secret)
            .await
            .map_err(|e| self.secret_error("read", e))?;
        self.read_bundle(&secret)
    }

    /// Sets `clientConfig.caBundle` of every webhook in the configuration to `pem` (when different).
    /// A configuration that does not exist yet is not an error: the next pass tries again.
    async fn trust(&self, pem: &str) -> Result<(), CertError> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let fail = |source| CertError::CaBundle {
            name: self.config.configuration.clone(),
            source,
        };
        let Some(vwc) = api
            .get_opt(&self.config.configuration)
            .await
            .map_err(fail)?
        else {
            tracing::debug!(configuration = %self.config.configuration, "no ValidatingWebhookConfiguration to patch yet");
            return Ok(());
        };
        let want = ByteString(pem.as_bytes().to_vec());
        let Some(ops) = ca_bundle_patch(&vwc, &want) else {
            return Ok(());
        };
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
            .map_err(|e| CertError::Patch(e.to_string()))?;
        api.patch(
            &self.config.configuration,
            &PatchParams::default(),
            &Patch::<Value>::Json(patch),
        )
        .await
        .map_err(fail)?;
        tracing::info!(configuration = %self.config.configuration, "eviction gate: caBundle updated");
        Ok(())
    }

    fn bad(&self, key: &'static str, problem: String) -> CertError {
        CertError::BadSecret {
            namespace: self.config.namespace.clone(),
            name: self.config.secret.clone(),
            key,
            problem,
        }
    }

    fn bundle_secret(&self, b: &Bundle, resource_version: Option<String>) -> Secret {
        let mut data = BTreeMap::from([
            (
                CA_CERT.to_owned(),
                ByteString(b.ca.cert_pem.clone().into_bytes()),
            ),
            (
                CA_KEY.to_owned(),
                ByteString(b.ca.key_pem.clone().into_bytes()),
            ),
            (
                TLS_CERT.to_owned(),
                ByteString(b.serving.cert_pem.clone().into_bytes()),
            ),
            (
                TLS_KEY.to_owned(),
                ByteString(b.serving.key_pem.clone().into_bytes()),
            ),
        ]);
        let mut annotations = BTreeMap::from([
            (CA_NOT_BEFORE.to_owned(), b.ca.not_before.to_string()),
            (CA_NOT_AFTER.to_owned(), b.ca.not_after.to_string()),
            (CERT_NOT_BEFORE.to_owned(), b.serving.not_before.to_string()),
            (CERT_NOT_AFTER.to_owned(), b.serving.not_after.to_string()),
        ]);
        if let Some((pem, expires)) = &b.previous_ca {
            data.insert(PREVIOUS_CA.to_owned(), ByteString(pem.clone().into_bytes()));
            annotations.insert(PREVIOUS_CA_NOT_AFTER.to_owned(), expires.to_string());
        }
        if let Some(next) = &b.next_ca {
            data.insert(
                NEXT_CA_CERT.to_owned(),
                ByteString(next.cert_pem.clone().into_bytes()),
            );
            data.insert(
                NEXT_CA_KEY.to_owned(),
                ByteString(next.key_pem.clone().into_bytes()),
            );
            annotations.insert(NEXT_CA_NOT_BEFORE.to_owned(), next.not_before.to_string());
            annotations.insert(NEXT_CA_NOT_AFTER.to_owned(), next.not_after.to_string());
        }
        Secret {
            metadata: ObjectMeta {
                name: Some(self.config.secret.clone()),
                namespace: Some(self.config.namespace.clone()),
                resource_version,
                annotations: Some(annotations),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "snapdrain".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Secret::default()
        }
    }

    fn read_bundle(&self, s: &Secret) -> Result<Bundle, CertError> {
        let empty = BTreeMap::new();
        let data = s.data.as_ref().unwrap_or(&empty);
        let text = |key: &'static str| {
            data.get(key)
                .ok_or_else(|| self.bad(key, "missing".into()))
                .and_then(|v| {
                    String::from_utf8(v.0.clone())
                        .map_err(|_| self.bad(key, "not UTF-8 PEM".into()))
                })
        };
        let annotations = s.annotations();
        let time = |key: &'static str| {
            annotations
                .get(key)
                .ok_or_else(|| self.bad(key, "annotation missing".into()))
                .and_then(|v| {
                    v.parse::<jiff::Timestamp>()
                        .map_err(|e| self.bad(key, format!("not a timestamp: {e}")))
                })
        };
        let previous_ca = match (
            data.get(PREVIOUS_CA),
            annotations.get(PREVIOUS_CA_NOT_AFTER),
        ) {
            (Some(_), Some(_)) => Some((text(PREVIOUS_CA)?, time(PREVIOUS_CA_NOT_AFTER)?)),
            _ => None,
        };
        let next_ca = match data.get(NEXT_CA_CERT) {
            Some(_) => Some(Issued {
                cert_pem: text(NEXT_CA_CERT)?,
                key_pem: text(NEXT_CA_KEY)?,
                not_before: time(NEXT_CA_NOT_BEFORE)?,
                not_after: time(NEXT_CA_NOT_AFTER)?,
            }),
            None => None,
        };
        Ok(Bundle {
            ca: Issued {
                cert_pem: text(CA_CERT)?,
                key_pem: text(CA_KEY)?,
                not_before: time(CA_NOT_BEFORE)?,
                not_after: time(CA_NOT_AFTER)?,
            },
            serving: Issued {
                cert_pem: text(TLS_CERT)?,
                key_pem: text(TLS_KEY)?,
                not_before: time(CERT_NOT_BEFORE)?,
                not_after: time(CERT_NOT_AFTER)?,
            },
            previous_ca,
            next_ca,
        })
    }

    /// Syncs now and then for ever: at the next due time, or every `resync` to pick up another
    /// replica's renewal; after an error, again a little later.
    pub async fn run(self) {
        loop {
            let wait = match self.sync().await {
                Ok(next) => {
                    let until_due = (next - jiff::Timestamp::now()).get_milliseconds().max(0);
                    Duration::from_millis(u64::try_from(until_due).unwrap_or(0))
                        .min(self.config.resync)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "eviction gate: certificate sync failed");
                    self.config.resync.min(Duration::from_secs(5))
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The JSON Patch setting every webhook's caBundle to `want`, or None when all have it. The `test` of
/// the resourceVersion makes a concurrent edit fail the patch instead of being overwritten.
fn ca_bundle_patch(vwc: &ValidatingWebhookConfiguration, want: &ByteString) -> Option<Vec<Value>> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(&want.0);
    let mut ops = Vec::new();
    for (i, hook) in vwc.webhooks.iter().flatten().enumerate() {
        if hook.client_config.ca_bundle.as_ref() != Some(want) {
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
        }
    }
    if ops.is_empty() {
        return None;
    }
    if let Some(rv) = vwc.resource_version() {
        ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
        );
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vwc(bundles: &[Option<&str>]) -> ValidatingWebhookConfiguration {
        let hooks: Vec<Value> = bundles
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut cc = json!({"service": {"namespace": "ops", "name": "snapdrain"}});
                if let Some(b) = b {
                    cc["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(b));
                }
                json!({"name": format!("h{i}.snapdrain.io"), "clientConfig": cc,
                    "sideEffects": "NoneOnDryRun", "admissionReviewVersions": ["v1"]})
            })
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": "snapdrain", "resourceVersion": "7"},
            "webhooks": hooks}),
        )
        .expect("a configuration from JSON")
    }

    #[test]
    fn only_webhooks_with_another_ca_bundle_are_patched() {
        let want = ByteString(b"PEM".to_vec());
        assert!(ca_bundle_patch(&vwc(&[Some("PEM")]), &want).is_none());
        let ops = ca_bundle_patch(&vwc(&[Some("PEM"), None, Some("OLD")]), &want)
            .expect("two webhooks differ");
        assert_eq!(
            Value::Array(ops),
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "UEVN"},
                {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "UEVN"},
            ])
        );
    }
}

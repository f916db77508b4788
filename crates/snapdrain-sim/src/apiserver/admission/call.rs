//! Calling a webhook over HTTPS, trusting only its `clientConfig.caBundle`.
//!
//! A `clientConfig.service` cannot be reached through cluster DNS in the simulator. The Service object is
//! looked up instead and the connection goes to its annotation `sim.snapdrain.io/address: "IP:PORT"`, or
//! else to `spec.clusterIP` and the referenced port. Either way the certificate is verified against the
//! name the real server would use, `<service>.<namespace>.svc`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use super::super::meta::meta_str;
use super::super::resources::ResKey;
use super::super::store::Store;

/// The annotation on a Service naming the loopback address its webhook listens on.
pub const ADDRESS_ANNOTATION: &str = "sim.snapdrain.io/address";

/// Where to send a webhook's requests.
#[derive(Debug, PartialEq)]
pub struct Endpoint {
    pub url: String,
    /// The service host name and the address it stands for.
    pub resolve: Option<(String, SocketAddr)>,
}

pub fn endpoint(store: &Store, client_config: &Value) -> Result<Endpoint, String> {
    if let Some(url) = client_config.get("url").and_then(Value::as_str) {
        return Ok(Endpoint {
            url: url.to_string(),
            resolve: None,
        });
    }
    let svc = client_config
        .get("service")
        .ok_or("webhook has neither clientConfig.url nor clientConfig.service")?;
    let field = |f: &str| svc.get(f).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (field("namespace"), field("name"));
    let path = field("path");
    let port = svc.get("port").and_then(Value::as_i64).unwrap_or(443);
    let service = store
        .get(&ResKey::core("services"), Some(ns), name)
        .ok_or_else(|| format!("services \"{name}\" not found"))?;
    let annotated = service
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ADDRESS_ANNOTATION))
        .and_then(Value::as_str);
    let addr: SocketAddr = match annotated {
        Some(a) => a.parse().map_err(|_| {
            format!("service {ns}/{name}: annotation {ADDRESS_ANNOTATION}={a:?} is not IP:PORT")
        })?,
        None => {
            let ip = service
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .filter(|ip| !ip.is_empty() && *ip != "None")
                .ok_or_else(|| format!("service {ns}/{name} has no cluster IP and no {ADDRESS_ANNOTATION} annotation"))?;
            let ip = ip
                .parse()
                .map_err(|_| format!("service {ns}/{name}: invalid cluster IP {ip:?}"))?;
            SocketAddr::new(
                ip,
                u16::try_from(port).map_err(|_| format!("invalid port {port}"))?,
            )
        }
    };
    let host = format!("{}.{}.svc", meta_str(&service, "name").unwrap_or(name), ns);
    // The URL carries the real port: a resolver override only maps the host name.
    let path = if path.is_empty() || path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok(Endpoint {
        url: format!("https://{host}:{}{path}", addr.port()),
        resolve: Some((host, addr)),
    })
}

/// HTTPS clients by trust and name mapping, so that connections are reused between requests.
#[derive(Default)]
pub struct Clients {
    cache: Mutex<HashMap<String, reqwest::Client>>,
}

impl Clients {
    fn client(
        &self,
        ca_bundle: &str,
        resolve: &Option<(String, SocketAddr)>,
    ) -> Result<reqwest::Client, String> {
        let key = format!("{ca_bundle}|{resolve:?}");
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(c.clone());
        }
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .no_proxy();
        if !ca_bundle.is_empty() {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(ca_bundle.trim())
                .map_err(|e| format!("clientConfig.caBundle is not base64: {e}"))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("clientConfig.caBundle is not PEM: {e}"))?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if let Some((host, addr)) = resolve {
            builder = builder.resolve(host, *addr);
        }
        let client = builder
            .build()
            .map_err(|e| format!("building the HTTPS client: {e}"))?;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, client.clone());
        Ok(client)
    }

    /// POSTs the AdmissionReview and returns the decoded answer, or why the call failed.
    pub async fn post(
        &self,
        endpoint: &Endpoint,
        ca_bundle: &str,
        timeout: Duration,
        review: &Value,
    ) -> Result<Value, String> {
        self.try_post(endpoint, ca_bundle, timeout, review)
            .await
            .map_err(|e| format!("failed to call webhook: {e}"))
    }

    async fn try_post(
        &self,
        endpoint: &Endpoint,
        ca_bundle: &str,
        timeout: Duration,
        review: &Value,
    ) -> Result<Value, String> {
        let client = self.client(ca_bundle, &endpoint.resolve)?;
        // kube-apiserver tells the webhook its deadline the same way.
        let sep = if endpoint.url.contains('?') { '&' } else { '?' };
        let url = format!("{}{sep}timeout={}s", endpoint.url, timeout.as_secs());
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                format!("Post \"{url}\": context deadline exceeded")
            } else {
                format!("Post \"{url}\": {}", error_chain(&e))
            }
        };
        let resp = client
            .post(&url)
            .timeout(timeout)
            .header("accept", "application/json, */*")
            .json(review)
            .send()
            .await
            .map_err(failed)?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(failed)?;
        if !status.is_success() {
            return Err(format!(
                "the server responded with status {}: {}",
                status.as_u16(),
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ));
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("failed to decode the webhook response: {e}"))
    }
}

/// The innermost causes of an error, which say what went wrong (refused, certificate unknown, ...).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::store::WriteOptions;
    use serde_json::json;

    #[test]
    fn service_reference_maps_to_annotated_address() {
        let store = Store::new();
        store
            .create(
                &ResKey::core("namespaces"),
                None,
                json!({"metadata": {"name": "gate"}}),
                WriteOptions::default(),
            )
            .unwrap();
        store
            .create(
                &ResKey::core("services"),
                Some("gate"),
                json!({"metadata": {"name": "hook", "annotations": {ADDRESS_ANNOTATION: "127.0.0.1:4443"}},
                    "spec": {"ports": [{"port": 443}]}}),
                WriteOptions::default(),
            )
            .unwrap();
        let cc = json!({"service": {"namespace": "gate", "name": "hook", "path": "/validate"}});
        let ep = endpoint(&store, &cc).unwrap();
        assert_eq!(ep.url, "https://hook.gate.svc:4443/validate");
        assert_eq!(
            ep.resolve,
            Some(("hook.gate.svc".into(), "127.0.0.1:4443".parse().unwrap()))
        );
        let missing = json!({"service": {"namespace": "gate", "name": "nope"}});
        assert!(
            endpoint(&store, &missing)
                .unwrap_err()
                .contains("not found")
        );
    }
}

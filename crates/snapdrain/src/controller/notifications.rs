//! The notification webhook's URL, as the leader's policy follower resolves it: the policy's plain `url`,
//! or the value of the Secret key its `urlSecretRef` names in snapdrain's own namespace (a chat or paging
//! webhook's URL is its credential, and the policy is readable cluster-wide: security review M-5). The
//! Secret is read by `get` only (the chart's Role names it in `resourceNames`), again every
//! [`Settings::notification_url_recheck`](super::Settings) so a rotated URL is picked up. Whatever is
//! wrong (no Secret, no key, a URL the checks refuse) is the policy's `NotificationsReady` condition,
//! never a crash; the URL passes the same checks as a plain one (`telemetry::notify::check_url`).

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;

use crate::api::policy::{
    DEFAULT_POLICY, DisruptionPolicy, DisruptionPolicySpec, WebhookNotification, condition,
};
use crate::telemetry::Notifier;
use crate::telemetry::notify::{Endpoint, check_url};

/// Why the webhook has no usable URL. Messages name the Secret and key, never the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlSourceError {
    #[error(
        "Secret {namespace}/{name} named by notifications.webhook.urlSecretRef does not exist: create it with the webhook URL under key {key}"
    )]
    SecretNotFound {
        namespace: String,
        name: String,
        key: String,
    },
    #[error(
        "Secret {namespace}/{name} has no key {key} (its keys: {keys}): put the webhook URL under {key}, or fix notifications.webhook.urlSecretRef.key"
    )]
    KeyNotFound {
        namespace: String,
        name: String,
        key: String,
        keys: String,
    },
    #[error(
        "Secret {namespace}/{name} cannot be read: {reason} (snapdrain reads it by name: list it in the chart's notifications.urlSecretNames)"
    )]
    Unreadable {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("the notification webhook URL {source_of_url} is refused: {why}")]
    Refused { source_of_url: String, why: String },
}

impl UrlSourceError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretNotFound { .. } => condition::SECRET_NOT_FOUND,
            Self::KeyNotFound { .. } => condition::SECRET_KEY_NOT_FOUND,
            Self::Unreadable { .. } => condition::SECRET_UNREADABLE,
            Self::Refused { .. } => condition::URL_REFUSED,
        }
    }
}

/// What a read of the Secret gave: the object, none (404), or why it could not be read.
pub type SecretRead<'a> = Result<Option<&'a Secret>, String>;

/// The endpoint `webhook` sends to, from its plain URL or from `secret` (what reading its
/// `urlSecretRef` in `namespace` gave; ignored for a plain URL). Pure.
pub fn endpoint(
    webhook: &WebhookNotification,
    namespace: &str,
    secret: SecretRead<'_>,
) -> Result<Endpoint, UrlSourceError> {
    let (url, source_of_url) = match (&webhook.url, &webhook.url_secret_ref) {
        (Some(url), _) => (url.clone(), "notifications.webhook.url".to_owned()),
        (None, Some(r)) => {
            let (namespace, name, key) = (namespace.to_owned(), r.name.clone(), r.key.clone());
            let secret = match secret {
                Ok(Some(s)) => s,
                Ok(None) => {
                    return Err(UrlSourceError::SecretNotFound {
                        namespace,
                        name,
                        key,
                    });
                }
                Err(reason) => {
                    return Err(UrlSourceError::Unreadable {
                        namespace,
                        name,
                        reason,
                    });
                }
            };
            let data = secret.data.as_ref();
            let Some(ByteString(bytes)) = data.and_then(|d| d.get(&key)) else {
                let keys: Vec<&str> = data
                    .into_iter()
                    .flat_map(|d| d.keys().map(String::as_str))
                    .collect();
                return Err(UrlSourceError::KeyNotFound {
                    namespace,
                    name,
                    key,
                    keys: if keys.is_empty() {
                        "none".into()
                    } else {
                        keys.join(", ")
                    },
                });
            };
            // `kubectl create secret --from-file` keeps the file's final newline.
            let url = String::from_utf8_lossy(bytes).trim().to_owned();
            (url, format!("in Secret {namespace}/{name} key {key}"))
        }
        (None, None) => {
            return Err(UrlSourceError::Refused {
                source_of_url: "notifications.webhook".into(),
                why: "neither url nor urlSecretRef is set".into(),
            });
        }
    };
    let endpoint = Endpoint::new(webhook, &url);
    check_url(&endpoint).map_err(|why| UrlSourceError::Refused { source_of_url, why })?;
    Ok(endpoint)
}

/// The policy's `NotificationsReady` condition for `resolved` (None: no webhook, no condition).
pub fn condition_for(
    resolved: Option<&Result<Endpoint, UrlSourceError>>,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Option<Condition> {
    let (status, reason, message) = match resolved? {
        Ok(e) => (
            "True",
            condition::URL_RESOLVED,
            format!(
                "notifications go to {}",
                crate::telemetry::notify::redacted(&e.url)
            ),
        ),
        Err(e) => ("False", e.reason(), e.to_string()),
    };
    Some(Condition {
        type_: condition::NOTIFICATIONS_READY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(now),
    })
}

/// Reads what `webhook` needs and resolves it.
async fn resolve(
    client: &Client,
    namespace: &str,
    webhook: &WebhookNotification,
) -> Result<Endpoint, UrlSourceError> {
    let Some(r) = webhook
        .url_secret_ref
        .as_ref()
        .filter(|_| webhook.url.is_none())
    else {
        return endpoint(webhook, namespace, Ok(None));
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets.get_opt(&r.name).await {
        Ok(secret) => endpoint(webhook, namespace, Ok(secret.as_ref())),
        Err(e) => endpoint(webhook, namespace, Err(e.to_string())),
    }
}

/// Keeps `notifier` at the followed policy's webhook, its URL resolved in `namespace`, and the policy's
/// `NotificationsReady` condition at what the last resolution found. A Secret that cannot be read for
/// the moment (an API error) keeps the last URL; one that is gone, or has no usable URL, stops the
/// notifications until it is fixed.
pub async fn follow(
    client: Client,
    namespace: String,
    notifier: Notifier,
    mut policy: watch::Receiver<DisruptionPolicySpec>,
    recheck: Duration,
) {
    let mut reported: Option<(String, String, String)> = None;
    loop {
        let webhook = policy.borrow_and_update().notifications.webhook.clone();
        let resolved = match &webhook {
            Some(w) => Some(resolve(&client, &namespace, w).await),
            None => None,
        };
        match &resolved {
            None => notifier.configure(None),
            Some(Ok(e)) => notifier.configure(Some(e.clone())),
            Some(Err(UrlSourceError::Unreadable { .. })) => {}
            Some(Err(_)) => notifier.configure(None),
        }
        report(&client, resolved.as_ref(), &mut reported).await;
        tokio::select! {
            changed = policy.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(recheck) => {}
        }
    }
}

/// Writes the condition when it differs from the one last written (nothing when no webhook was ever
/// configured).
async fn report(
    client: &Client,
    resolved: Option<&Result<Endpoint, UrlSourceError>>,
    reported: &mut Option<(String, String, String)>,
) {
    let api: Api<DisruptionPolicy> = Api::all(client.clone());
    let cond = condition_for(resolved, None, jiff::Timestamp::now());
    let key = cond
        .as_ref()
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    if key == *reported {
        return;
    }
    if let Some(Err(e)) = resolved {
        tracing::warn!(error = %e, "notification webhook not usable");
    }
    // The conditions list is the controller's alone: a merge patch replaces it whole.
    let conditions: Vec<Condition> = cond.into_iter().collect();
    let patch = serde_json::json!({"status": {"conditions": conditions}});
    match api
        .patch_status(
            DEFAULT_POLICY,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => *reported = key,
        Err(e) => {
            tracing::debug!(error = %e, "cannot write the DisruptionPolicy's NotificationsReady condition")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::policy::UrlSecretRef;

    fn by_ref(name: &str, key: &str) -> WebhookNotification {
        WebhookNotification {
            url: None,
            url_secret_ref: Some(UrlSecretRef {
                name: name.into(),
                key: key.into(),
            }),
            reasons: vec![],
            retries: 5,
            allow_insecure_http: false,
            allow_private_addresses: false,
        }
    }

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn the_url_comes_from_the_secret_key_trimmed_and_still_checked() {
        let w = by_ref("hook", "url");
        let s = secret(&[("url", "https://hooks.example/T/B/secret\n")]);
        let e = endpoint(&w, "snapdrain", Ok(Some(&s))).expect("resolved");
        assert_eq!(e.url, "https://hooks.example/T/B/secret");
        assert!(!format!("{e:?}").contains("secret"), "{e:?}");

        let private = secret(&[("url", "https://169.254.169.254/latest")]);
        let refused = endpoint(&w, "snapdrain", Ok(Some(&private))).expect_err("private");
        assert_eq!(refused.reason(), condition::URL_REFUSED);
        assert!(
            refused.to_string().contains("allowPrivateAddresses")
                && refused
                    .to_string()
                    .contains("Secret snapdrain/hook key url"),
            "{refused}"
        );
    }

    #[test]
    fn a_missing_secret_or_key_is_a_reason_naming_them_never_the_value() {
        let w = by_ref("hook", "url");
        let missing = endpoint(&w, "snapdrain", Ok(None)).expect_err("no Secret");
        assert_eq!(missing.reason(), condition::SECRET_NOT_FOUND);
        assert!(missing.to_string().contains("snapdrain/hook"), "{missing}");

        let s = secret(&[("other", "https://hooks.example/T/B/secret")]);
        let no_key = endpoint(&w, "snapdrain", Ok(Some(&s))).expect_err("no key");
        assert_eq!(no_key.reason(), condition::SECRET_KEY_NOT_FOUND);
        assert!(no_key.to_string().contains("its keys: other"), "{no_key}");
        assert!(!no_key.to_string().contains("T/B/secret"), "{no_key}");

        let forbidden = endpoint(&w, "snapdrain", Err("403 Forbidden".into())).expect_err("403");
        assert_eq!(forbidden.reason(), condition::SECRET_UNREADABLE);
    }

    #[test]
    fn a_plain_url_needs_no_secret_and_the_condition_follows_the_result() {
        let w = WebhookNotification {
            url: Some("https://relay.example/plans".into()),
            url_secret_ref: None,
            ..by_ref("x", "y")
        };
        let e = endpoint(&w, "snapdrain", Ok(None));
        let now = jiff::Timestamp::UNIX_EPOCH;
        let c = condition_for(Some(&e), None, now).expect("a condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", condition::URL_RESOLVED)
        );
        assert!(
            c.message.contains("https://relay.example/…"),
            "{}",
            c.message
        );
        assert!(condition_for(None, None, now).is_none());
    }
}

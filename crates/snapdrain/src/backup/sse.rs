//! SSE-C (server-side encryption with a customer key) as velero-plugin-for-aws `object_store.go` `Init`
//! configures it: `config.customerKeyEncryptionFile` (a file in the Velero pod, normally a mounted
//! Secret) or `config.customerKeyEncryptionSecret` (`secretName/key` in Velero's namespace). The key is
//! exactly 32 bytes; every GET and HEAD then carries algorithm AES256, the key and its MD5 (base64), or S3
//! refuses it with 400.

use std::fmt;

use base64::Engine as _;

use crate::api::velero::SecretKeyRef;

pub const FILE_CONFIG: &str = "customerKeyEncryptionFile";
pub const SECRET_CONFIG: &str = "customerKeyEncryptionSecret";

/// Where the customer key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A path in the Velero server container.
    File(String),
    Secret(SecretKeyRef),
}

/// The key as S3 wants it on each request.
#[derive(Clone, PartialEq, Eq)]
pub struct CustomerKey {
    /// base64 of the 32 key bytes.
    pub key: String,
    /// base64 of their MD5.
    pub key_md5: String,
}

impl fmt::Debug for CustomerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CustomerKey(<redacted>)")
    }
}

/// The location's key source, or None without SSE-C. Both settings, or one with `kmsKeyId`, is the
/// plugin's own error ("you can only use one of").
pub fn key_source(
    config: &std::collections::BTreeMap<String, String>,
) -> Result<Option<KeySource>, String> {
    let get = |k: &str| config.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (file, secret, kms) = (get(FILE_CONFIG), get(SECRET_CONFIG), get("kmsKeyId"));
    if [file, secret, kms].iter().filter(|v| v.is_some()).count() > 1 {
        return Err(format!(
            "sets more than one of kmsKeyId, {FILE_CONFIG} and {SECRET_CONFIG}; Velero accepts only one"
        ));
    }
    if let Some(path) = file {
        return Ok(Some(KeySource::File(path.to_owned())));
    }
    let Some(reference) = secret else {
        return Ok(None);
    };
    match reference.split('/').collect::<Vec<_>>()[..] {
        [name, key] if !name.is_empty() && !key.is_empty() => {
            Ok(Some(KeySource::Secret(SecretKeyRef {
                name: name.to_owned(),
                key: key.to_owned(),
            })))
        }
        _ => Err(format!(
            "{SECRET_CONFIG} {reference:?} is not secretName/key"
        )),
    }
}

/// The request form of a 32-byte key.
pub fn customer_key(bytes: &[u8]) -> Result<CustomerKey, String> {
    if bytes.len() != 32 {
        return Err(format!(
            "the customer key is {} bytes; SSE-C keys are exactly 32 bytes",
            bytes.len()
        ));
    }
    use md5::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(CustomerKey {
        key: b64.encode(bytes),
        key_md5: b64.encode(md5::Md5::digest(bytes)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sources() {
        assert_eq!(key_source(&cfg(&[])), Ok(None));
        assert_eq!(
            key_source(&cfg(&[(FILE_CONFIG, "/keys/sse")])),
            Ok(Some(KeySource::File("/keys/sse".into())))
        );
        assert_eq!(
            key_source(&cfg(&[(SECRET_CONFIG, "sse/key")])),
            Ok(Some(KeySource::Secret(SecretKeyRef {
                name: "sse".into(),
                key: "key".into()
            })))
        );
        assert!(key_source(&cfg(&[(SECRET_CONFIG, "sse")])).is_err());
        assert!(key_source(&cfg(&[(FILE_CONFIG, "/k"), ("kmsKeyId", "alias/x")])).is_err());
    }

    #[test]
    fn key_is_32_bytes_with_its_md5() {
        let k = customer_key(&[7u8; 32]).expect("32 bytes");
        assert_eq!(k.key.len(), 44);
        // MD5 of 32 bytes of 0x07 is cb81c010…50a6 (md5sum), base64 below.
        assert_eq!(k.key_md5, "y4HAEFCYWuvAXWFTtA1Qpg==");
        assert!(customer_key(&[0u8; 31]).unwrap_err().contains("31 bytes"));
        assert_eq!(format!("{k:?}"), "CustomerKey(<redacted>)");
    }
}

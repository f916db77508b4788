//! The Kubernetes protobuf envelope (apimachinery `pkg/runtime/serializer/protobuf/protobuf.go`
//! `Serializer.Decode`): the 4-byte prefix `k8s\0`, then a `runtime.Unknown` whose `typeMeta` names
//! the kind and whose `raw` holds the kind's own message.

use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;

use super::error::ProtobufError;

/// `protoEncodingPrefix`: "k8s" and the encoding style 0 (a `runtime.Unknown` follows).
pub const MAGIC: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

/// A decoded envelope: the kind it names and its still-encoded object.
#[derive(Debug, PartialEq)]
pub struct Envelope {
    pub api_version: String,
    pub kind: String,
    pub raw: Vec<u8>,
}

/// Unwraps the envelope, refusing what upstream's decoder refuses: no prefix, nothing after it, a
/// missing kind or version. A non-empty `contentEncoding` is refused too (upstream never writes one,
/// and this decoder does not undo encodings).
pub fn open(body: &[u8]) -> Result<Envelope, ProtobufError> {
    let Some(data) = body.strip_prefix(&MAGIC[..]) else {
        return Err(ProtobufError::MissingMagic);
    };
    if data.is_empty() {
        return Err(ProtobufError::Empty);
    }
    let unknown = Unknown::decode(data).map_err(ProtobufError::Envelope)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    if kind.is_empty() {
        return Err(ProtobufError::MissingKind);
    }
    if api_version.is_empty() {
        return Err(ProtobufError::MissingVersion);
    }
    if let Some(enc) = unknown.content_encoding.filter(|e| !e.is_empty()) {
        return Err(ProtobufError::ContentEncoding(enc));
    }
    Ok(Envelope {
        api_version,
        kind,
        raw: unknown.raw.unwrap_or_default(),
    })
}

/// The envelope around an encoded message, as client-go's protobuf serializer writes it (for tests).
#[cfg(test)]
pub fn wrap(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_string()),
            kind: Some(kind.to_string()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_what_the_serializer_writes() {
        let body = wrap("v1", "Namespace", vec![1, 2, 3]);
        assert_eq!(
            open(&body).unwrap(),
            Envelope {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                raw: vec![1, 2, 3],
            }
        );
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        assert!(matches!(open(b"{}"), Err(ProtobufError::MissingMagic)));
        assert!(matches!(open(&MAGIC), Err(ProtobufError::Empty)));
        let mut garbage = MAGIC.to_vec();
        garbage.extend([0x0a, 0xff]);
        assert!(matches!(open(&garbage), Err(ProtobufError::Envelope(_))));
        let no_kind = wrap("v1", "", vec![]);
        assert!(matches!(open(&no_kind), Err(ProtobufError::MissingKind)));
        let no_version = wrap("", "Namespace", vec![]);
        assert!(matches!(
            open(&no_version),
            Err(ProtobufError::MissingVersion)
        ));
    }
}

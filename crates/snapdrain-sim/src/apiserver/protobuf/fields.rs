//! Building a JSON object from a decoded protobuf message, field by field, as kube-apiserver's JSON
//! serialiser would write it, and refusing fields the converters do not map.
//!
//! Go's generated protobuf marshallers (`k8s.io/api/*/generated.pb.go`) always write non-pointer
//! scalars and structs, even at their zero value, so `Some("")`, `Some(0)`, `Some(false)` and
//! `Some(<empty message>)` are what an unset non-pointer field looks like on the wire. Those are
//! omitted here, as `omitempty` omits them in JSON. Pointer fields (`*int32`, `*bool`, ...) are only
//! written when set, so their zero value is kept (`replicas: 0` means zero).

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Map, Value};

use super::error::ProtobufError;

pub type Result<T> = std::result::Result<T, ProtobufError>;

/// One JSON object under construction, with its path for error messages (`spec.template.spec`).
pub struct Obj {
    path: String,
    out: Map<String, Value>,
}

impl Obj {
    pub fn new(path: &str) -> Self {
        Self {
            path: path.to_string(),
            out: Map::new(),
        }
    }

    /// The path of a field of this object.
    pub fn at(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    pub fn set(&mut self, name: &str, v: Value) {
        self.out.insert(name.to_string(), v);
    }

    /// A non-pointer string: omitted when empty.
    pub fn string(&mut self, name: &str, v: Option<String>) {
        if let Some(s) = v.filter(|s| !s.is_empty()) {
            self.set(name, Value::String(s));
        }
    }

    /// A non-pointer integer or bool: omitted at zero.
    pub fn int(&mut self, name: &str, v: Option<impl Into<i64>>) {
        if let Some(n) = v.map(Into::into).filter(|n| *n != 0) {
            self.set(name, n.into());
        }
    }

    pub fn flag(&mut self, name: &str, v: Option<bool>) {
        if v == Some(true) {
            self.set(name, true.into());
        }
    }

    /// A pointer field (`*int32`, `*bool`, `*string`): kept whenever it was sent, zero included.
    pub fn ptr(&mut self, name: &str, v: Option<impl Into<Value>>) {
        if let Some(v) = v {
            self.set(name, v.into());
        }
    }

    pub fn strings(&mut self, name: &str, v: Vec<String>) {
        if !v.is_empty() {
            self.set(name, v.into());
        }
    }

    pub fn string_map(&mut self, name: &str, v: BTreeMap<String, String>) {
        if !v.is_empty() {
            self.set(
                name,
                Value::Object(v.into_iter().map(|(k, v)| (k, v.into())).collect()),
            );
        }
    }

    /// `map<string, bytes>` as JSON writes `[]byte`: standard base64.
    pub fn bytes_map(&mut self, name: &str, v: BTreeMap<String, Vec<u8>>) {
        if !v.is_empty() {
            let engine = base64::engine::general_purpose::STANDARD;
            self.set(
                name,
                Value::Object(
                    v.into_iter()
                        .map(|(k, b)| (k, engine.encode(b).into()))
                        .collect(),
                ),
            );
        }
    }

    /// A pointer to a struct: kept when sent, even empty (`emptyDir: {}` means something).
    pub fn message<M>(
        &mut self,
        name: &str,
        v: Option<M>,
        convert: impl FnOnce(&str, M) -> Result<Value>,
    ) -> Result<()> {
        if let Some(m) = v {
            let value = convert(&self.at(name), m)?;
            self.set(name, value);
        }
        Ok(())
    }

    /// A non-pointer struct: omitted when it converts to `{}`.
    pub fn embedded<M>(
        &mut self,
        name: &str,
        v: Option<M>,
        convert: impl FnOnce(&str, M) -> Result<Value>,
    ) -> Result<()> {
        if let Some(m) = v {
            let value = convert(&self.at(name), m)?;
            if value.as_object().is_none_or(|o| !o.is_empty()) {
                self.set(name, value);
            }
        }
        Ok(())
    }

    pub fn list<M>(
        &mut self,
        name: &str,
        v: Vec<M>,
        convert: impl Fn(&str, M) -> Result<Value>,
    ) -> Result<()> {
        if v.is_empty() {
            return Ok(());
        }
        let base = self.at(name);
        let items = v
            .into_iter()
            .enumerate()
            .map(|(i, m)| convert(&format!("{base}[{i}]"), m))
            .collect::<Result<Vec<_>>>()?;
        self.set(name, Value::Array(items));
        Ok(())
    }

    /// A field no converter maps: an error naming it unless it is unset (see the module comment).
    pub fn unmapped<M: prost::Message>(&self, name: &str, v: &Option<M>) -> Result<()> {
        match v {
            Some(m) if !wire_is_zero(&m.encode_to_vec()) => {
                Err(ProtobufError::unmapped(&self.at(name)))
            }
            _ => Ok(()),
        }
    }

    pub fn unmapped_list<T>(&self, name: &str, v: &[T]) -> Result<()> {
        if v.is_empty() {
            Ok(())
        } else {
            Err(ProtobufError::unmapped(&self.at(name)))
        }
    }

    pub fn unmapped_map<K, V>(&self, name: &str, v: &BTreeMap<K, V>) -> Result<()> {
        if v.is_empty() {
            Ok(())
        } else {
            Err(ProtobufError::unmapped(&self.at(name)))
        }
    }

    pub fn done(self) -> Result<Value> {
        Ok(Value::Object(self.out))
    }
}

/// Whether protobuf wire bytes carry only zero values: varints and fixed values of 0, empty
/// length-delimited fields, or nested messages made only of those. A non-empty string or bytes field
/// counts as set unless its bytes happen to parse as such a message (real API strings do not).
fn wire_is_zero(mut b: &[u8]) -> bool {
    while !b.is_empty() {
        let Some(key) = varint(&mut b) else {
            return false;
        };
        let zero = match key & 7 {
            0 => varint(&mut b) == Some(0),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if b.len() < n {
                    return false;
                }
                let (v, rest) = b.split_at(n);
                b = rest;
                v.iter().all(|x| *x == 0)
            }
            2 => {
                let Some(len) = varint(&mut b).and_then(|l| usize::try_from(l).ok()) else {
                    return false;
                };
                if b.len() < len {
                    return false;
                }
                let (v, rest) = b.split_at(len);
                b = rest;
                v.is_empty() || wire_is_zero(v)
            }
            _ => false,
        };
        if !zero {
            return false;
        }
    }
    true
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *b = &b[i + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::api::core::v1::{ContainerPort, Probe, ResourceRequirements};
    use prost::Message;

    #[test]
    fn zero_values_as_go_writes_them_are_unset() {
        let empty = ResourceRequirements::default();
        assert!(wire_is_zero(&empty.encode_to_vec()));
        let zeros = ContainerPort {
            name: Some(String::new()),
            host_port: Some(0),
            container_port: Some(0),
            protocol: Some(String::new()),
            host_ip: Some(String::new()),
        };
        assert!(wire_is_zero(&zeros.encode_to_vec()));
        let nested = Probe {
            initial_delay_seconds: Some(0),
            ..Default::default()
        };
        assert!(
            Obj::new("c")
                .unmapped("livenessProbe", &Some(nested))
                .is_ok()
        );
    }

    #[test]
    fn a_set_unmapped_field_is_named_with_its_path() {
        let probe = Probe {
            period_seconds: Some(10),
            ..Default::default()
        };
        let err = Obj::new("spec.containers[0]")
            .unmapped("livenessProbe", &Some(probe))
            .expect_err("a set probe is refused");
        assert!(
            err.to_string().contains("spec.containers[0].livenessProbe"),
            "{err}"
        );
        assert!(!wire_is_zero(&"x".to_string().encode_to_vec()));
        assert!(Obj::new("").unmapped_list("volumes", &[1]).is_err());
    }

    #[test]
    fn pointer_zero_is_kept_and_non_pointer_zero_omitted() {
        let mut o = Obj::new("");
        o.ptr("replicas", Some(0));
        o.int("minReadySeconds", Some(0));
        o.string("name", Some(String::new()));
        o.flag("paused", Some(false));
        assert_eq!(o.done().unwrap(), serde_json::json!({"replicas": 0}));
    }
}

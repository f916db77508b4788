//! TEMPORARY minimal selectors until the full implementation merges.
use serde_json::Value;

#[derive(Clone, Debug)]
pub struct LabelSelector(Vec<(String, Option<String>, bool)>);
#[derive(Clone, Debug)]
pub struct FieldSelector(Vec<(String, String, bool)>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            if let Some((k, v)) = part.split_once("!=") {
                out.push((k.to_string(), Some(v.to_string()), false));
            } else if let Some((k, v)) = part.split_once('=') {
                out.push((
                    k.to_string(),
                    Some(v.trim_start_matches('=').to_string()),
                    true,
                ));
            } else {
                out.push((part.to_string(), None, true));
            }
        }
        Ok(Self(out))
    }
    pub fn matches_object(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        self.0.iter().all(|(k, v, eq)| {
            let actual = labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match v {
                Some(v) => (actual == Some(v.as_str())) == *eq,
                None => actual.is_some(),
            }
        })
    }
}

impl FieldSelector {
    pub fn parse(s: &str, supported: &[&str]) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v, eq) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v.trim_start_matches('='), true)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            if !(k == "metadata.name" || k == "metadata.namespace" || supported.contains(&k)) {
                return Err(format!("field label not supported: {k}"));
            }
            out.push((k.to_string(), v.to_string(), eq));
        }
        Ok(Self(out))
    }
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, v, eq)| {
            let actual = obj
                .pointer(&format!("/{}", k.replace('.', "/")))
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    o => o.to_string(),
                })
                .unwrap_or_default();
            (actual == *v) == *eq
        })
    }
}

//! EC2 query-protocol parameters: `Name=value` pairs with flattened, 1-based lists
//! (`InstanceId.1`, `Filter.2.Value.1`, `LaunchTemplateConfigs.1.Overrides.3.SubnetId`).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Params(BTreeMap<String, String>);

impl Params {
    pub(super) fn parse(body: &[u8]) -> Params {
        Params(form_urlencoded::parse(body).into_owned().collect())
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Sent, but as an empty string (which [`Params::get`] treats as absent).
    pub(super) fn is_blank(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|v| v.is_empty())
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// Scalar list `prefix.1`, `prefix.2`, … in index order.
    pub(super) fn list(&self, prefix: &str) -> Vec<String> {
        let mut items: Vec<(u32, String)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let idx = k.strip_prefix(prefix)?.strip_prefix('.')?.parse().ok()?;
                Some((idx, v.clone()))
            })
            .collect();
        items.sort_by_key(|(i, _)| *i);
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// Structure list `prefix.N.*`, each member with the `prefix.N.` part stripped, in index order.
    pub(super) fn structs(&self, prefix: &str) -> Vec<Params> {
        let mut groups: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
        for (k, v) in &self.0 {
            let Some(rest) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            let Some((idx, field)) = rest.split_once('.') else {
                continue;
            };
            if let Ok(idx) = idx.parse::<u32>() {
                groups
                    .entry(idx)
                    .or_default()
                    .insert(field.to_string(), v.clone());
            }
        }
        groups.into_values().map(Params).collect()
    }

    /// The nested structure `prefix.*`.
    pub(super) fn nested(&self, prefix: &str) -> Params {
        Params(
            self.0
                .iter()
                .filter_map(|(k, v)| {
                    let field = k.strip_prefix(prefix)?.strip_prefix('.')?;
                    Some((field.to_string(), v.clone()))
                })
                .collect(),
        )
    }

    /// Everything but the idempotency token, so "same parameters" can be compared.
    pub(super) fn fingerprint(&self) -> String {
        self.0
            .iter()
            .filter(|(k, _)| k.as_str() != "ClientToken")
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_structs() {
        let p = Params::parse(
            b"InstanceId.2=i-b&InstanceId.1=i-a&InstanceId.10=i-c&Filter.1.Name=tag%3Ak&Filter.1.Value.1=v&Filter.2.Name=x",
        );
        assert_eq!(p.list("InstanceId"), ["i-a", "i-b", "i-c"]);
        let f = p.structs("Filter");
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].get("Name"), Some("tag:k"));
        assert_eq!(f[0].list("Value"), ["v"]);
        assert_eq!(p.nested("Filter.1").get("Name"), Some("tag:k"));
    }
}

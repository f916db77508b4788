//! Label selectors as kubectl takes them (`-l`): `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
//! `k notin (a,b)`, joined by commas, into a `LabelSelector` for the plan's `spec.nodeSelector`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error(
        "empty label selector: it would select every node; name the labels, e.g. --selector pool=db"
    )]
    Empty,
    #[error(
        "cannot read {0:?} in the label selector; expected k=v, k!=v, k, !k, k in (a,b) or k notin (a,b)"
    )]
    Bad(String),
}

/// Splits on commas outside parentheses.
fn terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().map(|t| t.trim().to_string()).collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set_values(rest: &str, term: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Bad(term.into()))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        return Err(SelectorError::Bad(term.into()));
    }
    Ok(values)
}

pub fn parse_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    let mut labels = BTreeMap::new();
    let mut exprs = Vec::new();
    let req = |key: &str, op: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values,
    };
    for term in terms(s).into_iter().filter(|t| !t.is_empty()) {
        let bad = || SelectorError::Bad(term.clone());
        if let Some((k, v)) = term.split_once("!=") {
            let k = k.trim();
            if !valid_key(k) {
                return Err(bad());
            }
            exprs.push(req(k, "NotIn", Some(vec![v.trim().into()])));
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            let k = k.trim();
            if !valid_key(k) {
                return Err(bad());
            }
            labels.insert(k.to_string(), v.trim().to_string());
        } else if let Some(k) = term.strip_prefix('!') {
            if !valid_key(k.trim()) {
                return Err(bad());
            }
            exprs.push(req(k.trim(), "DoesNotExist", None));
        } else if let Some((k, rest)) = term.split_once(" notin ") {
            exprs.push(req(k.trim(), "NotIn", Some(set_values(rest, &term)?)));
        } else if let Some((k, rest)) = term.split_once(" in ") {
            exprs.push(req(k.trim(), "In", Some(set_values(rest, &term)?)));
        } else if valid_key(&term) {
            exprs.push(req(&term, "Exists", None));
        } else {
            return Err(bad());
        }
    }
    if labels.is_empty() && exprs.is_empty() {
        return Err(SelectorError::Empty);
    }
    Ok(LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        match_expressions: (!exprs.is_empty()).then_some(exprs),
    })
}

/// The selector back in kubectl's syntax (for `ListParams::labels`).
pub fn selector_string(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubectl_selectors_and_writes_them_back() {
        let s = parse_selector("pool=db, zone in (a,b),!spot,tier!=web,gpu").expect("parses");
        assert_eq!(
            s.match_labels,
            Some(BTreeMap::from([("pool".to_string(), "db".to_string())]))
        );
        let ops: Vec<(&str, &str)> = s
            .match_expressions
            .iter()
            .flatten()
            .map(|e| (e.key.as_str(), e.operator.as_str()))
            .collect();
        assert_eq!(
            ops,
            vec![
                ("zone", "In"),
                ("spot", "DoesNotExist"),
                ("tier", "NotIn"),
                ("gpu", "Exists")
            ]
        );
        assert_eq!(
            selector_string(&s),
            "pool=db,zone in (a,b),!spot,tier notin (web),gpu"
        );
    }

    #[test]
    fn refuses_empty_and_garbled_selectors() {
        assert_eq!(parse_selector(" , "), Err(SelectorError::Empty));
        assert!(matches!(
            parse_selector("zone in a,b"),
            Err(SelectorError::Bad(_))
        ));
        assert!(matches!(parse_selector("a b"), Err(SelectorError::Bad(_))));
    }
}

//! Label and field selectors as the apiserver evaluates them for `?labelSelector=`,
//! `?fieldSelector=` and `metav1.LabelSelector` values. Parsing follows k8s.io/apimachinery
//! pkg/labels/selector.go and pkg/fields/selector.go, including their error texts; every error
//! here is a 400 BadRequest.
//!
//! Null versus empty `metav1.LabelSelector` (`LabelSelectorAsSelector`): null selects nothing,
//! `{}` selects everything. That is right for PodDisruptionBudget (policy/v1) and workload
//! selectors. Callers for which an absent selector means "no filter" (a list request without
//! `labelSelector`, Velero's `spec.labelSelector`) must use `LabelSelector::everything()` for
//! absence instead of passing None to `from_metav1`. A Service's `spec.selector` is a plain map:
//! use `from_match_labels`, and treat an absent or empty one as selecting nothing, as the
//! endpoints controller does.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};
use thiserror::Error;

/// A selector that could not be parsed or is invalid; the apiserver answers 400 BadRequest.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{0}")]
pub struct SelectorError(pub String);

impl SelectorError {
    pub fn code(&self) -> u16 {
        400
    }

    pub fn reason(&self) -> &'static str {
        "BadRequest"
    }
}

/// A requirement operator (`selection.Operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One term of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Sorted and deduplicated, as upstream keeps them.
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds and validates a requirement (`labels.NewRequirement`).
    pub fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        validate_key(key)?;
        let mut values = values;
        values.sort();
        values.dedup();
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(SelectorError(
                    "values: Invalid value: []string{}: for 'in', 'notin' operators, values set \
                     can't be empty"
                        .into(),
                ));
            }
            Operator::Equals | Operator::NotEquals if values.len() != 1 => {
                return Err(SelectorError(format!(
                    "values: Invalid value: {values:?}: exact-match compatibility requires one \
                     single value"
                )));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(SelectorError(format!(
                    "values: Invalid value: {values:?}: values set must be empty for exists and \
                     does not exist"
                )));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    return Err(SelectorError(format!(
                        "values: Invalid value: {values:?}: for 'Gt', 'Lt' operators, exactly \
                         one value is required"
                    )));
                }
                if values[0].parse::<i64>().is_err() {
                    return Err(SelectorError(format!(
                        "values[0]: Invalid value: {:?}: for 'Gt', 'Lt' operators, the value \
                         must be an integer",
                        values[0]
                    )));
                }
            }
            _ => {}
        }
        for (i, v) in values.iter().enumerate() {
            validate_value(i, v)?;
        }
        Ok(Self {
            key: key.to_string(),
            operator,
            values,
        })
    }

    /// `Requirement.Matches`: negative operators match objects without the label.
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        let value = labels.get(&self.key).and_then(Value::as_str);
        match self.operator {
            Operator::Equals | Operator::In => value.is_some_and(|v| self.has(v)),
            Operator::NotEquals | Operator::NotIn => !value.is_some_and(|v| self.has(v)),
            Operator::Exists => labels.contains_key(&self.key),
            Operator::DoesNotExist => !labels.contains_key(&self.key),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), Some(want)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }

    fn has(&self, v: &str) -> bool {
        self.values.iter().any(|x| x == v)
    }
}

/// A label selector: the AND of its requirements, or the selector that matches nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelSelector {
    /// Selects nothing (a null `metav1.LabelSelector`).
    Nothing,
    /// Selects objects matching every requirement; no requirements select everything.
    All(Vec<Requirement>),
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::All(Vec::new())
    }

    /// Parses the string form of `?labelSelector=`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        Parser::new(selector).parse().map(Self::All)
    }

    /// From a `metav1.LabelSelector` JSON value (see the module doc for null versus empty).
    pub fn from_metav1(selector: Option<&Value>) -> Result<Self, SelectorError> {
        let Some(Value::Object(selector)) = selector else {
            return Ok(Self::Nothing);
        };
        let mut reqs = Vec::new();
        if let Some(Value::Object(labels)) = selector.get("matchLabels") {
            for (k, v) in labels {
                let v = v.as_str().unwrap_or_default().to_string();
                reqs.push(Requirement::new(k, Operator::Equals, vec![v])?);
            }
        }
        if let Some(Value::Array(exprs)) = selector.get("matchExpressions") {
            for expr in exprs {
                let key = expr.get("key").and_then(Value::as_str).unwrap_or_default();
                let op = expr
                    .get("operator")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let operator = match op {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    "DoesNotExist" => Operator::DoesNotExist,
                    _ => {
                        return Err(SelectorError(format!(
                            "{op:?} is not a valid label selector operator"
                        )));
                    }
                };
                let values = expr
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .map(|v| v.as_str().unwrap_or_default().to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(Requirement::new(key, operator, values)?);
            }
        }
        Ok(Self::All(reqs))
    }

    /// From a plain `map[string]string` selector (Service, ReplicationController): equality on
    /// every entry. An empty map yields the everything-selector; see the module doc.
    pub fn from_match_labels(labels: &Map<String, Value>) -> Result<Self, SelectorError> {
        Self::from_metav1(Some(&serde_json::json!({ "matchLabels": labels })))
    }

    pub fn is_everything(&self) -> bool {
        matches!(self, Self::All(reqs) if reqs.is_empty())
    }

    /// Matches a labels map (the value of `metadata.labels`; null or absent means no labels).
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let empty = Map::new();
        self.matches_map(labels.and_then(Value::as_object).unwrap_or(&empty))
    }

    /// Matches labels given as a JSON map.
    pub fn matches_map(&self, labels: &Map<String, Value>) -> bool {
        match self {
            Self::Nothing => false,
            Self::All(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }

    /// Whether `selector` (a `metav1.LabelSelector`; null selects nothing) selects `labels`. A selector
    /// that does not parse selects nothing.
    pub fn metav1_matches(selector: Option<&Value>, labels: &Map<String, Value>) -> bool {
        Self::from_metav1(selector).is_ok_and(|s| s.matches_map(labels))
    }

    /// Matches an object by its `metadata.labels`.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(object.pointer("/metadata/labels"))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Identifier,
    DoesNotExist, // !
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    OpenPar,
    ClosedPar,
    Comma,
    End,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

impl Parser {
    fn new(input: &str) -> Self {
        let mut items = Vec::new();
        let chars: Vec<char> = input.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if is_special(c) {
                let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
                let (token, len) = match two.as_str() {
                    "==" => (Token::DoubleEquals, 2),
                    "!=" => (Token::NotEquals, 2),
                    _ => match c {
                        '=' => (Token::Equals, 1),
                        '!' => (Token::DoesNotExist, 1),
                        '(' => (Token::OpenPar, 1),
                        ')' => (Token::ClosedPar, 1),
                        ',' => (Token::Comma, 1),
                        '>' => (Token::GreaterThan, 1),
                        _ => (Token::LessThan, 1),
                    },
                };
                items.push((token, chars[i..i + len].iter().collect()));
                i += len;
            } else {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let token = match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier,
                };
                items.push((token, word));
            }
        }
        items.push((Token::End, String::new()));
        Self { items, position: 0 }
    }

    /// In value position the keywords `in`/`notin` are ordinary identifiers.
    fn as_value(item: &(Token, String)) -> (Token, String) {
        match item.0 {
            Token::In | Token::NotIn => (Token::Identifier, item.1.clone()),
            _ => item.clone(),
        }
    }

    fn lookahead(&self) -> (Token, String) {
        Self::as_value(&self.items[self.position.min(self.items.len() - 1)])
    }

    fn consume_raw(&mut self) -> (Token, String) {
        // `End` is the last item and is never consumed past, so the index stays in range.
        let item = self.items[self.position.min(self.items.len() - 1)].clone();
        self.position = (self.position + 1).min(self.items.len() - 1);
        item
    }

    fn consume(&mut self) -> (Token, String) {
        Self::as_value(&self.consume_raw())
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            let (tok, lit) = self.lookahead();
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self.requirement().map_err(|e| {
                        SelectorError(format!("unable to parse requirement: {}", e.0))
                    })?;
                    reqs.push(r);
                    let (t, l) = self.consume();
                    match t {
                        Token::End => return Ok(reqs),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead();
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(SelectorError(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Token::End => return Ok(reqs),
                _ => {
                    return Err(SelectorError(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (mut tok, mut lit) = self.consume();
        let negated = tok == Token::DoesNotExist;
        if negated {
            (tok, lit) = self.consume();
        }
        if tok != Token::Identifier {
            return Err(SelectorError(format!(
                "found '{lit}', expected: identifier"
            )));
        }
        validate_key(&lit)?;
        let key = lit;
        // `!a` is complete by itself; in `!a=b` the caller then trips over the `=`.
        if negated {
            return Requirement::new(&key, Operator::DoesNotExist, Vec::new());
        }
        let (next, _) = self.lookahead();
        if next == Token::End || next == Token::Comma {
            return Requirement::new(&key, Operator::Exists, Vec::new());
        }
        let (tok, lit) = self.consume_raw();
        let operator = match tok {
            Token::In => Operator::In,
            Token::NotIn => Operator::NotIn,
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::NotEquals => Operator::NotEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            _ => {
                return Err(SelectorError(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        };
        let values = match operator {
            Operator::In | Operator::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        Requirement::new(&key, operator, values)
    }

    fn values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, lit) = self.consume();
        if tok != Token::OpenPar {
            return Err(SelectorError(format!("found '{lit}' expected: '('")));
        }
        let (tok, lit) = self.lookahead();
        match tok {
            Token::Identifier | Token::Comma => {
                let values = self.identifiers()?;
                let (tok, _) = self.consume();
                if tok != Token::ClosedPar {
                    return Err(SelectorError(format!("found '{lit}', expected: ')'")));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume();
                Ok(vec![String::new()])
            }
            _ => Err(SelectorError(format!(
                "found '{lit}', expected: ',', ')' or identifier"
            ))),
        }
    }

    fn identifiers(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut values = Vec::new();
        loop {
            let (tok, lit) = self.consume();
            match tok {
                Token::Identifier => {
                    values.push(lit);
                    let (t2, l2) = self.lookahead();
                    match t2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => {
                            return Err(SelectorError(format!(
                                "found '{l2}', expected: ',' or ')'"
                            )));
                        }
                    }
                }
                // `(,a`, `a,)` and `a,,b` contribute the empty value.
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    let (t2, _) = self.lookahead();
                    if t2 == Token::ClosedPar {
                        values.push(String::new());
                        return Ok(values);
                    }
                    if t2 == Token::Comma {
                        self.consume();
                        values.push(String::new());
                    }
                }
                _ => {
                    return Err(SelectorError(format!(
                        "found '{lit}', expected: ',', or identifier"
                    )));
                }
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, _) = self.lookahead();
        if tok == Token::End || tok == Token::Comma {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume();
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(SelectorError(format!(
                "found '{lit}', expected: identifier"
            )))
        }
    }
}

const NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

// The patterns are constants that compile; a failure would be a programming error caught by
// every test that parses a selector.
static NAME_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^{NAME_FMT}$")).expect("valid regex"));
static DNS1123_SUBDOMAIN_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^{DNS1123_SUBDOMAIN_FMT}$")).expect("valid regex"));

/// `validateLabelKey`: a qualified name, `[prefix/]name`.
fn validate_key(key: &str) -> Result<(), SelectorError> {
    let mut errs = Vec::new();
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else if prefix.len() > 253 {
            errs.push("prefix part must be no more than 253 characters".to_string());
        } else if !DNS1123_SUBDOMAIN_RE.is_match(prefix) {
            errs.push(format!(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
                 character (e.g. 'example.com', regex used for validation is \
                 '{DNS1123_SUBDOMAIN_FMT}')"
            ));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !NAME_RE.is_match(name) {
        errs.push(format!(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
             '123-abc', regex used for validation is '{NAME_FMT}')"
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "key: Invalid value: {key:?}: {}",
            errs.join("; ")
        )))
    }
}

/// `validateLabelValue`: empty, or a name of at most 63 characters.
fn validate_value(index: usize, value: &str) -> Result<(), SelectorError> {
    if value.is_empty() {
        return Ok(());
    }
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !NAME_RE.is_match(value) {
        errs.push(format!(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  \
             or 'my_value',  or '12345', regex used for validation is '({NAME_FMT})?')"
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "values[{index}]: Invalid value: {value:?}: {}",
            errs.join("; ")
        )))
    }
}

/// One term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    pub value: String,
    /// `=`/`==` when true, `!=` when false.
    pub equal: bool,
}

/// A field selector: the AND of its terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub terms: Vec<FieldTerm>,
}

/// Field labels every resource supports.
const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// Field labels a resource supports beyond `metadata.name`/`metadata.namespace`, from the
/// registries' `GetAttrs`/`ToSelectableFields` and the conversion funcs registered in
/// pkg/apis/core/v1/conversion.go. `resource` is the plural resource name.
pub fn field_labels(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "nodes" => &["spec.unschedulable"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "secrets" => &["type"],
        "namespaces" => &["status.phase"],
        "replicationcontrollers" => &["status.replicas"],
        "replicasets" => &["status.replicas"],
        "jobs" => &["status.successful"],
        "persistentvolumeclaims" | "persistentvolumes" => &[],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses `?fieldSelector=`; `supported` lists the resource's field labels beyond
    /// `metadata.name` and `metadata.namespace` (see [`field_labels`]).
    pub fn parse(selector: &str, supported: &[&str]) -> Result<Self, SelectorError> {
        let mut parts = split_terms(selector);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let Some((field, op, raw)) = split_term(part) else {
                return Err(SelectorError(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape(raw)?;
            if !COMMON_FIELDS.contains(&field) && !supported.contains(&field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            terms.push(FieldTerm {
                field: field.to_string(),
                value,
                equal: op != "!=",
            });
        }
        Ok(Self { terms })
    }

    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| (field_value(object, &t.field) == t.value) == t.equal)
    }
}

/// The string value of a field label on an object; absent fields are "" (booleans "false"), as
/// the typed `ToSelectableFields` functions produce.
pub fn field_value(object: &Value, label: &str) -> String {
    let at = |path: &str| object.pointer(path).filter(|v| !v.is_null());
    let value = match label {
        "status.podIP" => at("/status/podIP").or_else(|| at("/status/podIPs/0/ip")),
        "source" => at("/source/component"),
        "spec.unschedulable" | "spec.hostNetwork" => {
            let path = format!("/{}", label.replace('.', "/"));
            return at(&path)
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string();
        }
        _ => at(&format!("/{}", label.replace('.', "/"))),
    };
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Splits on commas not escaped with a backslash (`splitTerms`).
fn split_terms(selector: &str) -> Vec<String> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in selector.chars() {
        if escaped {
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            current.push(c);
            escaped = true;
        } else if c == ',' {
            terms.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    terms.push(current);
    terms
}

/// Splits at the first operator, trying `!=`, `==`, `=` at each position (`splitTerm`).
fn split_term(term: &str) -> Option<(&str, &str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], op, value));
            }
        }
    }
    None
}

/// `UnescapeValue`: `\\`, `\,` and `\=` are escapes; a bare `,` or `=` is an error.
fn unescape(raw: &str) -> Result<String, SelectorError> {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                other => {
                    let seq = other.map_or_else(|| "\\".to_string(), |o| format!("\\{o}"));
                    return Err(SelectorError(format!(
                        "invalid field selector: invalid escape sequence: {seq}"
                    )));
                }
            },
            ',' | '=' => {
                return Err(SelectorError(format!(
                    "invalid field selector: unescaped character in value: {c}"
                )));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Value {
        v
    }

    #[test]
    fn parses_every_operator() {
        let s = LabelSelector::parse(
            "app=web, tier==db,env!=prod,zone in (a, b),x notin (y),has,!gone",
        )
        .unwrap();
        let LabelSelector::All(reqs) = &s else {
            panic!("expected requirements")
        };
        let ops: Vec<Operator> = reqs.iter().map(|r| r.operator).collect();
        assert_eq!(
            ops,
            [
                Operator::Equals,
                Operator::Equals,
                Operator::NotEquals,
                Operator::In,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist
            ]
        );
        assert_eq!(reqs[3].values, ["a", "b"]);
        let yes = labels(
            json!({"app": "web", "tier": "db", "env": "dev", "zone": "b",
                                "x": "z", "has": ""}),
        );
        assert!(s.matches(Some(&yes)));
        let mut no = yes.clone();
        no["env"] = json!("prod");
        assert!(!s.matches(Some(&no)));
        let mut no = yes.clone();
        no["gone"] = json!("1");
        assert!(!s.matches(Some(&no)));
        let mut no = yes.clone();
        no.as_object_mut().unwrap().remove("has");
        assert!(!s.matches(Some(&no)));
    }

    #[test]
    fn negative_operators_match_missing_labels() {
        let s = LabelSelector::parse("env!=prod,zone notin (a)").unwrap();
        assert!(s.matches(None));
        assert!(s.matches(Some(&json!({}))));
        assert!(!s.matches(Some(&json!({"zone": "a"}))));
        let s = LabelSelector::parse("zone in (a)").unwrap();
        assert!(!s.matches(None));
    }

    #[test]
    fn keywords_are_values_in_value_position_and_gt_lt_work() {
        let s = LabelSelector::parse("mode=in,n>3").unwrap();
        assert!(s.matches(Some(&json!({"mode": "in", "n": "4"}))));
        assert!(!s.matches(Some(&json!({"mode": "in", "n": "3"}))));
        assert!(LabelSelector::parse("").unwrap().is_everything());
        assert!(
            LabelSelector::parse("a=")
                .unwrap()
                .matches(Some(&json!({"a": ""})))
        );
    }

    #[test]
    fn parse_errors_name_the_bad_part() {
        let cases = [
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            ("a in (b", "unable to parse requirement: found ''"),
            (
                "=b",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
            ("a=b,", "found '', expected: identifier after ','"),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            (
                "-bad=x",
                "unable to parse requirement: key: Invalid value: \"-bad\": name part must",
            ),
            (
                "a=-x",
                "unable to parse requirement: values[0]: Invalid value: \"-x\"",
            ),
            (
                "n>x",
                "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt'",
            ),
        ];
        for (input, want) in cases {
            let err = LabelSelector::parse(input).unwrap_err();
            assert!(err.to_string().starts_with(want), "{input}: {err}");
            assert_eq!(err.code(), 400);
        }
    }

    #[test]
    fn metav1_label_selector() {
        let sel = json!({"matchLabels": {"app": "db"},
                         "matchExpressions": [
                             {"key": "tier", "operator": "In", "values": ["a", "b"]},
                             {"key": "canary", "operator": "DoesNotExist"},
                             {"key": "zone", "operator": "Exists"}]});
        let s = LabelSelector::from_metav1(Some(&sel)).unwrap();
        let pod = json!({"metadata": {"labels": {"app": "db", "tier": "b", "zone": "z"}}});
        assert!(s.matches_object(&pod));
        let canary = json!({"metadata": {"labels": {"app": "db", "tier": "b", "zone": "z",
                                                    "canary": "1"}}});
        assert!(!s.matches_object(&canary));
        // Empty selects everything, null selects nothing.
        assert!(
            LabelSelector::from_metav1(Some(&json!({})))
                .unwrap()
                .matches_object(&pod)
        );
        assert!(
            !LabelSelector::from_metav1(None)
                .unwrap()
                .matches_object(&pod)
        );
        assert!(
            !LabelSelector::from_metav1(Some(&Value::Null))
                .unwrap()
                .matches_object(&pod)
        );
        let bad = json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]});
        assert_eq!(
            LabelSelector::from_metav1(Some(&bad))
                .unwrap_err()
                .to_string(),
            "\"Gt\" is not a valid label selector operator"
        );
        let empty_in = json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]});
        assert!(LabelSelector::from_metav1(Some(&empty_in)).is_err());
        let svc = json!({"app": "web"});
        let s = LabelSelector::from_match_labels(svc.as_object().unwrap()).unwrap();
        assert!(s.matches(Some(&json!({"app": "web", "x": "y"}))));
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "web-0", "namespace": "shop"},
               "spec": {"nodeName": "ip-10-0-1-5", "restartPolicy": "Always"},
               "status": {"phase": "Running", "podIPs": [{"ip": "10.1.2.3"}]}})
    }

    #[test]
    fn field_selectors_on_pods() {
        let pods = field_labels("pods");
        let s = FieldSelector::parse("spec.nodeName=ip-10-0-1-5,status.phase!=Succeeded", pods)
            .unwrap();
        assert!(s.matches(&pod()));
        let s = FieldSelector::parse("spec.nodeName==other", pods).unwrap();
        assert!(!s.matches(&pod()));
        let s =
            FieldSelector::parse("status.podIP=10.1.2.3,metadata.namespace=shop", pods).unwrap();
        assert!(s.matches(&pod()));
        // A pod not yet scheduled has nodeName "".
        let s = FieldSelector::parse("spec.nodeName=", pods).unwrap();
        assert!(!s.matches(&pod()));
        assert!(s.matches(&json!({"metadata": {"name": "p"}})));
        assert!(FieldSelector::parse("", pods).unwrap().is_everything());
    }

    #[test]
    fn field_selector_errors() {
        let err = FieldSelector::parse("spec.nodeName=x", field_labels("configmaps")).unwrap_err();
        assert_eq!(err.to_string(), "field label not supported: spec.nodeName");
        assert_eq!(err.code(), 400);
        let err = FieldSelector::parse("metadata.name", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        assert!(FieldSelector::parse("metadata.name=a=b", &[]).is_err());
        let s = FieldSelector::parse("metadata.name=a\\,b", &[]).unwrap();
        assert!(s.matches(&json!({"metadata": {"name": "a,b"}})));
    }

    #[test]
    fn node_unschedulable_defaults_to_false() {
        let s = FieldSelector::parse("spec.unschedulable=false", field_labels("nodes")).unwrap();
        assert!(s.matches(&json!({"metadata": {"name": "n"}, "spec": {}})));
        assert!(!s.matches(&json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}})));
    }
}

//! Renders the Helm chart's templates for given values without helm (not installed in CI): the small
//! subset of Go templates the chart uses, line by line. `if`/`with`/`range`/`else`/`end` on lines of
//! their own; inline `{{ expr }}`, `| quote`, `| default`; whole-line `toYaml ... | nindent N` and
//! `include ... | nindent N`. Anything else is a test failure naming the line, so a template change
//! the renderer does not understand is noticed, never rendered wrong silently.

use std::path::Path;

use serde_json::{Value, json};

/// What the templates see besides `.Values`.
pub struct Release<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
}

struct Ctx<'a> {
    values: &'a Value,
    chart: &'a Value,
    release: &'a Release<'a>,
}

impl Ctx<'_> {
    fn fullname(&self) -> String {
        let chart = self.chart["name"].as_str().unwrap_or("snapdrain");
        if self.release.name.contains(chart) {
            self.release.name.to_string()
        } else {
            format!("{}-{chart}", self.release.name)
        }
    }

    fn selector_labels(&self) -> Value {
        json!({
            "app.kubernetes.io/name": self.chart["name"],
            "app.kubernetes.io/instance": self.release.name,
        })
    }

    fn labels(&self) -> Value {
        let mut l = self.selector_labels();
        l["app.kubernetes.io/version"] = self.chart["appVersion"].clone();
        l["app.kubernetes.io/managed-by"] = json!("Helm");
        l["helm.sh/chart"] = json!(format!(
            "{}-{}",
            self.chart["name"].as_str().unwrap_or_default(),
            self.chart["version"].as_str().unwrap_or_default()
        ));
        l
    }

    fn service_account(&self) -> String {
        let name = self.values.pointer("/serviceAccount/name");
        match name.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None if truthy(&self.values["serviceAccount"]["create"]) => self.fullname(),
            None => "default".into(),
        }
    }

    /// `repository:tag` (the chart's appVersion when no tag), `@digest` when one is pinned, as
    /// `_helpers.tpl` writes it.
    fn image(&self) -> String {
        let image = &self.values["image"];
        let tag = image["tag"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                self.chart["appVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            });
        let mut r = format!("{}:{tag}", image["repository"].as_str().unwrap_or_default());
        if let Some(d) = image["digest"].as_str().filter(|d| !d.is_empty()) {
            r = format!("{r}@{d}");
        }
        r
    }

    /// One expression (no pipes): `.Values.a.b`, `.`, `.Release.Namespace`, `.Chart.X`, `include "x" .`,
    /// `not X`, a quoted string.
    fn eval(&self, expr: &str, dot: &Value, line: &str) -> Value {
        let expr = expr.trim();
        if let Some(rest) = expr.strip_prefix("not ") {
            return Value::Bool(!truthy(&self.eval(rest, dot, line)));
        }
        if let Some(name) = expr
            .strip_prefix("include \"")
            .and_then(|r| r.strip_suffix("\" ."))
        {
            return match name {
                "snapdrain.fullname" => json!(self.fullname()),
                "snapdrain.serviceAccountName" => json!(self.service_account()),
                "snapdrain.selectorLabels" => self.selector_labels(),
                "snapdrain.labels" => self.labels(),
                "snapdrain.image" => json!(self.image()),
                other => panic!("helm_render: unknown include {other:?} in {line:?}"),
            };
        }
        if let Some(s) = expr.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            return json!(s);
        }
        if expr == "." {
            return dot.clone();
        }
        if let Some(path) = expr.strip_prefix(".Values.") {
            let pointer = format!("/{}", path.replace('.', "/"));
            return self
                .values
                .pointer(&pointer)
                .cloned()
                .unwrap_or(Value::Null);
        }
        match expr {
            ".Release.Namespace" => json!(self.release.namespace),
            ".Release.Name" => json!(self.release.name),
            ".Release.Service" => json!("Helm"),
            ".Chart.AppVersion" => self.chart["appVersion"].clone(),
            ".Chart.Name" => self.chart["name"].clone(),
            _ => panic!("helm_render: cannot evaluate {expr:?} in {line:?}"),
        }
    }

    /// `expr | quote`, `expr | default other`, `expr | nindent N` (the last returns the indent).
    fn pipeline(&self, text: &str, dot: &Value, line: &str) -> (Value, Option<usize>) {
        let mut parts = text.split(" | ");
        let first = parts.next().unwrap_or_default();
        let first = first.strip_prefix("toYaml ").unwrap_or(first);
        let mut v = self.eval(first, dot, line);
        let mut indent = None;
        for f in parts {
            let f = f.trim();
            if f == "quote" {
                // Go's %q; Rust's debug quoting agrees for the plain strings a chart quotes.
                v = json!(format!("{:?}", scalar(&v)));
            } else if let Some(other) = f.strip_prefix("default ") {
                if !truthy(&v) {
                    v = self.eval(other, dot, line);
                }
            } else if let Some(n) = f.strip_prefix("nindent ") {
                indent = Some(n.trim().parse().expect("nindent takes a number"));
            } else {
                panic!("helm_render: unknown function {f:?} in {line:?}");
            }
        }
        (v, indent)
    }
}

/// Go templates' truth: false, 0, "", null, empty list and map are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A value printed inline, as Go templates print it.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Block YAML for `v` at `indent` (strings JSON-quoted, which YAML reads as double-quoted).
fn block_yaml(v: &Value, indent: usize, out: &mut Vec<String>) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                match val {
                    Value::Object(o) if !o.is_empty() => {
                        out.push(format!("{pad}{k:?}:"));
                        block_yaml(val, indent + 2, out);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        out.push(format!("{pad}{k:?}:"));
                        block_yaml(val, indent + 2, out);
                    }
                    other => out.push(format!("{pad}{k:?}: {other}")),
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                let mut inner = Vec::new();
                block_yaml(item, indent + 2, &mut inner);
                match inner.first_mut() {
                    Some(first) if matches!(item, Value::Object(_) | Value::Array(_)) => {
                        first.replace_range(..indent + 2, &format!("{pad}- "));
                        out.extend(inner);
                    }
                    _ => out.push(format!("{pad}- {item}")),
                }
            }
        }
        other => out.push(format!("{pad}{other}")),
    }
}

struct Frame {
    /// This block's lines are emitted.
    on: bool,
    /// The enclosing block's.
    parent_on: bool,
    dot: Value,
    parent_dot: Value,
}

/// One template rendered to YAML text.
pub fn render_text(text: &str, values: &Value, chart: &Value, release: &Release) -> String {
    let ctx = Ctx {
        values,
        chart,
        release,
    };
    let directive = regex::Regex::new(r"^\s*\{\{-?\s*(if|with|range|else|end)\b(.*?)\s*-?\}\}\s*$")
        .expect("re");
    let whole = regex::Regex::new(r"^\s*\{\{-\s*(.*?)\s*-?\}\}\s*$").expect("re");
    let inline = regex::Regex::new(r"\{\{-?\s*(.*?)\s*-?\}\}").expect("re");
    let mut stack: Vec<Frame> = Vec::new();
    let mut dot = Value::Null;
    let mut out = Vec::new();
    for line in text.lines() {
        let on = stack.last().is_none_or(|f| f.on);
        if line.trim_start().starts_with("{{/*") {
            continue;
        }
        if let Some(c) = directive.captures(line) {
            let arg = c[2].trim();
            match &c[1] {
                "if" | "with" | "range" => {
                    let v = if on {
                        ctx.pipeline(arg, &dot, line).0
                    } else {
                        Value::Null
                    };
                    if &c[1] == "range" && truthy(&v) {
                        panic!(
                            "helm_render: range over a non-empty list is not supported: {line:?}"
                        );
                    }
                    let new_dot = if &c[1] == "with" {
                        v.clone()
                    } else {
                        dot.clone()
                    };
                    stack.push(Frame {
                        on: on && truthy(&v),
                        parent_on: on,
                        dot: new_dot.clone(),
                        parent_dot: dot.clone(),
                    });
                    dot = new_dot;
                }
                "else" => {
                    let f = stack.last_mut().expect("else inside a block");
                    f.on = f.parent_on && !f.on;
                    f.dot = f.parent_dot.clone();
                    dot = f.dot.clone();
                }
                _ => {
                    let f = stack.pop().expect("end closes a block");
                    dot = f.parent_dot;
                }
            }
            continue;
        }
        if !on {
            continue;
        }
        if let Some(c) = whole.captures(line) {
            let (v, indent) = ctx.pipeline(&c[1], &dot, line);
            let indent = indent.unwrap_or_else(|| {
                panic!("helm_render: a whole-line {{{{- }}}} without nindent: {line:?}")
            });
            if !matches!(&v, Value::Object(o) if o.is_empty())
                && !matches!(&v, Value::Array(a) if a.is_empty())
            {
                block_yaml(&v, indent, &mut out);
            } else {
                out.push(format!("{}{v}", " ".repeat(indent)));
            }
            continue;
        }
        let rendered = inline.replace_all(line, |c: &regex::Captures| {
            let (v, indent) = ctx.pipeline(&c[1], &dot, line);
            assert!(indent.is_none(), "helm_render: inline nindent in {line:?}");
            scalar(&v)
        });
        out.push(rendered.into_owned());
    }
    assert!(stack.is_empty(), "helm_render: unclosed block");
    out.join("\n")
}

/// Every object the chart's templates render for `values` (values.yaml merged with `overrides`).
pub fn render_chart(chart_dir: &Path, overrides: &Value, release: &Release) -> Vec<Value> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let parse = |text: &str, what: &str| -> Vec<Value> {
        serde_saphyr::from_multiple::<Value>(text)
            .unwrap_or_else(|e| panic!("{what} does not render to YAML: {e}\n{text}"))
    };
    let mut values = parse(&read(&chart_dir.join("values.yaml")), "values.yaml")
        .into_iter()
        .next()
        .unwrap_or(Value::Null);
    merge(&mut values, overrides);
    let chart = parse(&read(&chart_dir.join("Chart.yaml")), "Chart.yaml")
        .into_iter()
        .next()
        .unwrap_or(Value::Null);
    let mut files: Vec<_> = std::fs::read_dir(chart_dir.join("templates"))
        .expect("templates/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let text = render_text(&read(f), &values, &chart, release);
            parse(&text, &f.display().to_string())
        })
        .filter(|d| !d.is_null())
        .collect()
}

fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[test]
fn the_renderer_follows_if_else_with_and_nindent() {
    let values = json!({"on": true, "off": false, "m": {"a": 1, "b": ["x"]}, "s": "v"});
    let chart = json!({"name": "snapdrain", "version": "1", "appVersion": "2"});
    let release = Release {
        name: "snapdrain",
        namespace: "ns",
    };
    let text = "a:\n  {{- if .Values.off }}\n  no: 1\n  {{- else }}\n  yes: {{ .Values.s | quote }}\n  {{- end }}\n  {{- with .Values.m }}\n  m:\n    {{- toYaml . | nindent 4 }}\n  {{- end }}\n  n: {{ include \"snapdrain.fullname\" . }}-x\n  t: {{ .Values.none | default .Chart.AppVersion }}";
    let out = render_text(text, &values, &chart, &release);
    let v: Value = serde_saphyr::from_str(&out).expect("YAML");
    assert_eq!(
        v,
        json!({"a": {"yes": "v", "m": {"a": 1, "b": ["x"]}, "n": "snapdrain-x", "t": 2}}),
        "{out}"
    );
}

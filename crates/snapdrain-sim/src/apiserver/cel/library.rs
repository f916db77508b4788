//! The CEL environment of CRD validation rules: the CEL standard library and macros, cel-go's strings
//! extension, and the Kubernetes regex library's `find` / `findAll` (k8s.io/apiserver
//! `pkg/cel/library/regex.go`), which Karpenter's rules use. Programs are compiled once per rule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cel::extractors::This;
use cel::{Context, Env, ExecutionError, Program};

/// Functions a rule may call here besides operators; any other makes its CRD refused (`rules.rs`).
pub const SUPPORTED: &[&str] = &[
    // standard library
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "type",
    "dyn",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    // cel-go strings extension
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "join",
    "format",
    "reverse",
    // Kubernetes regex library
    "find",
    "findAll",
];

pub fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The extension only adds overloads that the bare stdlib lacks; a clash would be a cel crate
        // change, and then the rules that need them fail to compile with a clear message.
        let _ = env.add_extension(cel::extensions::strings);
        Arc::new(env)
    })
    .clone()
}

/// The compiled program of `rule`, or the parser's message.
pub fn compile(rule: &str) -> Result<Arc<Program>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Program>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(rule) {
        return Ok(p.clone());
    }
    let program = Arc::new(env().compile(rule).map_err(|e| e.to_string())?);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(rule.to_string(), program.clone());
    Ok(program)
}

fn regex(pattern: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern).map_err(|e| ExecutionError::function_error("find", e.to_string()))
}

/// `'abc'.find('[a-z]')`: the first match, or "" (regex.go `find`).
fn find(
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<Arc<String>, ExecutionError> {
    let re = regex(&pattern)?;
    Ok(Arc::new(
        re.find(&this)
            .map(|m| m.as_str().to_string())
            .unwrap_or_default(),
    ))
}

/// `'abc'.findAll('[a-z]')`: every match (regex.go `findAll`, without the limit argument).
fn find_all(
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<cel::Value, ExecutionError> {
    let re = regex(&pattern)?;
    Ok(cel::Value::List(Arc::new(
        re.find_iter(&this)
            .map(|m| cel::Value::String(Arc::new(m.as_str().to_string())))
            .collect(),
    )))
}

/// A context with the Kubernetes functions; the caller adds `self` and `oldSelf`.
pub fn context() -> Context<'static, 'static> {
    let mut ctx = Context::with_env(env());
    // Neither name is a stdlib overload, so these cannot conflict.
    let _ = ctx.add_function("find", find);
    let _ = ctx.add_function("findAll", find_all);
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(rule: &str, this: serde_json::Value) -> cel::Value {
        let mut ctx = context();
        ctx.add_variable("self", cel::to_value(&this).expect("JSON converts"))
            .expect("variable");
        compile(rule)
            .expect("compiles")
            .execute(&ctx)
            .expect("evaluates")
    }

    #[test]
    fn evaluates_the_functions_the_upstream_crds_use() {
        let t = cel::Value::Bool(true);
        assert_eq!(
            eval(
                "self.find('^([^/]+)').endsWith('karpenter.sh')",
                "x.karpenter.sh/a".into()
            ),
            t
        );
        assert_eq!(
            eval(
                "self.all(x, has(x.schedule) == has(x.duration))",
                serde_json::json!([{"schedule": "a"}])
            ),
            cel::Value::Bool(false)
        );
        assert_eq!(
            eval(
                "self.all(k, k != '' && self[k] != '')",
                serde_json::json!({"a": "b"})
            ),
            t
        );
        assert_eq!(
            eval(
                "self.filter(x, has(x.r) ? x.r == true : false).size() <= 1",
                serde_json::json!([{"r": true}, {}])
            ),
            t
        );
        assert_eq!(eval("self.matches('^[a-z]+@.+$')", "a@b".into()), t);
        assert_eq!(eval("self.split('/').size() == 2", "a/b".into()), t);
        assert!(compile("self.(").is_err());
    }
}

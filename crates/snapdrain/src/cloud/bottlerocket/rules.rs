//! Value rules from Bottlerocket's settings models (bottlerocket-settings-sdk modeled types).
//!
//! Each check returns `Err(problem, fix)` so the caller can attach the setting path.

use std::sync::LazyLock;

use base64::Engine as _;
use regex::Regex;

pub(crate) type RuleResult = Result<(), (String, String)>;

fn fail(problem: impl Into<String>, fix: impl Into<String>) -> RuleResult {
    Err((problem.into(), fix.into()))
}

// The patterns below are literals checked by the unit tests, so compiling them cannot fail.
static CLUSTER_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$").expect("literal regex"));
static LABEL_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$").expect("literal regex")
});
static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("literal regex")
});
static SYSCTL_KEY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-zA-Z0-9./_-]{1,128}$").expect("literal regex"));
static QUANTITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")
        .expect("literal regex")
});
static PERCENT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9]{1,2})(\.[0-9]+)?%$").expect("literal regex"));
static DURATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$").expect("literal regex")
});
static CONTAINER_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9-]+$").expect("literal regex"));

pub(crate) const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];
pub(crate) const RESERVED_KEYS: &[&str] = &["cpu", "memory", "ephemeral-storage"];
pub(crate) const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

pub(crate) fn cluster_name(v: &str) -> RuleResult {
    if CLUSTER_NAME.is_match(v) {
        Ok(())
    } else {
        fail(
            format!("{v:?} is not a valid cluster name"),
            "use 1-100 characters: letters, digits, '-' and '_', starting with a letter or digit",
        )
    }
}

pub(crate) fn base64(v: &str) -> RuleResult {
    match base64::engine::general_purpose::STANDARD.decode(v.trim()) {
        Ok(_) => Ok(()),
        Err(e) => fail(
            format!("not valid base64 ({e})"),
            "base64-encode the value (e.g. `base64 -w0`)",
        ),
    }
}

pub(crate) fn api_server(v: &str) -> RuleResult {
    match url::Url::parse(v) {
        Ok(u) if u.scheme() == "https" || u.scheme() == "http" => Ok(()),
        _ => fail(
            format!("{v:?} is not an http(s) URL"),
            "set the cluster's API server endpoint, e.g. https://XXXX.gr7.us-west-2.eks.amazonaws.com",
        ),
    }
}

/// A Kubernetes label key: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub(crate) fn label_key(k: &str) -> RuleResult {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !DNS_SUBDOMAIN.is_match(p))
    {
        return fail(
            format!("key prefix {p:?} is not a DNS subdomain"),
            "use a lower-case DNS name of at most 253 characters before the '/'",
        );
    }
    if name.is_empty() || name.len() > 63 || !LABEL_NAME.is_match(name) {
        return fail(
            format!("key name {name:?} is not a valid label name"),
            "use at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit",
        );
    }
    Ok(())
}

/// Whether kubelet accepts `k` in `--node-labels` (Bottlerocket passes node-labels there). Kubelet exits
/// at start-up on a key in the `kubernetes.io` or `k8s.io` namespaces (or a subdomain of them) unless it
/// is in kubelet's own set or under `kubelet.kubernetes.io` / `node.kubernetes.io` (kubernetes
/// cmd/kubelet/app/options/options.go `ValidateKubeletFlags`, staging/src/k8s.io/kubelet/pkg/apis/
/// well_known_labels.go `IsKubeletLabel`).
pub(crate) fn kubelet_node_label(k: &str) -> RuleResult {
    const KUBELET_LABELS: [&str; 11] = [
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    ];
    const ALLOWED_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];
    let Some((namespace, _)) = k.split_once('/') else {
        return Ok(());
    };
    let within = |ns: &str, domain: &str| ns == domain || ns.ends_with(&format!(".{domain}"));
    let restricted = within(namespace, "kubernetes.io") || within(namespace, "k8s.io");
    let allowed = KUBELET_LABELS.contains(&k)
        || ALLOWED_NAMESPACES
            .iter()
            .any(|allowed| within(namespace, allowed));
    if restricted && !allowed {
        return fail(
            format!(
                "kubelet refuses {k:?} in --node-labels (unknown 'kubernetes.io' or 'k8s.io' label) and exits, so the node never joins"
            ),
            "use your own prefix (e.g. example.com/role), a node.kubernetes.io/ key, or set node-role labels after the node joins",
        );
    }
    Ok(())
}

pub(crate) fn label_value(v: &str) -> RuleResult {
    if v.is_empty() || (v.len() <= 63 && LABEL_NAME.is_match(v)) {
        Ok(())
    } else {
        fail(
            format!("value {v:?} is not a valid label value"),
            "use at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit (or leave it empty)",
        )
    }
}

/// A taint entry `value:Effect`; the value may be empty (`:NoSchedule`).
pub(crate) fn taint_entry(v: &str) -> Result<(String, String), (String, String)> {
    let Some((value, effect)) = v.rsplit_once(':') else {
        return Err((
            format!("{v:?} has no effect"),
            "write taints as \"value:Effect\" (the value may be empty, as in \":NoSchedule\")"
                .into(),
        ));
    };
    if !TAINT_EFFECTS.contains(&effect) {
        return Err((
            format!("effect {effect:?} is not a taint effect"),
            "use NoSchedule, PreferNoSchedule or NoExecute".into(),
        ));
    }
    label_value(value)?;
    Ok((value.to_string(), effect.to_string()))
}

pub(crate) fn sysctl_key(k: &str) -> RuleResult {
    if !SYSCTL_KEY.is_match(k) {
        return fail(
            format!("sysctl key {k:?} is invalid"),
            "use 1-128 characters from letters, digits, '.', '/', '_' and '-'",
        );
    }
    if k.contains("..") || k.starts_with('.') || k.starts_with('/') {
        return fail(
            format!("sysctl key {k:?} contains '..' or starts with '.' or '/'"),
            "write the key as a plain dotted name, e.g. fs.inotify.max_user_watches",
        );
    }
    Ok(())
}

pub(crate) fn quantity(v: &str) -> RuleResult {
    if QUANTITY.is_match(v) {
        Ok(())
    } else {
        fail(
            format!("{v:?} is not a Kubernetes quantity"),
            "use a quantity such as 100m, 512Mi or 1Gi",
        )
    }
}

/// An eviction threshold: `N%` with N < 100, or a quantity.
pub(crate) fn eviction_value(v: &str) -> RuleResult {
    if v.ends_with('%') {
        if PERCENT.is_match(v) {
            return Ok(());
        }
        return fail(
            format!("{v:?} is not a percentage below 100"),
            "use N% with 0 <= N < 100, e.g. 10%",
        );
    }
    quantity(v).map_err(|_| {
        (
            format!("{v:?} is neither a percentage nor a quantity"),
            "use N% (N < 100) or a quantity such as 500Mi".to_string(),
        )
    })
}

pub(crate) fn duration(v: &str) -> RuleResult {
    if DURATION.is_match(v) {
        Ok(())
    } else {
        fail(
            format!("{v:?} is not a duration"),
            "use a Go duration such as 45s, 2m or 1h2m",
        )
    }
}

pub(crate) fn container_id(id: &str) -> RuleResult {
    if CONTAINER_ID.is_match(id) {
        Ok(())
    } else {
        fail(
            format!("container name {id:?} is invalid"),
            "use only ASCII letters, digits and '-'",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        assert!(label_key("example.com/node-pool").is_ok());
        assert!(label_key("pool").is_ok());
        assert!(label_key("Example.com/x").is_err());
        assert!(label_key("example.com/").is_err());
        assert!(label_key(&"a".repeat(64)).is_err());
    }

    #[test]
    fn eviction_values() {
        assert!(eviction_value("10%").is_ok());
        assert!(eviction_value("99.5%").is_ok());
        assert!(eviction_value("100%").is_err());
        assert!(eviction_value("500Mi").is_ok());
        assert!(eviction_value("lots").is_err());
    }

    #[test]
    fn durations_and_sysctls() {
        assert!(duration("1h2m").is_ok());
        assert!(duration("45").is_err());
        assert!(sysctl_key("fs.inotify.max_user_watches").is_ok());
        assert!(sysctl_key("/proc/sys").is_err());
        assert!(sysctl_key("a..b").is_err());
        assert!(sysctl_key(".a").is_err());
    }

    #[test]
    fn taints() {
        assert_eq!(
            taint_entry(":NoSchedule").unwrap(),
            (String::new(), "NoSchedule".into())
        );
        assert!(taint_entry("x:NoWay").is_err());
        assert!(taint_entry("novalue").is_err());
    }
}

//! Validation of Bottlerocket user data as the host would apply it at boot.

use std::collections::BTreeMap;
use std::io::Read as _;

use toml::{Table, Value};

use super::error::UserDataError;
use super::rules::{self, RuleResult};

/// EC2 refuses user data over 16 KB (before base64).
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// A node taint as Bottlerocket hands it to kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    /// May be empty.
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// The parts of valid user data a joining node needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedUserData {
    pub cluster_name: String,
    pub api_server: String,
    pub cluster_dns_ip: Option<String>,
    pub max_pods: Option<u32>,
    pub node_labels: BTreeMap<String, String>,
    pub node_taints: Vec<Taint>,
    pub sysctls: BTreeMap<String, String>,
    /// The whole `[settings]` table, for anything else a caller wants to read.
    pub settings: Table,
}

/// Validates TOML user data (plain text).
pub fn validate(user_data: &str) -> Result<ParsedUserData, UserDataError> {
    validate_bytes(user_data.as_bytes())
}

/// Validates user data as EC2 would deliver it: plain TOML or gzip-compressed TOML.
pub fn validate_bytes(raw: &[u8]) -> Result<ParsedUserData, UserDataError> {
    Validator.check(read_settings(raw)?)
}

/// The `[settings]` table of user data as EC2 delivers it (plain or gzip-compressed TOML, at most
/// [`MAX_USER_DATA_BYTES`]), as Bottlerocket's early-boot-config reads it before applying anything.
pub fn read_settings(raw: &[u8]) -> Result<Table, UserDataError> {
    if raw.len() > MAX_USER_DATA_BYTES {
        return Err(UserDataError::TooLarge {
            size: raw.len(),
            limit: MAX_USER_DATA_BYTES,
        });
    }
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw)
            .read_to_end(&mut out)
            .map_err(|e| UserDataError::Gzip(e.to_string()))?;
        String::from_utf8(out).map_err(|_| UserDataError::NotUtf8)?
    } else {
        std::str::from_utf8(raw)
            .map_err(|_| UserDataError::NotUtf8)?
            .to_string()
    };
    let doc: Table = text
        .parse()
        .map_err(|e: toml::de::Error| UserDataError::Toml(e.message().to_string()))?;
    match doc.get("settings") {
        Some(Value::Table(t)) => Ok(t.clone()),
        Some(_) => Err(UserDataError::invalid(
            "settings",
            "is not a table",
            "write settings as [settings.*] tables",
        )),
        None => Err(UserDataError::MissingSettings),
    }
}

/// Quotes a TOML key when it needs quoting, so error paths read like the file.
pub(crate) fn key_path(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        format!("{parent}.{key}")
    } else {
        format!("{parent}.{key:?}")
    }
}

fn at(path: &str, r: RuleResult) -> Result<(), UserDataError> {
    r.map_err(|(problem, fix)| UserDataError::invalid(path, problem, fix))
}

pub(crate) fn table<'a>(v: &'a Value, path: &str) -> Result<&'a Table, UserDataError> {
    v.as_table().ok_or_else(|| {
        UserDataError::invalid(
            path,
            format!("is a {}, not a table", v.type_str()),
            format!("write it as a [{path}] table"),
        )
    })
}

pub(crate) fn string<'a>(v: &'a Value, path: &str) -> Result<&'a str, UserDataError> {
    v.as_str().ok_or_else(|| {
        UserDataError::invalid(
            path,
            format!("is a {}, not a string", v.type_str()),
            "quote the value",
        )
    })
}

fn boolean(v: &Value, path: &str) -> Result<bool, UserDataError> {
    v.as_bool().ok_or_else(|| {
        UserDataError::invalid(
            path,
            format!("is a {}, not a boolean", v.type_str()),
            "use true or false (unquoted)",
        )
    })
}

struct Validator;

impl Validator {
    fn check(&self, settings: Table) -> Result<ParsedUserData, UserDataError> {
        let k8s = match settings.get("kubernetes") {
            Some(v) => table(v, "settings.kubernetes")?,
            None => {
                return Err(UserDataError::Missing {
                    path: "settings.kubernetes.cluster-name".into(),
                });
            }
        };
        let required = |key: &str| -> Result<&str, UserDataError> {
            let path = format!("settings.kubernetes.{key}");
            match k8s.get(key) {
                Some(v) => string(v, &path),
                None => Err(UserDataError::Missing { path }),
            }
        };
        let cluster_name = required("cluster-name")?.to_string();
        let api_server = required("api-server")?.to_string();
        let cert = required("cluster-certificate")?;
        at(
            "settings.kubernetes.cluster-name",
            rules::cluster_name(&cluster_name),
        )?;
        at(
            "settings.kubernetes.api-server",
            rules::api_server(&api_server),
        )?;
        at(
            "settings.kubernetes.cluster-certificate",
            rules::base64(cert),
        )?;

        let mut parsed = ParsedUserData {
            cluster_name,
            api_server,
            cluster_dns_ip: None,
            max_pods: None,
            node_labels: BTreeMap::new(),
            node_taints: Vec::new(),
            sysctls: BTreeMap::new(),
            settings: Table::new(),
        };
        for (key, value) in k8s {
            self.kubernetes_key(key, value, &mut parsed)?;
        }
        if let Some(kernel) = settings.get("kernel") {
            let kernel = table(kernel, "settings.kernel")?;
            if let Some(sysctl) = kernel.get("sysctl") {
                let sysctl = table(sysctl, "settings.kernel.sysctl")?;
                for (k, v) in sysctl {
                    let path = key_path("settings.kernel.sysctl", k);
                    at(&path, rules::sysctl_key(k))?;
                    parsed
                        .sysctls
                        .insert(k.clone(), string(v, &path)?.to_string());
                }
            }
        }
        if let Some(hc) = settings.get("host-containers") {
            self.containers(hc, "settings.host-containers", ContainerKind::Host)?;
        }
        if let Some(bc) = settings.get("bootstrap-containers") {
            self.containers(
                bc,
                "settings.bootstrap-containers",
                ContainerKind::Bootstrap,
            )?;
        }
        parsed.settings = settings;
        Ok(parsed)
    }

    fn kubernetes_key(
        &self,
        key: &str,
        value: &Value,
        parsed: &mut ParsedUserData,
    ) -> Result<(), UserDataError> {
        let path = key_path("settings.kubernetes", key);
        match key {
            "cluster-dns-ip" => {
                // Bottlerocket accepts one address or a list of them.
                let ips: Vec<&Value> = match value {
                    Value::Array(a) => a.iter().collect(),
                    v => vec![v],
                };
                for ip in &ips {
                    let s = string(ip, &path)?;
                    if s.parse::<std::net::IpAddr>().is_err() {
                        return Err(UserDataError::invalid(
                            &path,
                            format!("{s:?} is not an IP address"),
                            "use the cluster DNS service IP, e.g. 10.100.0.10, or leave it unset",
                        ));
                    }
                }
                if let Some(first) = ips.first() {
                    parsed.cluster_dns_ip = Some(string(first, &path)?.to_string());
                }
            }
            "max-pods" => {
                let n = value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0);
                parsed.max_pods = Some(n.ok_or_else(|| {
                    UserDataError::invalid(
                        &path,
                        format!("{value} is not a positive integer"),
                        "use an unquoted number such as 110, or leave it unset",
                    )
                })?);
            }
            "node-labels" => {
                for (k, v) in table(value, &path)? {
                    let p = key_path(&path, k);
                    at(&p, rules::label_key(k))?;
                    at(&p, rules::kubelet_node_label(k))?;
                    let v = string(v, &p)?;
                    at(&p, rules::label_value(v))?;
                    parsed.node_labels.insert(k.clone(), v.to_string());
                }
            }
            "node-taints" => {
                for (k, v) in table(value, &path)? {
                    let p = key_path(&path, k);
                    at(&p, rules::label_key(k))?;
                    let entries = v.as_array().ok_or_else(|| {
                        UserDataError::invalid(
                            &p,
                            format!("is a {}, not a list", v.type_str()),
                            "write taints as a list: key = [\"value:Effect\"]",
                        )
                    })?;
                    for e in entries {
                        let (value, effect) = rules::taint_entry(string(e, &p)?)
                            .map_err(|(problem, fix)| UserDataError::invalid(&p, problem, fix))?;
                        parsed.node_taints.push(super::Taint {
                            key: k.clone(),
                            value,
                            effect,
                        });
                    }
                }
            }
            "eviction-hard" | "eviction-soft" | "eviction-soft-grace-period" => {
                for (k, v) in table(value, &path)? {
                    let p = key_path(&path, k);
                    if !rules::EVICTION_SIGNALS.contains(&k.as_str()) {
                        return Err(UserDataError::invalid(
                            &p,
                            format!("{k:?} is not an eviction signal"),
                            format!("use one of {}", rules::EVICTION_SIGNALS.join(", ")),
                        ));
                    }
                    let v = string(v, &p)?;
                    if key == "eviction-soft-grace-period" {
                        at(&p, rules::duration(v))?;
                    } else {
                        at(&p, rules::eviction_value(v))?;
                    }
                }
            }
            "kube-reserved" | "system-reserved" => {
                for (k, v) in table(value, &path)? {
                    let p = key_path(&path, k);
                    if !rules::RESERVED_KEYS.contains(&k.as_str()) {
                        return Err(UserDataError::invalid(
                            &p,
                            format!("{k:?} cannot be reserved"),
                            "use cpu, memory or ephemeral-storage",
                        ));
                    }
                    at(&p, rules::quantity(string(v, &p)?))?;
                }
            }
            "container-log-max-size" => at(&path, rules::quantity(string(value, &path)?))?,
            k if k.ends_with("grace-period") || k.ends_with("grace-period-for-critical-pods") => {
                at(&path, rules::duration(string(value, &path)?))?
            }
            // Other kubernetes settings pass through unchecked, as Karpenter lets them.
            _ => {}
        }
        Ok(())
    }

    fn containers(&self, v: &Value, path: &str, kind: ContainerKind) -> Result<(), UserDataError> {
        for (id, c) in table(v, path)? {
            let p = key_path(path, id);
            at(&p, rules::container_id(id))?;
            let c = table(c, &p)?;
            for (field, fv) in c {
                let fp = key_path(&p, field);
                match (kind, field.as_str()) {
                    (ContainerKind::Host, "enabled" | "superpowered")
                    | (ContainerKind::Bootstrap, "essential") => {
                        boolean(fv, &fp)?;
                    }
                    (_, "source") => {
                        string(fv, &fp)?;
                    }
                    (_, "user-data") => at(&fp, rules::base64(string(fv, &fp)?))?,
                    (_, "command") => {
                        if !fv.as_array().is_some_and(|a| a.iter().all(Value::is_str)) {
                            return Err(UserDataError::invalid(
                                &fp,
                                "is not a list of strings",
                                "write the command as [\"arg0\", \"arg1\"]",
                            ));
                        }
                    }
                    (ContainerKind::Bootstrap, "mode") => {
                        let m = string(fv, &fp)?;
                        if !matches!(m, "always" | "once" | "off") {
                            return Err(UserDataError::invalid(
                                &fp,
                                format!("{m:?} is not a bootstrap container mode"),
                                "use always, once or off",
                            ));
                        }
                    }
                    _ => {
                        return Err(UserDataError::invalid(
                            &fp,
                            "is not a setting of this container",
                            kind.fields_hint(),
                        ));
                    }
                }
            }
            // Bottlerocket ships admin and control; a custom host container is only usable with all three.
            let builtin = matches!(id.as_str(), "admin" | "control");
            if kind == ContainerKind::Host && !builtin {
                for needed in ["enabled", "source", "superpowered"] {
                    if !c.contains_key(needed) {
                        return Err(UserDataError::Missing {
                            path: key_path(&p, needed),
                        });
                    }
                }
            }
            if kind == ContainerKind::Bootstrap && !c.contains_key("source") {
                return Err(UserDataError::Missing {
                    path: key_path(&p, "source"),
                });
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContainerKind {
    Host,
    Bootstrap,
}

impl ContainerKind {
    fn fields_hint(self) -> &'static str {
        match self {
            ContainerKind::Host => {
                "host containers take enabled, superpowered, source, user-data and command"
            }
            ContainerKind::Bootstrap => {
                "bootstrap containers take source, mode, essential, user-data and command"
            }
        }
    }
}

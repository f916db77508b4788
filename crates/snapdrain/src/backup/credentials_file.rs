//! Velero's AWS credentials file, read as static keys only.
//!
//! velero-plugin-for-aws (`config.go` `WithCredentialsFile`) hands the file to the AWS SDK as both the
//! shared credentials and the shared config file, so `[name]`, `[profile name]` and `[default]` all name
//! profiles. The SDK would also honour `credential_process` (runs a command), `web_identity_token_file`,
//! `role_arn`/`source_profile` and `sso_*` in it. The file comes from a Secret that anyone who can write
//! to the Velero namespace controls, and snapdrain holds more power than Velero, so only keys are taken:
//! a profile that asks for any other credential source is refused with the key it set.
//!
//! The syntax follows the SDK's parser (aws-runtime `env_config/parse.rs`): `#` and `;` start comment
//! lines, and trailing comments after whitespace; property names are case-insensitive; a line starting
//! with whitespace continues the previous value. Values never appear in errors.

use std::collections::BTreeMap;

/// The keys of one profile.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

// Keys stay out of logs.
impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Why the file gives no usable keys. Every variant is the file's fault: a person must fix it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsFileError {
    #[error("line {line} is not valid in an AWS credentials file: {problem}")]
    Syntax { line: usize, problem: &'static str },
    #[error("the file has no [{profile}] profile (nor [profile {profile}])")]
    NoProfile { profile: String },
    #[error(
        "profile [{profile}] sets {key}, a credential source snapdrain does not use (it reads static keys only, so a Secret in the Velero namespace cannot make it run commands or assume roles); put aws_access_key_id and aws_secret_access_key of an IAM user allowed s3:GetObject and s3:ListBucket in a Secret and name it with --velero-credentials-secret, or run Velero without a Secret so snapdrain uses its own IAM identity"
    )]
    Refused { profile: String, key: String },
    #[error(
        "profile [{profile}] has no {key}; it needs aws_access_key_id and aws_secret_access_key"
    )]
    Missing { profile: String, key: &'static str },
}

/// The static keys of `profile` in `contents`.
pub fn static_keys(contents: &str, profile: &str) -> Result<StaticKeys, CredentialsFileError> {
    let sections = parse(contents)?;
    // `[name]` as a credentials file, `[profile name]` as a config file; as in the SDK, the credentials
    // file's value wins when both set a key.
    let config = sections.get(&format!("profile {profile}"));
    let credentials = sections.get(profile);
    if config.is_none() && credentials.is_none() {
        return Err(CredentialsFileError::NoProfile {
            profile: profile.to_owned(),
        });
    }
    let mut merged: BTreeMap<&str, &str> = BTreeMap::new();
    for section in [config, credentials].into_iter().flatten() {
        for (k, v) in section {
            merged.insert(k, v);
        }
    }
    if let Some(key) = merged.keys().find(|k| refused(k)) {
        return Err(CredentialsFileError::Refused {
            profile: profile.to_owned(),
            key: (*key).to_owned(),
        });
    }
    let required = |key: &'static str| {
        merged
            .get(key)
            .filter(|v| !v.is_empty())
            .map(|v| (*v).to_owned())
            .ok_or_else(|| CredentialsFileError::Missing {
                profile: profile.to_owned(),
                key,
            })
    };
    Ok(StaticKeys {
        access_key_id: required("aws_access_key_id")?,
        secret_access_key: required("aws_secret_access_key")?,
        session_token: merged
            .get("aws_session_token")
            .filter(|v| !v.is_empty())
            .map(|v| (*v).to_owned()),
    })
}

/// Keys that make the SDK fetch credentials some other way (aws-config `profile/credentials/repr.rs`:
/// assume-role, web identity, SSO, credential process, login session). Other settings (`region`,
/// `output`, S3 options, and role options that do nothing without `role_arn`) are left alone: the
/// location's `config` decides region and endpoint, as in the plugin.
fn refused(key: &str) -> bool {
    matches!(
        key,
        "credential_process"
            | "web_identity_token_file"
            | "role_arn"
            | "source_profile"
            | "credential_source"
            | "login_session"
    ) || key.starts_with("sso_")
}

type Sections = BTreeMap<String, BTreeMap<String, String>>;

/// Section name (trimmed, inner whitespace collapsed to one space) → lower-cased key → value.
fn parse(contents: &str) -> Result<Sections, CredentialsFileError> {
    const WS: &[char] = &[' ', '\t'];
    let mut sections: Sections = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut last_key: Option<String> = None;
    for (i, raw) in contents.lines().enumerate() {
        let line = i + 1;
        let syntax = |problem| CredentialsFileError::Syntax { line, problem };
        if raw.trim_matches(WS).is_empty() || raw.starts_with(['#', ';']) {
            continue;
        }
        if raw.starts_with('[') {
            let header = strip_comment(raw, false);
            let name = header
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .ok_or(syntax("a profile header must be [name] or [profile name]"))?;
            let name = name.split(WS).filter(|p| !p.is_empty()).collect::<Vec<_>>();
            let name = name.join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            last_key = None;
        } else if raw.starts_with(WS) {
            // A continuation (or an S3-style sub-property block): appended to the previous value.
            let (Some(section), Some(key)) = (&current, &last_key) else {
                return Err(syntax("a continuation line must follow a property"));
            };
            if let Some(v) = sections.get_mut(section).and_then(|s| s.get_mut(key)) {
                v.push('\n');
                v.push_str(raw.trim_matches(WS));
            }
        } else {
            let Some(section) = &current else {
                return Err(syntax("a property must come after a [profile] header"));
            };
            let prop = strip_comment(raw, true);
            let (k, v) = prop
                .split_once('=')
                .ok_or(syntax("a property must be name = value"))?;
            let k = k.trim_matches(WS).to_ascii_lowercase();
            if k.is_empty() {
                return Err(syntax("a property must have a name before '='"));
            }
            sections
                .entry(section.clone())
                .or_default()
                .insert(k.clone(), v.trim_matches(WS).to_owned());
            last_key = Some(k);
        }
    }
    Ok(sections)
}

/// The line without its trailing comment. In properties a comment needs whitespace before `#`/`;`, so
/// keys may contain them (aws-runtime `parse.rs` `prepare_line`).
fn strip_comment(line: &str, need_whitespace: bool) -> &str {
    let line = line.trim_matches([' ', '\t']);
    let mut prev_ws = false;
    for (idx, c) in line.char_indices() {
        if (c == '#' || c == ';') && (prev_ws || !need_whitespace) {
            return line[..idx].trim_matches([' ', '\t']);
        }
        prev_ws = c == ' ' || c == '\t';
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ak: &str, sk: &str, token: Option<&str>) -> StaticKeys {
        StaticKeys {
            access_key_id: ak.into(),
            secret_access_key: sk.into(),
            session_token: token.map(Into::into),
        }
    }

    #[test]
    fn velero_install_file_gives_its_keys() {
        // What `velero install --secret-file` docs tell users to write.
        let file = "[default]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = secret/with+chars=\n";
        assert_eq!(
            static_keys(file, "default"),
            Ok(keys("AKIAEXAMPLE", "secret/with+chars=", None))
        );
    }

    #[test]
    fn named_profiles_as_credentials_or_config_sections() {
        let file = "# comment\n; other comment\n[default]\naws_access_key_id=a\naws_secret_access_key=b\n\
                    [profile backup]\nregion = eu-west-1\nAWS_ACCESS_KEY_ID = c ; trailing\n\
                    aws_secret_access_key = d#not-a-comment\naws_session_token = t\n";
        assert_eq!(
            static_keys(file, "backup"),
            Ok(keys("c", "d#not-a-comment", Some("t")))
        );
        // `[name]` (credentials file) wins over `[profile name]` (config file), as in the SDK.
        let both = "[profile p]\naws_access_key_id = cfg\naws_secret_access_key = s\n[p]\naws_access_key_id = cred\n";
        assert_eq!(static_keys(both, "p"), Ok(keys("cred", "s", None)));
    }

    #[test]
    fn other_credential_sources_are_refused_by_name() {
        for key in [
            "credential_process = sh -c 'curl https://x'",
            "web_identity_token_file = /var/run/secrets/kubernetes.io/serviceaccount/token",
            "role_arn = arn:aws:iam::1:role/admin",
            "source_profile = base",
            "credential_source = Ec2InstanceMetadata",
            "sso_start_url = https://x.awsapps.com/start",
            "sso_session = corp-sso",
            "Credential_Process = /bin/true",
        ] {
            let file =
                format!("[default]\naws_access_key_id = a\naws_secret_access_key = b\n{key}\n");
            let err = static_keys(&file, "default").expect_err(key);
            let name = key
                .split('=')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            assert_eq!(
                err,
                CredentialsFileError::Refused {
                    profile: "default".into(),
                    key: name.clone()
                }
            );
            let text = err.to_string();
            assert!(
                text.contains(&name) && text.contains("--velero-credentials-secret"),
                "{text}"
            );
            // The value (a command, a path) is not echoed.
            let value = key
                .split_once('=')
                .map(|(_, v)| v.trim())
                .unwrap_or_default();
            assert!(!text.contains(value), "{text}");
        }
        // Only the chosen profile matters.
        let file = "[default]\naws_access_key_id = a\naws_secret_access_key = b\n[other]\ncredential_process = x\n";
        assert_eq!(static_keys(file, "default"), Ok(keys("a", "b", None)));
    }

    #[test]
    fn missing_profile_or_key_and_bad_syntax_are_named() {
        let file = "[default]\naws_access_key_id = a\n";
        assert_eq!(
            static_keys(file, "velero"),
            Err(CredentialsFileError::NoProfile {
                profile: "velero".into()
            })
        );
        assert_eq!(
            static_keys(file, "default"),
            Err(CredentialsFileError::Missing {
                profile: "default".into(),
                key: "aws_secret_access_key"
            })
        );
        let empty = "[default]\naws_access_key_id =\naws_secret_access_key = b\n";
        assert!(matches!(
            static_keys(empty, "default"),
            Err(CredentialsFileError::Missing {
                key: "aws_access_key_id",
                ..
            })
        ));
        for (text, line) in [
            ("aws_access_key_id = a\n", 1),
            ("[default\n", 1),
            ("[default]\n\nno equals sign\n", 3),
            ("[default]\n = value\n", 2),
            ("[default]\n  continued\n", 2),
        ] {
            match static_keys(text, "default") {
                Err(CredentialsFileError::Syntax { line: l, .. }) => {
                    assert_eq!(l, line, "{text:?}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn continuation_lines_join_the_value() {
        let file = "[default]\naws_access_key_id = a\naws_secret_access_key = b\ns3 =\n  max_concurrent_requests = 20\n";
        assert_eq!(static_keys(file, "default"), Ok(keys("a", "b", None)));
    }

    #[test]
    fn debug_hides_the_secret_parts() {
        let shown = format!("{:?}", keys("AKIA1", "s3cr3t", Some("tok3n")));
        assert!(shown.contains("AKIA1"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("tok3n"),
            "{shown}"
        );
    }
}

//! How clients reach the simulated API server: a kube-rs configuration and a kubeconfig, each trusting
//! the server's CA and naming its user.

use base64::Engine as _;

use super::auth;

/// A kube-rs configuration for `url` that authenticates as the cluster admin, as the kubeconfig does,
/// and trusts only `ca_pem` (the server's CA).
pub fn admin_config(url: &str, ca_pem: &str) -> Result<kube::Config, String> {
    use rustls::pki_types::pem::PemObject as _;
    let uri = url
        .parse()
        .map_err(|e| format!("API server URL {url}: {e}"))?;
    let ca = rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes())
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the API server's CA PEM: {e}"))?;
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(ca);
    config.auth_info.token = Some(secrecy::SecretString::from(auth::ADMIN_TOKEN));
    Ok(config)
}

/// Who a kubeconfig's user is.
#[derive(Clone, Copy, Debug)]
pub enum KubeconfigUser<'a> {
    /// A bearer token.
    Token(&'a str),
    /// HTTP basic auth, which kube-apiserver no longer authenticates (its `--basic-auth-file`
    /// authenticator was removed in 1.19): the request reaches the server without a bearer token, so it
    /// is anonymous. A kubeconfig user with no credentials at all makes kubectl prompt for a username
    /// instead (client-go `tools/clientcmd/client_config.go` `getUserIdentificationPartialConfig`).
    Basic {
        username: &'a str,
        password: &'a str,
    },
}

/// A kubeconfig whose current context points kubectl and kube-rs at `url`, trusting `ca_pem`
/// (`certificate-authority-data`), as `user`.
pub fn kubeconfig(url: &str, ca_pem: &str, user: KubeconfigUser<'_>) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = match user {
        KubeconfigUser::Token(t) => format!("    token: {t}\n"),
        KubeconfigUser::Basic { username, password } => {
            format!("    username: {username}\n    password: {password}\n")
        }
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: snapdrain-sim\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\ncontexts:\n- name: snapdrain-sim\n  context:\n    cluster: snapdrain-sim\n    user: snapdrain-sim\n    namespace: default\ncurrent-context: snapdrain-sim\nusers:\n- name: snapdrain-sim\n  user:\n{user}preferences: {{}}\n"
    )
}

//! Authentication and authorization, as kube-apiserver does them over TLS for bearer tokens: the
//! kubeconfig's token is a cluster admin (group `system:masters`, which kube-apiserver's privileged-group
//! authorizer allows everything), ServiceAccount tokens come from TokenRequest
//! (`POST .../serviceaccounts/<name>/token`), an unknown token is 401, and a request without a bearer
//! token is anonymous (user `system:anonymous`, group `system:unauthenticated`; anonymous auth is on by
//! default). Every request outside `system:masters`, anonymous ones included, is decided by RBAC
//! ([`rbac`]) over the Roles, ClusterRoles and bindings in the store; a refusal is the server's 403.
//!
//! Upstream: kubernetes `pkg/kubeapiserver/authenticator/config.go` `Config.New` (the request
//! authenticators in a union, the authenticated group added, then
//! `union.NewFailOnError(authenticator, anonymous.NewAuthenticator())`: an authenticator's error, a bad
//! bearer token, is a 401 and never anonymous), `staging/src/k8s.io/apiserver/pkg/authentication/
//! request/bearertoken/bearertoken.go` `AuthenticateRequest` (which requests carry a token at all) and
//! `.../request/anonymous/anonymous.go` `NewAuthenticator` (the anonymous user).

pub mod rbac;
pub mod review;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use serde_json::Value;

use super::errors::ApiError;
use super::resources::ResKey;
use super::store::Store;
use rbac::{Attributes, Policy};

/// The token the generated kubeconfig and the simulator's own clients carry.
pub const ADMIN_TOKEN: &str = "snapdrain-sim";
const MASTERS: &str = "system:masters";

/// Who a request is from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    fn admin() -> Self {
        Self {
            name: "snapdrain-sim".into(),
            groups: vec![MASTERS.into(), "system:authenticated".into()],
        }
    }

    /// kubernetes `staging/src/k8s.io/apiserver/pkg/authentication/request/anonymous/anonymous.go`
    /// `NewAuthenticator`: `user.Anonymous` in `user.AllUnauthenticated` only (the authenticated group
    /// adder does not run for it).
    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// The user a ServiceAccount token authenticates as (`serviceaccount.MakeUsername`, `MakeGroupNames`).
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    fn authenticated(&self) -> bool {
        self.groups.iter().any(|g| g == "system:authenticated")
    }
}

/// One authorization decision for a user outside `system:masters`, as kube-apiserver's audit log
/// records it at level Metadata (`user`, `verb`, `objectRef` and the response code; kubernetes
/// `staging/src/k8s.io/apiserver/pkg/apis/audit/types.go` `Event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub user: UserInfo,
    pub attributes: Attributes,
    pub allowed: bool,
}

/// Tokens, whether RBAC is enforced, and the decisions taken for non-admin users.
pub struct Auth {
    tokens: Mutex<HashMap<String, UserInfo>>,
    enforce: AtomicBool,
    decisions: Mutex<Vec<Decision>>,
}

impl Default for Auth {
    fn default() -> Self {
        let tokens = HashMap::from([(ADMIN_TOKEN.to_string(), UserInfo::admin())]);
        Self {
            tokens: Mutex::new(tokens),
            enforce: AtomicBool::new(true),
            decisions: Mutex::new(Vec::new()),
        }
    }
}

impl Auth {
    /// Turns authorization off (every authenticated request allowed), for tests that say so.
    pub fn set_enforced(&self, on: bool) {
        self.enforce.store(on, Ordering::SeqCst);
    }

    /// A new token for ServiceAccount `namespace/name` (TokenRequest).
    pub fn issue(&self, namespace: &str, name: &str) -> String {
        let token = format!("sa-{namespace}-{name}-{:016x}", rand::random::<u64>());
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.insert(token.clone(), UserInfo::service_account(namespace, name));
        token
    }

    /// The user behind the request's bearer token: 401 for a token nobody issued, anonymous without a
    /// token.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        let header = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let Some(token) = bearer_token(header) else {
            return Ok(UserInfo::anonymous());
        };
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        // kube-apiserver's answer to a failed authentication (`staging/src/k8s.io/apiserver/pkg/
        // endpoints/filters/authentication.go` `Unauthorized`: `apierrors.NewUnauthorized("Unauthorized")`).
        tokens
            .get(token)
            .cloned()
            .ok_or_else(|| ApiError::new(401, "Unauthorized", "Unauthorized"))
    }

    /// Every decision taken for a user outside `system:masters` (admins are not recorded), in order:
    /// what least-privilege tests replay against a narrower policy with [`rbac::allows`].
    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Allows or refuses `attrs` for `user` with the server's 403.
    pub fn authorize(
        &self,
        store: &Store,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> Result<(), ApiError> {
        if user.is_admin() {
            return Ok(());
        }
        let decision = self.decide(store, user, attrs);
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Decision {
                user: user.clone(),
                attributes: attrs.clone(),
                allowed: decision.is_ok(),
            });
        decision
    }

    fn decide(&self, store: &Store, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
        if !self.enforce.load(Ordering::SeqCst) && user.authenticated() {
            return Ok(());
        }
        if let Attributes::NonResource { path, .. } = attrs
            && public_path(path, user)
        {
            return Ok(());
        }
        if basic_user(attrs) && user.authenticated() {
            return Ok(());
        }
        let all = |plural: &str| -> Vec<Value> {
            let key = ResKey::new("rbac.authorization.k8s.io", plural);
            store
                .list(&key, None, &|_| true, None, None)
                .items
                .iter()
                .map(|o| (**o).clone())
                .collect()
        };
        let (cluster_roles, cluster_role_bindings, roles, role_bindings) = (
            all("clusterroles"),
            all("clusterrolebindings"),
            all("roles"),
            all("rolebindings"),
        );
        let policy = Policy {
            cluster_roles: &cluster_roles,
            cluster_role_bindings: &cluster_role_bindings,
            roles: &roles,
            role_bindings: &role_bindings,
        };
        if rbac::allows(&policy, user, attrs) {
            return Ok(());
        }
        let mut e = ApiError::new(403, "Forbidden", attrs.forbidden_message(&user.name));
        if let Attributes::Resource {
            group,
            resource,
            name,
            ..
        } = attrs
        {
            e.group = Some(group.clone());
            e.kind = Some(resource.clone());
            e.name = name.clone();
        }
        Err(e)
    }
}

/// The token of an `Authorization` header, when it carries one, as kubernetes
/// `staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/bearertoken.go`
/// `AuthenticateRequest` reads it: the trimmed header split on spaces, a first part of `bearer` in any
/// case, and a non-empty second part. Anything else (no header, another scheme, an empty token) is no
/// token at all, so the request goes on to the anonymous authenticator.
fn bearer_token(header: &str) -> Option<&str> {
    let parts: Vec<&str> = header.trim().split(' ').collect();
    match parts.as_slice() {
        [scheme, token, ..] if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() => {
            Some(token)
        }
        _ => None,
    }
}

/// The bootstrap ClusterRole `system:basic-user` (bound to every authenticated user, kubernetes
/// `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`): asking what one may do.
fn basic_user(attrs: &Attributes) -> bool {
    matches!(attrs, Attributes::Resource { verb, group, resource, .. }
        if verb == "create" && group == "authorization.k8s.io"
            && matches!(resource.as_str(), "selfsubjectaccessreviews" | "selfsubjectrulesreviews"))
}

/// What the bootstrap ClusterRoles `system:discovery` (bound to every authenticated user) and
/// `system:public-info-viewer` (bound to everyone) allow: discovery, OpenAPI, version and health.
fn public_path(path: &str, user: &UserInfo) -> bool {
    let info = matches!(path, "/version" | "/healthz" | "/livez" | "/readyz");
    let discovery = path == "/api"
        || path.starts_with("/api/")
        || path == "/apis"
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/");
    info || (discovery && user.authenticated())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        h
    }

    fn header(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", value.parse().expect("header"));
        h
    }

    /// Upstream cases: kubernetes `staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/
    /// bearertoken_test.go` (no header, another scheme, an empty token and a lower-case `bearer`) and
    /// `pkg/kubeapiserver/authenticator/config.go` `Config.New` (an invalid token fails, never falls
    /// through to anonymous).
    #[test]
    fn without_a_bearer_token_a_request_is_anonymous_and_a_bad_one_is_401() {
        let auth = Auth::default();
        for h in [
            HeaderMap::new(),
            header("Basic Zm9vOmJhcg=="),
            header("Bearer "),
            header("Bearer"),
            header(""),
        ] {
            let user = auth.authenticate(&h).expect("no token: anonymous");
            assert_eq!(user, UserInfo::anonymous(), "{h:?}");
            assert!(!user.is_admin() && !user.authenticated());
        }
        assert!(
            auth.authenticate(&header(&format!("bearer {ADMIN_TOKEN}")))
                .expect("lower-case scheme")
                .is_admin()
        );
        let e = auth
            .authenticate(&header("Bearer garbage"))
            .expect_err("a token nobody issued");
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (401, "Unauthorized", "Unauthorized")
        );
    }

    #[test]
    fn anonymous_reads_health_and_version_only() {
        let auth = Auth::default();
        let store = Store::new();
        let anon = UserInfo::anonymous();
        let get = |path: &str| Attributes::NonResource {
            verb: "get".into(),
            path: path.into(),
        };
        for path in ["/healthz", "/livez", "/readyz", "/version"] {
            assert!(auth.authorize(&store, &anon, &get(path)).is_ok(), "{path}");
        }
        for path in ["/api", "/apis", "/apis/apps/v1", "/openapi/v3", "/metrics"] {
            let e = auth
                .authorize(&store, &anon, &get(path))
                .expect_err("not public");
            assert_eq!(e.code, 403, "{path}");
        }
        auth.set_enforced(false);
        let list_pods = Attributes::Resource {
            verb: "list".into(),
            group: String::new(),
            resource: "pods".into(),
            subresource: None,
            namespace: Some("default".into()),
            name: None,
        };
        let e = auth
            .authorize(&store, &anon, &list_pods)
            .expect_err("turning RBAC off is for authenticated users");
        assert_eq!(e.code, 403);
    }

    #[test]
    fn tokens_name_their_users_and_unknown_tokens_are_401() {
        let auth = Auth::default();
        assert!(
            auth.authenticate(&bearer(ADMIN_TOKEN))
                .expect("admin")
                .is_admin()
        );
        let token = auth.issue("snapdrain", "snapdrain");
        let sa = auth.authenticate(&bearer(&token)).expect("issued token");
        assert_eq!(sa.name, "system:serviceaccount:snapdrain:snapdrain");
        assert!(!sa.is_admin());
        let e = auth
            .authenticate(&bearer("forged"))
            .expect_err("unknown token");
        assert_eq!((e.code, e.reason.as_str()), (401, "Unauthorized"));
    }

    #[test]
    fn a_service_account_without_roles_sees_discovery_but_nothing_else() {
        let auth = Auth::default();
        let store = Store::new();
        let sa = UserInfo::service_account("snapdrain", "snapdrain");
        let get = |path: &str| Attributes::NonResource {
            verb: "get".into(),
            path: path.into(),
        };
        assert!(auth.authorize(&store, &sa, &get("/apis/apps/v1")).is_ok());
        assert!(auth.authorize(&store, &sa, &get("/metrics")).is_err());
        let list_pods = Attributes::Resource {
            verb: "list".into(),
            group: String::new(),
            resource: "pods".into(),
            subresource: None,
            namespace: None,
            name: None,
        };
        let e = auth
            .authorize(&store, &sa, &list_pods)
            .expect_err("no binding");
        assert_eq!(e.code, 403);
        auth.set_enforced(false);
        assert!(auth.authorize(&store, &sa, &list_pods).is_ok());
        let admin = UserInfo::admin();
        assert!(auth.authorize(&store, &admin, &list_pods).is_ok());
        let recorded: Vec<(String, bool)> = auth
            .decisions()
            .into_iter()
            .filter(|d| d.attributes == list_pods)
            .map(|d| (d.user.name, d.allowed))
            .collect();
        let sa_name = sa.name.clone();
        assert_eq!(
            recorded,
            vec![(sa_name.clone(), false), (sa_name, true)],
            "the ServiceAccount's decisions are recorded, the admin's are not"
        );
    }
}

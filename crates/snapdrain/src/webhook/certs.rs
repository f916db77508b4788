//! The webhook's certificates: a CA and a serving certificate for the Service's DNS names, issued with
//! rcgen, and when to replace them. Pure: the Secret they live in is [`super::keeper`]'s.
//!
//! Rotation: a certificate is renewed once less than a third of its lifetime is left (as cert-manager's
//! default `renewBefore` does), so a replica that picks up the new one late still has time. A CA is
//! rotated in two steps, so no replica ever serves a certificate the apiserver does not trust yet:
//! first the next CA is issued and published in the caBundle beside the current one; only once it has
//! been there for `promote_after` (every replica has re-read the Secret by then) does it sign the
//! serving certificate. The old CA then stays in the caBundle until it expires, for replicas that have
//! not reloaded yet.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};

use super::error::CertError;

/// How long certificates live. Short in tests, so a test can watch rotation happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    pub ca: Duration,
    pub serving: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            ca: Duration::from_secs(5 * 365 * DAY),
            serving: Duration::from_secs(90 * DAY),
        }
    }
}

/// A PEM certificate with its validity (kept beside it: rcgen issues but does not parse).
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: jiff::Timestamp,
    pub not_after: jiff::Timestamp,
}

// The private key stays out of logs and panic messages.
impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// Everything the Secret holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca: Issued,
    pub serving: Issued,
    /// The CA before the last CA rotation, trusted until it expires.
    pub previous_ca: Option<(String, jiff::Timestamp)>,
    /// The CA that will replace `ca`: already trusted, not signing yet.
    pub next_ca: Option<Issued>,
}

/// The DNS names kube-apiserver checks for a `clientConfig.service` (it dials `<svc>.<ns>.svc`).
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// True once less than a third of `[not_before, not_after]` is left (or it is over).
pub fn due(not_before: jiff::Timestamp, not_after: jiff::Timestamp, now: jiff::Timestamp) -> bool {
    let life = not_after.as_second() - not_before.as_second();
    let left = not_after.as_second() - now.as_second();
    left * 3 < life
}

/// When the bundle next needs work: the earlier renewal point, the next CA's promotion, or the previous
/// CA's expiry.
pub fn next_due(b: &Bundle, promote_after: Duration) -> jiff::Timestamp {
    let renew_at = |i: &Issued| {
        let life = i.not_after.as_second() - i.not_before.as_second();
        jiff::Timestamp::from_second(i.not_before.as_second() + life - life / 3)
            .unwrap_or(i.not_after)
    };
    let mut at = renew_at(&b.ca).min(renew_at(&b.serving));
    if let Some(next) = &b.next_ca {
        at = at.min(plus(next.not_before, promote_after));
    }
    if let Some((_, expires)) = &b.previous_ca {
        at = at.min(*expires);
    }
    at
}

/// The CAs the apiserver must trust now: the current one, the next one once issued, and the previous
/// one while it is valid.
pub fn ca_bundle(b: &Bundle, now: jiff::Timestamp) -> String {
    let mut pem = b.ca.cert_pem.clone();
    if let Some(next) = &b.next_ca {
        pem.push_str(&next.cert_pem);
    }
    if let Some((prev, expires)) = &b.previous_ca
        && *expires > now
    {
        pem.push_str(prev);
    }
    pem
}

/// What to store, given what is stored: `None` when nothing needs to change. `promote_after` is how
/// long a next CA is trusted before it signs (at least one resync of every replica).
pub fn renew(
    current: Option<&Bundle>,
    names: &[String],
    life: Lifetimes,
    promote_after: Duration,
    now: jiff::Timestamp,
) -> Result<Option<Bundle>, CertError> {
    let Some(cur) = current else {
        let ca = issue_ca(now, life.ca, names)?;
        let serving = issue_serving(&ca, names, now, life.serving)?;
        return Ok(Some(Bundle {
            ca,
            serving,
            previous_ca: None,
            next_ca: None,
        }));
    };
    let previous_live = cur.previous_ca.clone().filter(|(_, exp)| *exp > now);
    if let Some(next) = &cur.next_ca
        && plus(next.not_before, promote_after) <= now
    {
        // Step two: the next CA has been trusted long enough; it signs from now on.
        let serving = issue_serving(next, names, now, life.serving)?;
        let previous =
            (cur.ca.not_after > now).then(|| (cur.ca.cert_pem.clone(), cur.ca.not_after));
        return Ok(Some(Bundle {
            ca: next.clone(),
            serving,
            previous_ca: previous,
            next_ca: None,
        }));
    }
    if cur.next_ca.is_none() && due(cur.ca.not_before, cur.ca.not_after, now) {
        // Step one: publish the next CA; the serving certificate stays under the current one.
        return Ok(Some(Bundle {
            next_ca: Some(issue_ca(now, life.ca, names)?),
            previous_ca: previous_live,
            ..cur.clone()
        }));
    }
    if due(cur.serving.not_before, cur.serving.not_after, now) {
        let serving = issue_serving(&cur.ca, names, now, life.serving)?;
        return Ok(Some(Bundle {
            serving,
            previous_ca: previous_live,
            ..cur.clone()
        }));
    }
    if previous_live != cur.previous_ca {
        return Ok(Some(Bundle {
            previous_ca: previous_live,
            ..cur.clone()
        }));
    }
    Ok(None)
}

/// Sets the validity. rcgen takes `time::OffsetDateTime`, built here from rcgen's own constructor plus
/// seconds, so this crate needs no direct `time` dependency.
fn set_validity(
    p: &mut CertificateParams,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> Result<(), CertError> {
    let secs =
        |t: jiff::Timestamp| u64::try_from(t.as_second()).map_err(|_| CertError::BeforeEpoch(t));
    p.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(secs(from)?);
    p.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(secs(to)?);
    Ok(())
}

fn plus(now: jiff::Timestamp, d: Duration) -> jiff::Timestamp {
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2);
    jiff::Timestamp::from_second(now.as_second().saturating_add(secs))
        .unwrap_or(jiff::Timestamp::MAX)
}

/// The CA's subject and usages. The same every time, so a CA read back from the Secret (its key and
/// these parameters) signs certificates whose issuer matches the stored CA certificate.
fn ca_params() -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.distinguished_name
        .push(DnType::CommonName, "snapdrain eviction gate CA");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// A new CA for the gate's `names` only: name constraints (RFC 5280 4.2.1.10) permit just those DNS
/// names, so whoever reads its key from the Secret cannot mint a certificate for another name that a
/// client trusting this CA would accept (review L-4). Go's crypto/x509, which kube-apiserver verifies
/// the gate with, and webpki both enforce them.
fn issue_ca(now: jiff::Timestamp, life: Duration, names: &[String]) -> Result<Issued, CertError> {
    let key = KeyPair::generate()?;
    let mut p = ca_params()?;
    p.name_constraints = Some(NameConstraints {
        permitted_subtrees: names
            .iter()
            .map(|n| GeneralSubtree::DnsName(n.clone()))
            .collect(),
        excluded_subtrees: Vec::new(),
    });
    let not_after = plus(now, life);
    set_validity(&mut p, now, not_after)?;
    let cert = p.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_before: now,
        not_after,
    })
}

fn issue_serving(
    ca: &Issued,
    names: &[String],
    now: jiff::Timestamp,
    life: Duration,
) -> Result<Issued, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(names.to_vec())?;
    p.distinguished_name.push(
        DnType::CommonName,
        names.first().map(String::as_str).unwrap_or("snapdrain"),
    );
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // A serving certificate never outlives the CA that signed it.
    let not_after = plus(now, life).min(ca.not_after);
    set_validity(&mut p, now, not_after)?;
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_before: now,
        not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + s).expect("in range")
    }

    fn life() -> Lifetimes {
        Lifetimes {
            ca: Duration::from_secs(3000),
            serving: Duration::from_secs(300),
        }
    }

    #[test]
    fn due_when_less_than_a_third_is_left() {
        assert!(!due(t(0), t(300), t(199)));
        assert!(!due(t(0), t(300), t(200)));
        assert!(due(t(0), t(300), t(201)));
        assert!(due(t(0), t(300), t(400)));
    }

    const PROMOTE: Duration = Duration::from_secs(10);

    #[test]
    fn a_first_bundle_then_nothing_until_due() {
        let names = service_names("snapdrain", "ops");
        let b = renew(None, &names, life(), PROMOTE, t(0))
            .expect("issue")
            .expect("nothing stored: a new bundle");
        assert!(b.ca.cert_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(b.serving.not_after, t(300));
        assert_eq!(
            renew(Some(&b), &names, life(), PROMOTE, t(100)).expect("issue"),
            None
        );
        assert_eq!(next_due(&b, PROMOTE), t(200));
    }

    /// A certificate for a name outside the gate's, signed with the CA's key (what a reader of the
    /// Secret could do), is refused by a client that trusts the CA; the gate's own is accepted.
    #[test]
    fn the_ca_signs_for_the_gates_names_only() {
        use rustls::client::WebPkiServerVerifier;
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let names = service_names("snapdrain", "ops");
        let now = jiff::Timestamp::now();
        let b = renew(None, &names, Lifetimes::default(), PROMOTE, now)
            .expect("issue")
            .expect("a new bundle");
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&b.ca.cert_pem)).expect("the CA is a root");
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .expect("a verifier");
        let verify = |cert: &Issued, name: &str| {
            let name = ServerName::try_from(name.to_owned()).expect("a DNS name");
            verifier.verify_server_cert(&der(&cert.cert_pem), &[], &name, &[], UnixTime::now())
        };
        assert!(verify(&b.serving, "snapdrain.ops.svc").is_ok());
        let forged = issue_serving(&b.ca, &["evil.example.com".to_owned()], now, life().serving)
            .expect("signed with the CA's key");
        let refused =
            verify(&forged, "evil.example.com").expect_err("outside the name constraints");
        assert!(
            format!("{refused:?}").contains("NameConstraint"),
            "{refused:?}"
        );
    }

    #[test]
    fn debug_output_carries_no_private_key() {
        let names = service_names("snapdrain", "ops");
        let b = renew(None, &names, life(), PROMOTE, t(0))
            .expect("issue")
            .expect("a new bundle");
        let shown = format!("{b:?}");
        assert!(shown.contains("BEGIN CERTIFICATE"), "{shown}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }

    #[test]
    fn the_serving_certificate_renews_under_the_same_ca() {
        let names = service_names("snapdrain", "ops");
        let b = renew(None, &names, life(), PROMOTE, t(0))
            .expect("issue")
            .expect("new");
        let r = renew(Some(&b), &names, life(), PROMOTE, t(250))
            .expect("issue")
            .expect("the serving certificate is due");
        assert_eq!(r.ca, b.ca);
        assert_ne!(r.serving.cert_pem, b.serving.cert_pem);
        assert_eq!(ca_bundle(&r, t(250)), b.ca.cert_pem);
    }

    #[test]
    fn a_ca_is_trusted_before_it_signs_and_the_old_one_until_it_expires() {
        let names = service_names("snapdrain", "ops");
        let b = renew(None, &names, life(), PROMOTE, t(0))
            .expect("issue")
            .expect("new");
        // Step one: the next CA is published, the serving certificate is unchanged.
        let published = renew(Some(&b), &names, life(), PROMOTE, t(2500))
            .expect("issue")
            .expect("the CA is due");
        let next = published.next_ca.clone().expect("a next CA");
        assert_eq!(published.ca, b.ca);
        assert_eq!(published.serving, b.serving);
        assert_eq!(
            ca_bundle(&published, t(2500)),
            format!("{}{}", b.ca.cert_pem, next.cert_pem)
        );
        assert!(next_due(&published, PROMOTE) <= t(2510));
        // Not promoted before it has been trusted for PROMOTE (the serving certificate, long due in
        // this jump of time, is renewed under the current CA meanwhile).
        if let Some(m) = renew(Some(&published), &names, life(), PROMOTE, t(2505)).expect("issue") {
            assert_eq!(m.ca, b.ca);
            assert_eq!(m.next_ca.as_ref(), Some(&next));
        }
        // Step two: it signs; the old CA stays trusted until it expires.
        let r = renew(Some(&published), &names, life(), PROMOTE, t(2510))
            .expect("issue")
            .expect("the next CA is promoted");
        assert_eq!(r.ca, next);
        assert_eq!(r.next_ca, None);
        assert_ne!(r.serving, b.serving);
        let bundle = ca_bundle(&r, t(2510));
        assert!(bundle.contains(&next.cert_pem) && bundle.contains(&b.ca.cert_pem));
        assert_eq!(r.previous_ca.as_ref().map(|p| p.1), Some(t(3000)));
        // Once the old CA has expired it leaves the bundle (and the Secret).
        let later = renew(Some(&r), &names, life(), PROMOTE, t(3001))
            .expect("issue")
            .expect("the expired previous CA is dropped");
        assert_eq!(later.previous_ca, None);
        assert_eq!(ca_bundle(&later, t(3001)), next.cert_pem);
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_ca() {
        let names = service_names("s", "n");
        let short = Lifetimes {
            ca: Duration::from_secs(100),
            serving: Duration::from_secs(1000),
        };
        let b = renew(None, &names, short, PROMOTE, t(0))
            .expect("issue")
            .expect("new");
        assert_eq!(b.serving.not_after, t(100));
    }
}

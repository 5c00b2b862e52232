//! Cluster PKI: the cluster CA, node certificates issued from CSRs, and the
//! rustls configurations that enforce them.
//!
//! Every node certificate carries the DNS name [`CLUSTER_SERVER_NAME`]: peers
//! are identified by the CA's signature, not by host names, because a mesh
//! node's address is whatever it advertises.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::{Arc, Mutex};
use time::{Duration as TimeDuration, OffsetDateTime};

/// The name every node certificate is valid for and every client dials.
pub const CLUSTER_SERVER_NAME: &str = "shoal";
/// ALPN id of protocol version 1 of Shoal's RPC; a node offers and
/// accepts one id per version it speaks ([`crate::protocol`]).
pub const ALPN: &[u8] = b"shoal/1";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("invalid PEM: {0}")]
    Pem(String),
    #[error("{0}")]
    Invalid(String),
}

/// The process-wide crypto provider choice, made explicit so that rustls never
/// has to guess (it panics when both ring and aws-lc-rs are linked).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The cluster CA: certificate and private key, both PEM.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CaBundle {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A node's TLS identity: its key, its certificate, and the CA it trusts.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct NodeCredentials {
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

#[cfg(test)]
thread_local! {
    /// Tests sign certificates with a validity of their choosing (expired).
    pub(crate) static TEST_VALIDITY: std::cell::Cell<Option<(OffsetDateTime, OffsetDateTime)>> =
        const { std::cell::Cell::new(None) };
}

/// How long a node certificate is valid unless the cluster says otherwise.
/// Nodes renew at two thirds of it, over their existing mTLS channel.
pub const DEFAULT_NODE_CERT_LIFETIME: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// Valid from a little before now (clocks differ between nodes; a tenth of
/// the lifetime, at most an hour) until `lifetime` from now.
fn validity(params: &mut CertificateParams, lifetime: std::time::Duration) {
    let now = OffsetDateTime::now_utc();
    let lifetime = TimeDuration::seconds(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2));
    let skew: TimeDuration = (lifetime / 10_i32).min(TimeDuration::hours(1));
    params.not_before = now - skew;
    params.not_after = now + lifetime;
}

/// When a certificate (PEM) stops being valid, and the span it was issued
/// for (`not_after - not_before`), both in seconds since the epoch.
pub fn cert_validity(cert_pem: &str) -> Option<(i64, i64)> {
    let der = pem_to_der(cert_pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

impl CaBundle {
    /// Creates a fresh CA for a new cluster.
    pub fn generate(cluster_id: &str) -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("shoal cluster CA {cluster_id}"));
        dn.push(DnType::OrganizationName, "shoal");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(
            &mut params,
            std::time::Duration::from_secs(20 * 365 * 24 * 3600),
        );
        let cert = params.self_signed(&key)?;
        Ok(CaBundle {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA of generation `generation` of cluster `cluster_id` (the
    /// one a rotation introduces): its name says which, so that two CAs of
    /// one cluster never share a subject and a chain names its issuer
    /// unambiguously.
    pub fn generate_next(cluster_id: &str, generation: u32) -> Result<Self, TlsError> {
        Self::generate(&format!("{cluster_id} #{generation}"))
    }

    /// `other`'s CA certificate signed by this CA (a cross-certificate,
    /// with `other`'s subject, key and validity): a party that trusts only
    /// this CA accepts certificates `other` signed when a chain carries it.
    pub fn cross_sign(&self, other: &CaBundle) -> Result<String, TlsError> {
        let issuer_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer =
            CertificateParams::from_ca_cert_pem(&self.cert_pem)?.self_signed(&issuer_key)?;
        let subject_key = KeyPair::from_pem(&other.key_pem)?;
        let params = CertificateParams::from_ca_cert_pem(&other.cert_pem)?;
        Ok(params.signed_by(&subject_key, &issuer, &issuer_key)?.pem())
    }

    /// Whether the key is the one the certificate was made for (a key handed
    /// over by another node is checked before it is kept).
    pub fn key_matches(&self) -> bool {
        let Ok(key) = KeyPair::from_pem(&self.key_pem) else {
            return false;
        };
        let Ok(der) = pem_to_der(&self.cert_pem) else {
            return false;
        };
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
            return false;
        };
        cert.public_key().raw == key.public_key_der().as_slice()
    }

    /// The pin a join token carries: BLAKE3 of the CA certificate's DER.
    pub fn fingerprint(&self) -> Result<String, TlsError> {
        Ok(fingerprint_der(&pem_to_der(&self.cert_pem)?))
    }

    /// Signs a node's CSR. The CA decides the subject and names, not the
    /// requester: a CSR only contributes its public key.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        node_name: &str,
        node_id: u64,
    ) -> Result<String, TlsError> {
        self.sign_csr_for(csr_pem, node_name, node_id, DEFAULT_NODE_CERT_LIFETIME)
    }

    /// [`CaBundle::sign_csr`] with a certificate valid for `lifetime`.
    pub fn sign_csr_for(
        &self,
        csr_pem: &str,
        node_name: &str,
        node_id: u64,
        lifetime: std::time::Duration,
    ) -> Result<String, TlsError> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let ca_params = CertificateParams::from_ca_cert_pem(&self.cert_pem)?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("node-{node_id}"));
        dn.push(DnType::OrganizationName, node_name);
        csr.params.distinguished_name = dn;
        csr.params.subject_alt_names = vec![SanType::DnsName(
            CLUSTER_SERVER_NAME
                .try_into()
                .map_err(|e: rcgen::Error| TlsError::Rcgen(e))?,
        )];
        csr.params.is_ca = IsCa::ExplicitNoCa;
        csr.params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        csr.params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut csr.params, lifetime);
        #[cfg(test)]
        if let Some((from, until)) = TEST_VALIDITY.with(|v| v.get()) {
            csr.params.not_before = from;
            csr.params.not_after = until;
        }
        let cert = csr.signed_by(&ca_cert, &ca_key)?;
        Ok(cert.pem())
    }

    /// Issues credentials for a node directly (the bootstrap node, tests).
    pub fn issue(&self, node_name: &str, node_id: u64) -> Result<NodeCredentials, TlsError> {
        self.issue_for(node_name, node_id, DEFAULT_NODE_CERT_LIFETIME)
    }

    /// [`CaBundle::issue`] valid for `lifetime`.
    pub fn issue_for(
        &self,
        node_name: &str,
        node_id: u64,
        lifetime: std::time::Duration,
    ) -> Result<NodeCredentials, TlsError> {
        let (key_pem, csr_pem) = new_key_and_csr(node_name)?;
        let cert_pem = self.sign_csr_for(&csr_pem, node_name, node_id, lifetime)?;
        Ok(NodeCredentials {
            key_pem,
            cert_pem,
            ca_pem: self.cert_pem.clone(),
        })
    }
}

/// A new private key and a CSR for it, as a joining node sends them.
pub fn new_key_and_csr(node_name: &str) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![CLUSTER_SERVER_NAME.to_string()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, node_name);
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// The member id a node certificate names (its subject is `CN=node-<id>`,
/// set by the CA at signing, never by the requester). `None` for anything
/// else, including the unsigned placeholder a joiner is issued as id 0.
pub fn member_id_of(cert_der: &[u8]) -> Option<u64> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    cn.strip_prefix("node-")?.parse().ok().filter(|id| *id != 0)
}

pub fn fingerprint_der(der: &[u8]) -> String {
    blake3::hash(der).to_hex().to_string()
}

/// The fingerprint of a PEM's first certificate.
pub fn fingerprint_pem(pem: &str) -> Option<String> {
    pem_to_der(pem).ok().map(|der| fingerprint_der(&der))
}

/// Each certificate of a PEM bundle, as PEM of its own.
pub fn split_certs(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(stop) = rest[start..].find(END) else {
            break;
        };
        let end = start + stop + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

/// Whether the CA certificate `ca_pem` signed `cert_pem`: the CA's key
/// verifies it as a node certificate. Its dates are not what is asked
/// (it is checked as of the middle of its validity).
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> bool {
    let (Ok(leaf), Ok(ca)) = (pem_to_der(cert_pem), pem_to_der(ca_pem)) else {
        return false;
    };
    let Some((not_before, not_after)) = cert_validity(cert_pem) else {
        return false;
    };
    let mut roots = RootCertStore::empty();
    if roots.add(CertificateDer::from(ca)).is_err() {
        return false;
    }
    let Ok(verifier) = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        crypto_provider(),
    )
    .build() else {
        return false;
    };
    let Ok(name) = ServerName::try_from(CLUSTER_SERVER_NAME) else {
        return false;
    };
    let midpoint = not_before.saturating_add(not_after.saturating_sub(not_before) / 2);
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(midpoint).unwrap_or_default(),
    ));
    verifier
        .verify_server_cert(&CertificateDer::from(leaf), &[], &name, &[], at)
        .is_ok()
}

/// Which of the CA certificates in `ca_bundle` signed `cert_pem`: its
/// fingerprint, the first that verifies it.
pub fn issuer_fingerprint(cert_pem: &str, ca_bundle: &str) -> Option<String> {
    split_certs(ca_bundle)
        .iter()
        .find(|ca| issued_by(cert_pem, ca))
        .and_then(|ca| fingerprint_pem(ca))
}

fn pem_blocks(pem: &str, label: &str) -> Vec<Vec<u8>> {
    // A tiny PEM reader: the inputs are our own files, and pulling a PEM crate
    // in for three call sites is not worth it.
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(&begin) {
        let after = &rest[start + begin.len()..];
        let Some(stop) = after.find(&end) else { break };
        let body: String = after[..stop]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Ok(bytes) = base64_decode(&body) {
            out.push(bytes);
        }
        rest = &after[stop + end.len()..];
    }
    out
}

fn base64_decode(s: &str) -> Result<Vec<u8>, ()> {
    fn val(c: u8) -> Result<u32, ()> {
        match c {
            b'A'..=b'Z' => Ok((c - b'A') as u32),
            b'a'..=b'z' => Ok((c - b'a' + 26) as u32),
            b'0'..=b'9' => Ok((c - b'0' + 52) as u32),
            b'+' => Ok(62),
            b'/' => Ok(63),
            _ => Err(()),
        }
    }
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return Err(()),
        };
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

pub fn pem_to_der(pem: &str) -> Result<Vec<u8>, TlsError> {
    pem_blocks(pem, "CERTIFICATE")
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::Pem("no CERTIFICATE block".into()))
}

pub(crate) fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let v: Vec<_> = pem_blocks(pem, "CERTIFICATE")
        .into_iter()
        .map(CertificateDer::from)
        .collect();
    if v.is_empty() {
        return Err(TlsError::Pem("no CERTIFICATE block".into()));
    }
    Ok(v)
}

pub(crate) fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let der = pem_blocks(pem, "PRIVATE KEY")
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::Pem("no PRIVATE KEY block".into()))?;
    PrivateKeyDer::try_from(der).map_err(|e| TlsError::Pem(e.to_string()))
}

impl NodeCredentials {
    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in certs(&self.ca_pem)? {
            roots.add(c)?;
        }
        Ok(roots)
    }

    /// The chain a node presents: its certificate followed by the CA, so that
    /// a joiner holding only the CA pin can check it.
    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let mut chain = certs(&self.cert_pem)?;
        chain.extend(certs(&self.ca_pem)?);
        Ok(chain)
    }

    /// Server side: clients with a CA-signed certificate are authenticated;
    /// clients without one are let in only so they can ask to join, which the
    /// RPC layer enforces via [`crate::PeerInfo::authenticated`]. A client
    /// presenting a certificate from any other CA fails the handshake.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        self.server_config_for(crate::protocol::local())
    }

    /// [`NodeCredentials::server_config`] accepting the protocol versions of
    /// `speaks` (ALPN, highest first: the server's preference decides).
    pub fn server_config_for(
        &self,
        speaks: crate::protocol::Range,
    ) -> Result<rustls::ServerConfig, TlsError> {
        let provider = crypto_provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()?), provider.clone())
                .allow_unauthenticated()
                .build()?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain()?, private_key(&self.key_pem)?)?;
        cfg.alpn_protocols = speaks.alpn();
        Ok(cfg)
    }

    /// Client side for members: verify the server against the CA, present our
    /// own certificate.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        self.client_config_for(crate::protocol::local())
    }

    /// [`NodeCredentials::client_config`] offering the protocol versions of
    /// `speaks`.
    pub fn client_config_for(
        &self,
        speaks: crate::protocol::Range,
    ) -> Result<rustls::ClientConfig, TlsError> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain()?, private_key(&self.key_pem)?)?;
        cfg.alpn_protocols = speaks.alpn();
        Ok(cfg)
    }
}

/// Client config for a node that is not a member yet: no client certificate,
/// and the server must present a chain whose CA matches `ca_pin` (the BLAKE3
/// fingerprint from the join token), so an impostor cannot harvest tokens.
pub fn joiner_client_config(
    ca_pin: &str,
) -> Result<(rustls::ClientConfig, Arc<PinnedCaVerifier>), TlsError> {
    joiner_client_config_for(ca_pin, crate::protocol::local())
}

/// [`joiner_client_config`] offering the protocol versions of `speaks`.
pub fn joiner_client_config_for(
    ca_pin: &str,
    speaks: crate::protocol::Range,
) -> Result<(rustls::ClientConfig, Arc<PinnedCaVerifier>), TlsError> {
    let provider = crypto_provider();
    let verifier = Arc::new(PinnedCaVerifier {
        pin: ca_pin.to_ascii_lowercase(),
        provider: provider.clone(),
        matched_ca: Mutex::new(None),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    cfg.alpn_protocols = speaks.alpn();
    Ok((cfg, verifier))
}

/// Accepts a server only if its chain includes the pinned CA and its leaf
/// chains to that CA (signed by it, or through a certificate it signed).
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
    matched_ca: Mutex<Option<CertificateDer<'static>>>,
}

impl PinnedCaVerifier {
    /// The CA certificate (DER) the server proved it is signed by.
    pub fn matched_ca(&self) -> Option<CertificateDer<'static>> {
        self.matched_ca.lock().ok().and_then(|g| g.clone())
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| fingerprint_der(c.as_ref()) == self.pin)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the server's CA does not match the join token's CA pin".into(),
                )
            })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        // Through the chain the server sent: during a CA rotation a node
        // with a certificate of the new CA also presents the new CA signed
        // by the old one, which a token pinning the old CA accepts.
        inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        if let Ok(mut g) = self.matched_ca.lock() {
            *g = Some(ca.clone().into_owned());
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(&self.provider, message, cert, dss, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(&self.provider, message, cert, dss, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A handshake signature checked with `provider`'s algorithms: what every
/// custom verifier of ours delegates to.
pub(crate) fn handshake_signature(
    provider: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let algorithms = &provider.signature_verification_algorithms;
    if tls13 {
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    } else {
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_signs_csr_and_fingerprint_is_stable() {
        let ca = CaBundle::generate("test").expect("ca");
        let fp1 = ca.fingerprint().expect("fp");
        assert_eq!(fp1, ca.fingerprint().expect("fp"));
        assert_eq!(fp1.len(), 64);
        let creds = ca.issue("n1", 7).expect("issue");
        assert!(creds.cert_pem.contains("BEGIN CERTIFICATE"));
        creds.server_config().expect("server config");
        creds.client_config().expect("client config");
    }

    #[test]
    fn a_certificate_names_the_member_the_ca_chose() {
        let ca = CaBundle::generate("test").expect("ca");
        let creds = ca.issue("n1", 7).expect("issue");
        let der = pem_to_der(&creds.cert_pem).expect("der");
        assert_eq!(member_id_of(&der), Some(7));
        // The CA's own certificate and garbage name no member.
        assert_eq!(member_id_of(&pem_to_der(&ca.cert_pem).expect("der")), None);
        assert_eq!(member_id_of(b"not a certificate"), None);
    }

    #[test]
    fn a_ca_key_is_checked_against_its_certificate() {
        let ca = CaBundle::generate("test").expect("ca");
        let other = CaBundle::generate("other").expect("ca");
        assert!(ca.key_matches());
        let mixed = CaBundle {
            cert_pem: ca.cert_pem.clone(),
            key_pem: other.key_pem.clone(),
        };
        assert!(!mixed.key_matches());
        let garbage = CaBundle {
            cert_pem: ca.cert_pem.clone(),
            key_pem: "junk".into(),
        };
        assert!(!garbage.key_matches());
    }

    #[test]
    fn garbage_csr_is_an_error_not_a_panic() {
        let ca = CaBundle::generate("test").expect("ca");
        assert!(ca.sign_csr("not a csr", "x", 1).is_err());
    }

    /// Runs a TLS handshake in memory; Ok when both sides accept.
    fn handshake(client: rustls::ClientConfig, server: rustls::ServerConfig) -> Result<(), String> {
        let name = ServerName::try_from(CLUSTER_SERVER_NAME).map_err(|e| e.to_string())?;
        let mut c = rustls::ClientConnection::new(Arc::new(client), name.to_owned())
            .map_err(|e| e.to_string())?;
        let mut s = rustls::ServerConnection::new(Arc::new(server)).map_err(|e| e.to_string())?;
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).map_err(|e| e.to_string())?;
            s.read_tls(&mut buf.as_slice()).map_err(|e| e.to_string())?;
            s.process_new_packets()
                .map_err(|e| format!("server: {e}"))?;
            let mut buf = Vec::new();
            s.write_tls(&mut buf).map_err(|e| e.to_string())?;
            c.read_tls(&mut buf.as_slice()).map_err(|e| e.to_string())?;
            c.process_new_packets()
                .map_err(|e| format!("client: {e}"))?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return Ok(());
            }
        }
        Err("the handshake did not finish".into())
    }

    /// An old CA, its successor, and the successor signed by the old one.
    fn rotation() -> (CaBundle, CaBundle, String) {
        let old = CaBundle::generate("c").expect("ca");
        let new = CaBundle::generate_next("c", 1).expect("ca");
        let cross = old.cross_sign(&new).expect("cross-sign");
        (old, new, cross)
    }

    fn with_trust(creds: NodeCredentials, cas: &[&str]) -> NodeCredentials {
        NodeCredentials {
            ca_pem: cas.concat(),
            ..creds
        }
    }

    #[test]
    fn peers_accept_either_ca_during_a_rotation_and_only_the_new_one_after() {
        let (old, new, cross) = rotation();
        let both = [old.cert_pem.as_str(), new.cert_pem.as_str(), cross.as_str()];
        let old_node = with_trust(old.issue("n1", 1).expect("issue"), &both);
        let new_node = with_trust(new.issue("n2", 2).expect("issue"), &both);
        // Trusting both, each side accepts the other's certificate.
        handshake(
            old_node.client_config().expect("client"),
            new_node.server_config().expect("server"),
        )
        .expect("an old certificate is accepted during the rotation");
        handshake(
            new_node.client_config().expect("client"),
            old_node.server_config().expect("server"),
        )
        .expect("a new certificate is accepted during the rotation");
        // After the retirement: the new CA alone.
        let retired = with_trust(new.issue("n3", 3).expect("issue"), &[&new.cert_pem]);
        assert!(
            handshake(
                old_node.client_config().expect("client"),
                retired.server_config().expect("server"),
            )
            .is_err(),
            "a client with a certificate of the retired CA was accepted"
        );
        assert!(
            handshake(
                retired.client_config().expect("client"),
                old_node.server_config().expect("server"),
            )
            .is_err(),
            "a server with a certificate of the retired CA was accepted"
        );
        handshake(
            new_node.client_config().expect("client"),
            retired.server_config().expect("server"),
        )
        .expect("the new CA's certificates still work");
    }

    #[test]
    fn a_join_token_pinning_the_old_ca_verifies_a_node_of_the_new_one_through_the_cross_certificate(
    ) {
        let (old, new, cross) = rotation();
        let old_pin = old.fingerprint().expect("fp");
        let served = |cas: &[&str]| {
            with_trust(new.issue("n1", 1).expect("issue"), cas)
                .server_config()
                .expect("server")
        };
        let joiner = || joiner_client_config(&old_pin).expect("joiner").0;
        handshake(joiner(), served(&[&old.cert_pem, &new.cert_pem, &cross]))
            .expect("the old pin verifies a new certificate through the cross-certificate");
        assert!(
            handshake(joiner(), served(&[&old.cert_pem, &new.cert_pem])).is_err(),
            "without the cross-certificate the old CA vouches for nothing the new one signed"
        );
        assert!(
            handshake(joiner(), served(&[&new.cert_pem])).is_err(),
            "after the retirement an old pin is refused"
        );
        let new_pin = new.fingerprint().expect("fp");
        handshake(
            joiner_client_config(&new_pin).expect("joiner").0,
            served(&[&new.cert_pem]),
        )
        .expect("a token pinning the new CA");
    }

    #[test]
    fn the_issuer_of_a_certificate_is_found_in_a_bundle() {
        let (old, new, cross) = rotation();
        let bundle = format!("{}{}{}", old.cert_pem, new.cert_pem, cross);
        assert_eq!(split_certs(&bundle).len(), 3);
        assert_eq!(
            fingerprint_pem(&split_certs(&bundle)[1]),
            Some(new.fingerprint().expect("fp"))
        );
        let by_old = old.issue("n1", 1).expect("issue").cert_pem;
        let by_new = new.issue("n1", 1).expect("issue").cert_pem;
        assert_eq!(
            issuer_fingerprint(&by_old, &bundle),
            Some(old.fingerprint().expect("fp"))
        );
        assert_eq!(
            issuer_fingerprint(&by_new, &bundle),
            Some(new.fingerprint().expect("fp"))
        );
        assert!(issued_by(&by_new, &new.cert_pem));
        assert!(!issued_by(&by_new, &old.cert_pem));
        assert_eq!(issuer_fingerprint(&by_old, &new.cert_pem), None);
        assert_eq!(issuer_fingerprint("garbage", &bundle), None);
        // The two CAs of one cluster have different subjects.
        assert_ne!(
            CertificateParams::from_ca_cert_pem(&old.cert_pem)
                .expect("params")
                .distinguished_name,
            CertificateParams::from_ca_cert_pem(&new.cert_pem)
                .expect("params")
                .distinguished_name
        );
    }

    #[test]
    fn base64_roundtrip_of_known_value() {
        assert_eq!(base64_decode("aGVsbG8=").expect("b64"), b"hello");
        assert!(base64_decode("a").is_err());
    }
}

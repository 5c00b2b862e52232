//! TLS for the HTTP API: a node serves it with its cluster certificate, and
//! the CLI accepts a node only if that certificate chains to the cluster CA it
//! was told to trust (at `shoal login`). Like the RPC, the API identifies a
//! node by the CA's signature and the cluster name in every node certificate,
//! never by the host name or address it was reached at: nodes publish
//! whatever address they advertise.

use crate::tls::CLUSTER_SERVER_NAME;
use crate::tls::{
    certs, crypto_provider, fingerprint_der, handshake_signature, private_key, NodeCredentials,
    TlsError,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::{Arc, Mutex, RwLock};

/// The certificate the API serves, replaced in place when the node's
/// certificate is renewed (handshakes after that present the new one).
#[derive(Debug)]
pub struct ApiCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ApiCertificate {
    pub fn new(creds: &NodeCredentials) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(ApiCertificate {
            current: RwLock::new(certified_key(creds)?),
        }))
    }

    /// Serves `creds` from the next handshake on.
    pub fn set(&self, creds: &NodeCredentials) -> Result<(), TlsError> {
        let key = certified_key(creds)?;
        if let Ok(mut current) = self.current.write() {
            *current = key;
        }
        Ok(())
    }

    /// The server side: no client certificate (callers prove themselves
    /// with bearer tokens), HTTP/1.1 only.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// The node's certificate followed by its CA, so that a client that pins
/// only the CA's fingerprint can check the chain.
fn certified_key(creds: &NodeCredentials) -> Result<Arc<CertifiedKey>, TlsError> {
    let mut chain = certs(&creds.cert_pem)?;
    chain.extend(certs(&creds.ca_pem)?);
    let key = crypto_provider()
        .key_provider
        .load_private_key(private_key(&creds.key_pem)?)?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
}

impl ResolvesServerCert for ApiCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|k| k.clone())
    }
}

/// What a client trusts when it checks a node's API certificate.
#[derive(Clone, Debug)]
pub enum ApiTrust {
    /// The cluster CA certificates (PEM; several while a CA rotates).
    Cas(String),
    /// Only a CA with this fingerprint (BLAKE3 of its DER, as in join
    /// tokens and `shoal status`), presented in the server's chain.
    Pinned(String),
    /// The CA in the server's chain, whatever it is: `shoal login`'s first
    /// contact, which records the CA it saw for every later call.
    FirstUse,
    /// Nothing yet: every https node is refused, saying how to trust one.
    Missing,
}

/// Checks a node's API certificate: validly signed by a trusted cluster CA
/// and issued for the cluster name, whatever address was dialled.
#[derive(Debug)]
pub struct ApiServerVerifier {
    trust: ApiTrust,
    provider: Arc<CryptoProvider>,
    seen_ca: Mutex<Option<CertificateDer<'static>>>,
}

impl ApiServerVerifier {
    pub fn new(trust: ApiTrust) -> Arc<Self> {
        Arc::new(ApiServerVerifier {
            trust,
            provider: crypto_provider(),
            seen_ca: Mutex::new(None),
        })
    }

    /// The CA the last accepted server was signed by (DER).
    pub fn seen_ca(&self) -> Option<CertificateDer<'static>> {
        self.seen_ca.lock().ok().and_then(|g| g.clone())
    }

    /// The CA certificates to check `end_entity` against.
    fn candidates(
        &self,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<Vec<CertificateDer<'static>>, rustls::Error> {
        let general = |m: &str| rustls::Error::General(m.to_string());
        match &self.trust {
            ApiTrust::Cas(pem) => {
                certs(pem).map_err(|e| general(&format!("the trusted cluster CA: {e}")))
            }
            ApiTrust::Pinned(pin) => intermediates
                .iter()
                .find(|c| fingerprint_der(c.as_ref()) == pin.to_ascii_lowercase())
                .map(|c| vec![c.clone().into_owned()])
                .ok_or_else(|| general("the node's CA does not match the pinned CA fingerprint")),
            ApiTrust::FirstUse => Ok(intermediates
                .iter()
                .map(|c| c.clone().into_owned())
                .collect()),
            ApiTrust::Missing => Err(general(
                "no cluster CA is trusted yet (`shoal login URL` records one; SHOAL_CA_FILE names one)",
            )),
        }
    }
}

impl ServerCertVerifier for ApiServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cluster_name = ServerName::try_from(CLUSTER_SERVER_NAME)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let mut last_error =
            rustls::Error::General("the node presented no cluster CA certificate".into());
        for ca in self.candidates(intermediates)? {
            let mut roots = RootCertStore::empty();
            if roots.add(ca.clone()).is_err() {
                continue;
            }
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                    .build()
                    .map_err(|e| rustls::Error::General(e.to_string()))?;
            // A trusted CA accepts a node through the chain it sent: during
            // a CA rotation that carries the new CA signed by the old one.
            // First use records the CA that signed the node itself.
            let chain = match self.trust {
                ApiTrust::FirstUse | ApiTrust::Missing => &[],
                ApiTrust::Cas(_) | ApiTrust::Pinned(_) => intermediates,
            };
            match inner.verify_server_cert(end_entity, chain, &cluster_name, ocsp_response, now) {
                Ok(ok) => {
                    if let Ok(mut g) = self.seen_ca.lock() {
                        *g = Some(ca);
                    }
                    return Ok(ok);
                }
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
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

/// A client configuration that checks nodes with `verifier`.
pub fn api_client_config(
    verifier: Arc<ApiServerVerifier>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// PEM of a DER certificate.
pub fn der_to_pem(der: &[u8]) -> String {
    let b64 = base64_encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.len();
        let acc = (chunk[0] as u32) << 16
            | (chunk.get(1).copied().unwrap_or(0) as u32) << 8
            | chunk.get(2).copied().unwrap_or(0) as u32;
        for i in 0..4 {
            if i <= n {
                out.push(ALPHABET[(acc >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{pem_to_der, CaBundle};

    /// Runs a TLS handshake in memory; the client's verdict on the server.
    fn handshake(client: rustls::ClientConfig, server: rustls::ServerConfig) -> Result<(), String> {
        let name = ServerName::try_from("10.1.2.3").map_err(|e| e.to_string())?;
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
            c.process_new_packets().map_err(|e| e.to_string())?;
            if !c.is_handshaking() {
                return Ok(());
            }
        }
        Err("the handshake did not finish".into())
    }

    fn client(trust: ApiTrust) -> (rustls::ClientConfig, Arc<ApiServerVerifier>) {
        let verifier = ApiServerVerifier::new(trust);
        (
            api_client_config(verifier.clone()).expect("client"),
            verifier,
        )
    }

    #[test]
    fn a_node_is_accepted_by_its_cluster_ca_at_any_address() {
        let ca = CaBundle::generate("c").expect("ca");
        let served = ApiCertificate::new(&ca.issue("n1", 1).expect("issue")).expect("cert");
        let (cfg, verifier) = client(ApiTrust::Cas(ca.cert_pem.clone()));
        handshake(cfg, served.server_config().expect("server")).expect("accepted");
        let seen = verifier.seen_ca().expect("seen");
        assert_eq!(
            seen.as_ref(),
            pem_to_der(&ca.cert_pem).expect("der").as_slice()
        );
    }

    #[test]
    fn a_node_of_another_ca_is_refused() {
        let ca = CaBundle::generate("c").expect("ca");
        let impostor = CaBundle::generate("evil").expect("ca");
        let served = ApiCertificate::new(&impostor.issue("n1", 1).expect("issue")).expect("cert");
        let server = served.server_config().expect("server");
        let (cfg, _) = client(ApiTrust::Cas(ca.cert_pem.clone()));
        assert!(handshake(cfg, server.clone()).is_err());
        let (cfg, _) = client(ApiTrust::Pinned(ca.fingerprint().expect("fp")));
        assert!(handshake(cfg, server).is_err());
    }

    #[test]
    fn a_pinned_fingerprint_accepts_only_its_ca_and_first_use_records_it() {
        let ca = CaBundle::generate("c").expect("ca");
        let served = ApiCertificate::new(&ca.issue("n1", 1).expect("issue")).expect("cert");
        let server = served.server_config().expect("server");
        let (cfg, _) = client(ApiTrust::Pinned(
            ca.fingerprint().expect("fp").to_uppercase(),
        ));
        handshake(cfg, server.clone()).expect("pinned");
        let (cfg, verifier) = client(ApiTrust::FirstUse);
        handshake(cfg, server).expect("first use");
        let seen = verifier.seen_ca().expect("seen");
        assert_eq!(
            fingerprint_der(seen.as_ref()),
            ca.fingerprint().expect("fp")
        );
        assert_eq!(der_to_pem(seen.as_ref()).trim(), ca.cert_pem.trim());
    }

    #[test]
    fn a_client_trusting_the_old_ca_accepts_a_node_of_the_new_one_during_a_rotation() {
        let old = CaBundle::generate("c").expect("ca");
        let new = CaBundle::generate_next("c", 1).expect("ca");
        let cross = old.cross_sign(&new).expect("cross");
        let during = NodeCredentials {
            ca_pem: format!("{}{}{}", old.cert_pem, new.cert_pem, cross),
            ..new.issue("n1", 1).expect("issue")
        };
        let served = ApiCertificate::new(&during).expect("cert");
        let (cfg, _) = client(ApiTrust::Cas(old.cert_pem.clone()));
        handshake(cfg, served.server_config().expect("server")).expect("during the rotation");
        // A first contact during the rotation records the CA that signed
        // the node, the one that stays.
        let (cfg, verifier) = client(ApiTrust::FirstUse);
        handshake(cfg, served.server_config().expect("server")).expect("first use");
        let seen = verifier.seen_ca().expect("seen");
        assert_eq!(
            fingerprint_der(seen.as_ref()),
            new.fingerprint().expect("fp")
        );
        let after = NodeCredentials {
            ca_pem: new.cert_pem.clone(),
            ..during
        };
        let served = ApiCertificate::new(&after).expect("cert");
        let (cfg, _) = client(ApiTrust::Cas(old.cert_pem.clone()));
        assert!(handshake(cfg, served.server_config().expect("server")).is_err());
    }

    #[test]
    fn a_renewed_certificate_is_served_from_the_next_handshake() {
        let old = CaBundle::generate("old").expect("ca");
        let new = CaBundle::generate("new").expect("ca");
        let served = ApiCertificate::new(&old.issue("n1", 1).expect("issue")).expect("cert");
        let server = served.server_config().expect("server");
        served
            .set(&new.issue("n1", 1).expect("issue"))
            .expect("set");
        let (cfg, _) = client(ApiTrust::Cas(new.cert_pem.clone()));
        handshake(cfg, server).expect("the new certificate is served");
    }
}

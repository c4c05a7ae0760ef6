//! Mutual TLS without a CA: every box has a self-signed certificate, and
//! each side pins the peers it accepts by the SHA-256 fingerprint of their
//! certificate, with a role per pinned peer. A certificate that is not
//! pinned is refused inside the TLS handshake, before any application byte.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use serde::{Deserialize, Serialize};

/// The ALPN protocol name of twinlog connections.
pub const ALPN: &[u8] = b"twinlog/1";
/// The server name every certificate carries; identity is the fingerprint.
pub const SERVER_NAME: &str = "twinlog";

/// What a TLS set-up refuses.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("key: {0}")]
    Key(String),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("bad fingerprint {0:?}: expected 64 hex digits")]
    Fingerprint(String),
}

/// The SHA-256 of a certificate's DER bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(cert: &CertificateDer<'_>) -> Fingerprint {
        let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
        let mut fp = [0u8; 32];
        fp.copy_from_slice(digest.as_ref());
        Fingerprint(fp)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = TlsError;

    /// 64 hex digits; colons and a `sha256:` prefix are allowed.
    fn from_str(s: &str) -> Result<Self, TlsError> {
        let hex: String = s
            .trim()
            .trim_start_matches("sha256:")
            .chars()
            .filter(|&c| c != ':')
            .collect();
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(TlsError::Fingerprint(s.to_string()));
        }
        let mut fp = [0u8; 32];
        for (i, b) in fp.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| TlsError::Fingerprint(s.to_string()))?;
        }
        Ok(Fingerprint(fp))
    }
}

/// What a pinned peer may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The primary a twin follows.
    Primary,
    /// The twin a primary streams to.
    Twin,
    /// A client appending and reading.
    Client,
    /// A box being restored from a twin.
    Restore,
}

/// The peers a box accepts, by fingerprint, each with its role; and the
/// last certificates it refused, so a status can say who knocked.
#[derive(Clone, Debug, Default)]
pub struct Pins(HashMap<Fingerprint, (Role, Option<u64>)>, Arc<RefusedLog>);

/// The certificates refused: the last few, how many in all, and the
/// warnings about them, at most one a second however many knock.
#[derive(Debug, Default)]
pub struct RefusedLog {
    last: std::sync::Mutex<Vec<Refused>>,
    total: std::sync::atomic::AtomicU64,
    warn: super::Throttle,
}

/// A certificate refused because it is not pinned.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refused {
    /// Its fingerprint, as `pin` takes it.
    pub fingerprint: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// How many refusals [`Pins::refused`] remembers.
const REFUSALS_KEPT: usize = 8;

impl Pins {
    /// The last certificates refused, oldest first, each once.
    pub fn refused(&self) -> Vec<Refused> {
        self.1
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Handshakes refused because the certificate is not pinned, since
    /// start.
    pub fn refused_total(&self) -> u64 {
        self.1.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note_refused(&self, fp: &Fingerprint) {
        self.1
            .total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // An outsider may knock as often as it likes: the log says so once
        // a second, with how many it stands for.
        if let Some(knocks) = self.1.warn.allow(std::time::Duration::from_secs(1)) {
            tracing::warn!(fingerprint = %fp, knocks, "refused a certificate that is not pinned");
        }
        let at_ms = crate::repl::Now::system().unix_ms;
        let mut r = self.1.last.lock().unwrap_or_else(|e| e.into_inner());
        let fingerprint = fp.to_string();
        r.retain(|x| x.fingerprint != fingerprint);
        r.push(Refused { fingerprint, at_ms });
        if r.len() > REFUSALS_KEPT {
            r.remove(0);
        }
    }

    pub fn new() -> Pins {
        Pins::default()
    }

    /// Accept `fp` in `role`.
    pub fn pin(mut self, fp: Fingerprint, role: Role) -> Pins {
        self.0.insert(fp, (role, None));
        self
    }

    /// Accept `fp` in `role` until `until_ms` (ms since the Unix epoch):
    /// from then on its handshakes are refused as if it were not pinned.
    pub fn pin_until(mut self, fp: Fingerprint, role: Role, until_ms: u64) -> Pins {
        self.0.insert(fp, (role, Some(until_ms)));
        self
    }

    /// The role of a pinned peer whose pin has not expired.
    pub fn role(&self, fp: &Fingerprint) -> Option<Role> {
        let (role, until) = self.0.get(fp).copied()?;
        match until {
            Some(until) if crate::repl::Now::system().unix_ms >= until => None,
            _ => Some(role),
        }
    }

    /// When a pinned peer's pin expires (ms since the Unix epoch); None
    /// for a pin without an expiry, or no pin.
    pub fn expiry(&self, fp: &Fingerprint) -> Option<u64> {
        self.0.get(fp).and_then(|&(_, until)| until)
    }

    /// Whether any peer is pinned in `role`.
    pub fn has_role(&self, role: Role) -> bool {
        self.0.values().any(|&(r, _)| r == role)
    }
}

/// A box's own certificate and key.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    cert_pem: String,
    key_pem: String,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A new key and a self-signed certificate for it.
    pub fn mint() -> Result<Identity, TlsError> {
        let minted = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        Self::from_pem(&minted.cert.pem(), &minted.signing_key.serialize_pem())
    }

    /// From PEM text of the certificate and of the PKCS#8 key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Identity, TlsError> {
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        let key = PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Key(e.to_string()))?;
        Ok(Identity {
            cert,
            key,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    /// The certificate as PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The key as PEM (keep it 0600).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// What a peer pins to accept this box.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.cert)
    }

    /// The private key's PKCS#8 bytes, to derive this box's other secrets
    /// from (see `reset`).
    pub(crate) fn secret_der(&self) -> &[u8] {
        self.key.secret_pkcs8_der()
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
}

fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    // AES-128-GCM first: 128-bit security, and fewer rounds per byte than
    // AES-256 on a link whose cost is the CPU (QUIC seals every packet).
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// Accepts exactly the pinned certificates; the handshake signature is
/// checked as usual, so the peer proves it holds the pinned key.
#[derive(Debug)]
struct PinnedVerifier {
    pins: Arc<Pins>,
    provider: Arc<CryptoProvider>,
}

impl PinnedVerifier {
    fn check(&self, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let fp = Fingerprint::of(cert);
        if self.pins.role(&fp).is_some() {
            Ok(())
        } else {
            self.pins.note_refused(&fp);
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn tls12(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn tls13(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

impl ClientCertVerifier for PinnedVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

/// The rustls server side: this identity, client certificates required and
/// pinned.
pub fn server_tls(identity: &Identity, pins: Arc<Pins>) -> Result<rustls::ServerConfig, TlsError> {
    let verifier = Arc::new(PinnedVerifier {
        pins,
        provider: provider(),
    });
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![identity.cert.clone()], identity.key())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// The rustls client side: this identity as client certificate, the
/// server's certificate pinned.
pub fn client_tls(identity: &Identity, pins: Arc<Pins>) -> Result<rustls::ClientConfig, TlsError> {
    let verifier = Arc::new(PinnedVerifier {
        pins,
        provider: provider(),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(vec![identity.cert.clone()], identity.key())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_expired_pin_is_no_pin() {
        let (fresh, stale) = (Fingerprint([1; 32]), Fingerprint([2; 32]));
        let now = crate::repl::Now::system().unix_ms;
        let pins = Pins::new()
            .pin_until(fresh, Role::Restore, now + 3_600_000)
            .pin_until(stale, Role::Restore, now.saturating_sub(1));
        assert_eq!(pins.role(&fresh), Some(Role::Restore));
        assert_eq!(pins.role(&stale), None, "refused like an unpinned peer");
    }

    use super::*;

    #[test]
    fn fingerprints_print_and_parse_back() {
        let fp = Fingerprint([0xab; 32]);
        let s = fp.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(s.parse::<Fingerprint>().expect("parse"), fp);
        assert_eq!(
            format!("sha256:{s}")
                .parse::<Fingerprint>()
                .expect("prefix"),
            fp
        );
        assert!("abc".parse::<Fingerprint>().is_err());
        assert!("zz".repeat(32).parse::<Fingerprint>().is_err());
    }

    #[test]
    fn identities_survive_pem() {
        let id = Identity::mint().expect("mint");
        let back = Identity::from_pem(id.cert_pem(), id.key_pem()).expect("pem");
        assert_eq!(back.fingerprint(), id.fingerprint());
        assert_eq!(back.key.secret_pkcs8_der(), id.key.secret_pkcs8_der());
        assert!(Identity::from_pem("garbage", id.key_pem()).is_err());
        assert!(Identity::from_pem(id.cert_pem(), "garbage").is_err());
    }
}

//! Stateless resets that outlive the process.
//!
//! A process that dies leaves its peers holding connections nobody knows
//! any more. When the next process on the same address receives their
//! packets, QUIC lets it answer each with a stateless reset (RFC 9000
//! §10.3): the 16-byte token the dead process announced for that
//! connection ID, which the peer checks and then drops the connection at
//! once instead of waiting out its idle timeout.
//!
//! The token is an HMAC of the connection ID, so the new process can
//! compute the old one's tokens only with the same key: the key is derived
//! from the box's private key, the one secret that is the box and stays the
//! same across restarts. quinn also drops, without a reset, a packet whose
//! connection ID does not carry the check its generator puts in every ID;
//! that generator's key is derived the same way, or a restarted process
//! would not recognize its predecessor's IDs.

use std::sync::Arc;

use ring::{hkdf, hmac};

use super::tls::{Identity, TlsError};

/// The HKDF salt: names what the keys are for, so they are unrelated to
/// anything else ever derived from the same private key.
const SALT: &[u8] = b"twinlog/1 stateless reset";
const RESET_INFO: &[u8] = b"reset key";
const CID_INFO: &[u8] = b"connection id check";

/// What an endpoint needs to reset its predecessor's connections.
pub struct ResetKeys {
    /// Signs connection IDs into reset tokens.
    pub reset: hmac::Key,
    /// Keys the check in every connection ID this box issues.
    pub cid: u64,
}

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl ResetKeys {
    /// The keys of the box whose identity this is: the same for every
    /// endpoint and every process built from it.
    pub fn of(identity: &Identity) -> Result<ResetKeys, TlsError> {
        // HKDF-SHA256 (RFC 5869): extract from the PKCS#8 key, expand once
        // per use.
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(identity.secret_der());
        let failed = |_| TlsError::Key("deriving the stateless reset keys".into());
        let reset = hmac::Key::from(
            prk.expand(&[RESET_INFO], hmac::HMAC_SHA256)
                .map_err(failed)?,
        );
        let mut cid = [0u8; 8];
        prk.expand(&[CID_INFO], Len(cid.len()))
            .and_then(|okm| okm.fill(&mut cid))
            .map_err(failed)?;
        Ok(ResetKeys {
            reset,
            cid: u64::from_le_bytes(cid),
        })
    }

    /// An endpoint configuration that resets, and recognizes, the
    /// connections of earlier processes of this box.
    pub fn endpoint_config(self) -> quinn::EndpointConfig {
        let mut cfg = quinn::EndpointConfig::new(Arc::new(self.reset));
        let cid = self.cid;
        cfg.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid))
        });
        // The peer may send packets as large as this side grows its own
        // (within quinn's bounds, 1,200..=65,527, by construction).
        let _ = cfg.max_udp_payload_size(super::MAX_UDP_PAYLOAD);
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(k: &ResetKeys, cid: &[u8]) -> Vec<u8> {
        hmac::sign(&k.reset, cid).as_ref().to_vec()
    }

    #[test]
    fn one_identity_gives_one_key_and_another_identity_another() {
        let id = Identity::mint().expect("mint");
        // The same key read back from its PEM, as a restarted daemon does.
        let again = Identity::from_pem(id.cert_pem(), id.key_pem()).expect("pem");
        let other = Identity::mint().expect("mint");
        let (a, b, c) = (
            ResetKeys::of(&id).expect("keys"),
            ResetKeys::of(&again).expect("keys"),
            ResetKeys::of(&other).expect("keys"),
        );
        let cid = [7u8; 8];
        assert_eq!(sign(&a, &cid), sign(&b, &cid));
        assert_eq!(a.cid, b.cid);
        assert_ne!(sign(&a, &cid), sign(&c, &cid));
        assert_ne!(a.cid, c.cid);
    }
}

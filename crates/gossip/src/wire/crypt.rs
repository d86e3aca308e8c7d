//! memberlist's encryption (Consul's `encrypt` key): AES-GCM with a
//! 12-byte random nonce. A packet is `[version][nonce][ciphertext + tag]`;
//! version 1 (what Consul speaks) has no padding, version 0 pads to the
//! block size (PKCS#7) and is read for old peers. The authenticated data is
//! the gossip label of a packet; a stream message is framed as
//! `[10][length u32][packet]` and authenticates those five bytes plus the
//! label.

use base64::Engine;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use super::WireError;

/// Bytes an encrypted packet adds: version, nonce, tag.
pub const OVERHEAD: usize = 1 + NONCE_LEN + 16;

/// The keys a member accepts, the first one used to encrypt (Consul's
/// keyring: the primary key, then the others being rotated in or out).
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<LessSafeKey>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({} keys)", self.keys.len())
    }
}

impl Keyring {
    /// Parses keys as `consul keygen` prints them (base64 of 16 or 32
    /// bytes); the first is the primary.
    pub fn from_base64(keys: &[impl AsRef<str>]) -> Result<Self, WireError> {
        if keys.is_empty() {
            return Err(WireError::Key("no key given".into()));
        }
        let keys = keys
            .iter()
            .map(|k| {
                let k = k.as_ref().trim();
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(k)
                    .map_err(|e| WireError::Key(format!("{k:?} is not base64: {e}")))?;
                let alg = match raw.len() {
                    16 => &AES_128_GCM,
                    32 => &AES_256_GCM,
                    24 => {
                        return Err(WireError::Key(
                            "a 24-byte (AES-192) key is not supported; use 16 or 32 bytes (consul keygen makes 32)".into(),
                        ));
                    }
                    n => {
                        return Err(WireError::Key(format!(
                            "a key is 16 or 32 bytes of base64 (consul keygen), this one is {n} bytes"
                        )));
                    }
                };
                let key = UnboundKey::new(alg, &raw).map_err(|_| WireError::Key("rejected by AES".into()))?;
                Ok(LessSafeKey::new(key))
            })
            .collect::<Result<Vec<_>, WireError>>()?;
        Ok(Keyring { keys })
    }

    /// Encrypts `msg` (version 1) with the primary key, `aad` authenticated.
    pub fn seal(&self, msg: &[u8], aad: &[u8], out: &mut Vec<u8>) {
        let mut nonce = [0u8; NONCE_LEN];
        nonce.iter_mut().for_each(|b| *b = fastrand::u8(..));
        out.reserve(msg.len() + OVERHEAD);
        out.push(1);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(msg);
        let tag = self.keys[0]
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[start..],
            )
            .expect("AES-GCM seals any length below 64 GiB");
        out.extend_from_slice(tag.as_ref());
    }

    /// Decrypts a packet with any key of the ring.
    pub fn open(&self, packet: &[u8], aad: &[u8]) -> Result<Vec<u8>, WireError> {
        let (&vsn, rest) = packet.split_first().ok_or(WireError::Truncated)?;
        if vsn > 1 {
            return Err(WireError::Crypt(format!(
                "unknown encryption version {vsn}"
            )));
        }
        if packet.len() < OVERHEAD {
            return Err(WireError::Crypt(format!(
                "{} bytes are too few for an encrypted message",
                packet.len()
            )));
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        for key in &self.keys {
            let mut buf = sealed.to_vec();
            let nonce =
                Nonce::try_assume_unique_for_key(nonce).map_err(|_| WireError::Truncated)?;
            if let Ok(plain) = key.open_in_place(nonce, Aad::from(aad), &mut buf) {
                let n = plain.len();
                buf.truncate(n);
                if vsn == 0 {
                    let pad = usize::from(*buf.last().ok_or(WireError::Truncated)?);
                    if pad == 0 || pad > 16 || pad > buf.len() {
                        return Err(WireError::Crypt("bad padding".into()));
                    }
                    buf.truncate(buf.len() - pad);
                }
                return Ok(buf);
            }
        }
        Err(WireError::Crypt(
            "no key of the keyring decrypts it (a different --gossip-key than the cluster's?)"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";

    #[test]
    fn sealed_opens_and_another_key_or_label_does_not() {
        let ring = Keyring::from_base64(&[KEY]).unwrap();
        let mut out = Vec::new();
        ring.seal(b"hello gossip", b"label", &mut out);
        assert_eq!(out.len(), 12 + OVERHEAD);
        assert_eq!(out[0], 1);
        assert_eq!(ring.open(&out, b"label").unwrap(), b"hello gossip");
        assert!(matches!(
            ring.open(&out, b"other"),
            Err(WireError::Crypt(_))
        ));
        let other = Keyring::from_base64(&["AAAAAAAAAAAAAAAAAAAAAA=="]).unwrap();
        let err = other.open(&out, b"label").unwrap_err().to_string();
        assert!(err.contains("--gossip-key"), "{err}");
        // A ring with the old key second still reads it (rotation).
        let both = Keyring::from_base64(&["AAAAAAAAAAAAAAAAAAAAAA==", KEY]).unwrap();
        assert_eq!(both.open(&out, b"label").unwrap(), b"hello gossip");
    }

    #[test]
    fn bad_keys_are_refused_in_plain_words() {
        let e = Keyring::from_base64(&["not base64!"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not base64"), "{e}");
        let e = Keyring::from_base64(&["AAAA"]).unwrap_err().to_string();
        assert!(e.contains("16 or 32 bytes"), "{e}");
        let e = Keyring::from_base64(&["AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("AES-192"), "{e}");
    }

    #[test]
    fn short_or_unknown_versions_are_errors_not_panics() {
        let ring = Keyring::from_base64(&[KEY]).unwrap();
        assert!(ring.open(&[], b"").is_err());
        assert!(ring.open(&[1, 2, 3], b"").is_err());
        assert!(ring.open(&[7; 40], b"").is_err());
    }
}

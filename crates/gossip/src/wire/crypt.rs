//! memberlist's encryption (Consul's `encrypt` key): AES-GCM with a
//! 12-byte random nonce. A packet is `[version][nonce][ciphertext + tag]`;
//! version 1 (what Consul speaks) has no padding, version 0 pads to the
//! block size (PKCS#7) and is read for old peers. The authenticated data is
//! the gossip label of a packet; a stream message is framed as
//! `[10][length u32][packet]` and authenticates those five bytes plus the
//! label.

use std::sync::{Arc, RwLock};

use base64::Engine;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use super::WireError;

/// Bytes an encrypted packet adds: version, nonce, tag.
pub const OVERHEAD: usize = 1 + NONCE_LEN + 16;

/// The keys a member accepts, the first one used to encrypt (Consul's
/// keyring: the primary key, then the others being rotated in or out).
/// Clones share one ring: serf's keyring queries change it under the
/// sockets that use it ([`Keyring::detached`] makes one of its own).
#[derive(Clone)]
pub struct Keyring {
    ring: Arc<RwLock<Ring>>,
}

/// The keys, as given and ready for AES-GCM, primary first.
struct Ring {
    raw: Vec<Vec<u8>>,
    keys: Vec<LessSafeKey>,
}

/// Why a keyring query could not change the ring (the Display text is
/// memberlist's, which the answer carries back to `consul keyring`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    /// Not 16, 24 or 32 bytes.
    #[error("key size must be 16, 24 or 32 bytes")]
    Size(usize),
    /// A 24-byte key, which memberlist takes and this crate's AES does not.
    #[error("a 24-byte (AES-192) key is not supported by agent-sim")]
    Aes192,
    /// `use` of a key the ring does not hold.
    #[error("Requested key is not in the keyring")]
    NotInRing,
    /// `remove` of the primary key.
    #[error("Removing the primary key is not allowed")]
    RemovePrimary,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({} keys)", self.read().keys.len())
    }
}

/// A key ready for AES-GCM.
fn cipher(raw: &[u8]) -> Result<LessSafeKey, KeyringError> {
    let alg = match raw.len() {
        16 => &AES_128_GCM,
        32 => &AES_256_GCM,
        24 => return Err(KeyringError::Aes192),
        n => return Err(KeyringError::Size(n)),
    };
    let key = UnboundKey::new(alg, raw).map_err(|_| KeyringError::Size(raw.len()))?;
    Ok(LessSafeKey::new(key))
}

impl Keyring {
    /// Parses keys as `consul keygen` prints them (base64 of 16 or 32
    /// bytes); the first is the primary.
    pub fn from_base64(keys: &[impl AsRef<str>]) -> Result<Self, WireError> {
        if keys.is_empty() {
            return Err(WireError::Key("no key given".into()));
        }
        let mut ring = Ring {
            raw: Vec::new(),
            keys: Vec::new(),
        };
        for k in keys {
            let k = k.as_ref().trim();
            let raw = base64::engine::general_purpose::STANDARD
                .decode(k)
                .map_err(|e| WireError::Key(format!("{k:?} is not base64: {e}")))?;
            let key = cipher(&raw).map_err(|e| match e {
                KeyringError::Aes192 => WireError::Key(
                    "a 24-byte (AES-192) key is not supported; use 16 or 32 bytes (consul keygen makes 32)".into(),
                ),
                _ => WireError::Key(format!(
                    "a key is 16 or 32 bytes of base64 (consul keygen), this one is {} bytes",
                    raw.len()
                )),
            })?;
            ring.raw.push(raw);
            ring.keys.push(key);
        }
        Ok(Keyring {
            ring: Arc::new(RwLock::new(ring)),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Ring> {
        self.ring.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A ring of the same keys that no clone of this one shares.
    pub fn detached(&self) -> Keyring {
        let r = self.read();
        Keyring {
            ring: Arc::new(RwLock::new(Ring {
                raw: r.raw.clone(),
                keys: r.keys.clone(),
            })),
        }
    }

    /// The keys held, the primary first.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.read().raw.clone()
    }

    /// Adds a key (memberlist's `AddKey`: one already held is no change).
    pub fn install(&self, key: &[u8]) -> Result<(), KeyringError> {
        let c = cipher(key)?;
        let mut r = self.write();
        if !r.raw.iter().any(|k| k == key) {
            r.raw.push(key.to_vec());
            r.keys.push(c);
        }
        Ok(())
    }

    /// Makes a key held the primary (memberlist's `UseKey`).
    pub fn use_key(&self, key: &[u8]) -> Result<(), KeyringError> {
        let mut r = self.write();
        let i = r
            .raw
            .iter()
            .position(|k| k == key)
            .ok_or(KeyringError::NotInRing)?;
        let raw = r.raw.remove(i);
        let c = r.keys.remove(i);
        r.raw.insert(0, raw);
        r.keys.insert(0, c);
        Ok(())
    }

    /// Takes a key out (memberlist's `RemoveKey`: never the primary; a key
    /// not held is no change).
    pub fn remove(&self, key: &[u8]) -> Result<(), KeyringError> {
        let mut r = self.write();
        if r.raw.first().is_some_and(|k| k == key) {
            return Err(KeyringError::RemovePrimary);
        }
        if let Some(i) = r.raw.iter().position(|k| k == key) {
            r.raw.remove(i);
            r.keys.remove(i);
        }
        Ok(())
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
        let tag = self.read().keys[0]
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
        for key in &self.read().keys {
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
    fn install_use_and_remove_change_what_seals_and_opens() {
        let ring = Keyring::from_base64(&[KEY]).unwrap();
        let shared = ring.clone();
        let mut old = Vec::new();
        ring.seal(b"x", b"", &mut old);
        let new = [7u8; 16];
        assert_eq!(ring.install(&[1; 5]), Err(KeyringError::Size(5)));
        assert_eq!(ring.use_key(&new), Err(KeyringError::NotInRing));
        ring.install(&new).unwrap();
        ring.install(&new).unwrap();
        assert_eq!(ring.keys().len(), 2);
        ring.use_key(&new).unwrap();
        assert_eq!(shared.keys()[0], new, "clones share the ring");
        let mut sealed = Vec::new();
        ring.seal(b"y", b"", &mut sealed);
        let only_new = Keyring::from_base64(&["BwcHBwcHBwcHBwcHBwcHBw=="]).unwrap();
        assert_eq!(only_new.open(&sealed, b"").unwrap(), b"y");
        let first = ring.keys()[1].clone();
        assert_eq!(ring.remove(&new), Err(KeyringError::RemovePrimary));
        assert_eq!(ring.open(&old, b"").unwrap(), b"x");
        ring.remove(&first).unwrap();
        assert!(ring.open(&old, b"").is_err(), "a removed key opens nothing");
        let alone = ring.detached();
        alone.install(&[9; 32]).unwrap();
        assert_eq!((ring.keys().len(), alone.keys().len()), (1, 2));
    }

    #[test]
    fn short_or_unknown_versions_are_errors_not_panics() {
        let ring = Keyring::from_base64(&[KEY]).unwrap();
        assert!(ring.open(&[], b"").is_err());
        assert!(ring.open(&[1, 2, 3], b"").is_err());
        assert!(ring.open(&[7; 40], b"").is_err());
    }
}

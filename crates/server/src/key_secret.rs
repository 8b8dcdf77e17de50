//! Key secrets: how one is made and the hash the store keeps of it. Used by the keys the
//! store holds ([`crate::auth`]) and the local key of `skillstate view` ([`crate::context`]).

use sha2::{Digest, Sha256};

/// The prefix of every key secret, so leaked keys are recognisable to secret scanners.
pub const SECRET_PREFIX: &str = "sk_";

/// A new random key secret: `sk_` and 64 hex digits (244 random bits, from two UUID v4s).
/// Shown to its creator once; store only [`hash_secret`] of it.
pub fn new_key_secret() -> String {
    format!(
        "{SECRET_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Lower-case hex SHA-256 of a key secret: what the store keeps and looks keys up by.
pub fn hash_secret(secret: &str) -> String {
    // Every request hashes its key: one allocation, not one per byte.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(secret.as_bytes());
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_prefixed_and_hash_to_hex() {
        let a = new_key_secret();
        let b = new_key_secret();
        assert_ne!(a, b);
        assert!(a.starts_with("sk_") && a.len() == 3 + 64);
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

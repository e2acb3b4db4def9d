//! Randomness for every crate (tokens, gateway passwords, operation ids, staging names), with
//! one failure policy: if the operating system's random source fails, the caller gets an
//! error. Nothing falls back to the clock or to fewer random bytes.

use thiserror::Error;

/// The system's random source failed.
#[derive(Debug, Error)]
#[error("the system's random source failed: {0}")]
pub struct RandomError(String);

/// Fills `buf` from the operating system's random source.
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    ssh_key::getrandom::fill(buf).map_err(|e| RandomError(e.to_string()))
}

/// `bytes` random bytes as lower-case hex (`2 × bytes` characters).
pub fn hex(bytes: usize) -> Result<String, RandomError> {
    let mut buf = vec![0u8; bytes];
    fill(&mut buf)?;
    Ok(crate::ident::hex(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_has_the_length_asked_and_differs_each_time() {
        let a = hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, hex(16).unwrap());
    }
}

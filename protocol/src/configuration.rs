//! The rendered gateway configuration that travels inside a prepare operation, and the
//! canonical bytes a host stores as the immutable snapshot.
//!
//! The hash is taken over canonical bytes (object keys sorted, no whitespace), computed here
//! without relying on the map order of `serde_json`, so the coordinator and hostd agree on it
//! whatever features other crates switch on.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::ident::{Sha256Hex, sha256};

/// Largest canonical configuration document accepted.
pub const CONFIGURATION_MAX_BYTES: usize = 256 * 1024;
/// Deepest nesting of objects and arrays accepted in a configuration.
pub const CONFIGURATION_MAX_DEPTH: usize = 32;

/// A rendered `openclaw.json`: a JSON object within the size and depth limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Configuration {
    value: Value,
    canonical: Vec<u8>,
}

/// Why a document is not an acceptable configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigurationError {
    #[error("the configuration must be a JSON object")]
    NotAnObject,
    #[error("the configuration is {size} bytes in canonical form; at most {max} are allowed")]
    TooLarge { size: usize, max: usize },
    #[error("the configuration nests {depth} levels deep; at most {max} are allowed")]
    TooDeep { depth: usize, max: usize },
}

impl Configuration {
    /// Checks a document and computes its canonical bytes.
    pub fn new(value: Value) -> Result<Self, ConfigurationError> {
        if !value.is_object() {
            return Err(ConfigurationError::NotAnObject);
        }
        let depth = depth(&value);
        if depth > CONFIGURATION_MAX_DEPTH {
            return Err(ConfigurationError::TooDeep {
                depth,
                max: CONFIGURATION_MAX_DEPTH,
            });
        }
        let canonical = canonical_json(&value);
        if canonical.len() > CONFIGURATION_MAX_BYTES {
            return Err(ConfigurationError::TooLarge {
                size: canonical.len(),
                max: CONFIGURATION_MAX_BYTES,
            });
        }
        Ok(Self { value, canonical })
    }

    /// The document.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The exact bytes a host writes as `openclaw.json`.
    pub fn canonical_bytes(&self) -> &[u8] {
        &self.canonical
    }

    /// SHA-256 of the canonical bytes.
    pub fn hash(&self) -> Sha256Hex {
        Sha256Hex::from_digest(&sha256(&self.canonical))
    }
}

impl Serialize for Configuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Configuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Configuration::new(value).map_err(serde::de::Error::custom)
    }
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Compact JSON with object keys sorted by their UTF-8 bytes.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                if let Some(v) = map.get(key) {
                    write_canonical(v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(Value::String(s.to_owned()).to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_sorts_keys_at_every_level() {
        let v = json!({"b": 1, "a": {"d": [3, {"z": 1, "y": 2}], "c": "x\"y"}});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            r#"{"a":{"c":"x\"y","d":[3,{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn hash_is_independent_of_key_order() {
        let a = Configuration::new(json!({"x": 1, "y": 2})).unwrap();
        let b: Configuration = serde_json::from_str(r#"{"y":2,"x":1}"#).unwrap();
        assert_eq!(a.hash(), b.hash());
    }

    #[test]
    fn rejects_non_objects_deep_and_large_documents() {
        assert_eq!(
            Configuration::new(json!([1])),
            Err(ConfigurationError::NotAnObject)
        );
        let mut deep = json!({});
        for _ in 0..40 {
            deep = json!({ "a": deep });
        }
        assert!(matches!(
            Configuration::new(deep),
            Err(ConfigurationError::TooDeep { .. })
        ));
        let big = json!({ "a": "x".repeat(CONFIGURATION_MAX_BYTES) });
        assert!(matches!(
            Configuration::new(big),
            Err(ConfigurationError::TooLarge { .. })
        ));
    }
}

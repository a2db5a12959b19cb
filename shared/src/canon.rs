//! Canonical JSON and content hashes.
//!
//! Versions (R10) and, later, replay fingerprints (R8) hash the canonical JSON of a value:
//! object keys sorted at every level, no insignificant white space. Sorting is done here, not
//! left to the map type serde_json happens to be built with.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The version of an object: a short hash of its canonical content.
pub fn version_of<T: Serialize>(content: &T) -> String {
    let value = serde_json::to_value(content).unwrap_or(Value::Null);
    format!("v_{}", &sha256_hex(canonical_json(&value).as_bytes())[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_canonical_form() {
        let a = json!({"b": 1, "a": {"d": [1, {"z": 1, "y": 2}], "c": null}});
        let b = json!({"a": {"c": null, "d": [1, {"y": 2, "z": 1}]}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}"#);
        assert_ne!(version_of(&a), version_of(&json!({"b": 2})));
    }
}

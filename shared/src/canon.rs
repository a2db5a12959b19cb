//! Canonical JSON and content hashes.
//!
//! Versions (R10) and, later, replay fingerprints (R8) hash the canonical JSON of a value:
//! object keys sorted at every level, no insignificant white space. Sorting is done here, not
//! left to the map type serde_json happens to be built with.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(key, out);
                out.push(b':');
                write_canonical(item, out);
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
        scalar => write_scalar(scalar, out),
    }
}

/// A string, number, boolean or null exactly as serde_json writes it.
fn write_scalar<T: Serialize + ?Sized>(scalar: &T, out: &mut Vec<u8>) {
    // Writing into a Vec fails only for values serde_json cannot show (none reach here).
    let _ = serde_json::to_writer(&mut *out, scalar);
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The version of an object: a short hash of its canonical content.
pub fn version_of<T: Serialize>(content: &T) -> String {
    let value = serde_json::to_value(content).unwrap_or(Value::Null);
    short_version(canonical_json(&value).as_bytes())
}

/// [`version_of`] for a record given as a tuple of fields (strings, numbers, booleans, nulls,
/// lists of them): a JSON array with no object in it is canonical as serde_json writes it, so
/// it is hashed as written, with no `Value` built (a search presents many records, each with
/// its version). The same version as [`version_of`] for such a tuple (tested); a tuple holding
/// a map would need [`version_of`].
pub fn version_of_fields<T: Serialize>(fields: &T) -> String {
    let written = serde_json::to_vec(fields).unwrap_or_default();
    let version = short_version(&written);
    // Tests and debug builds check the claim on every call: a field that writes as an object
    // (whose keys the canonical form sorts) would show here.
    debug_assert_eq!(version, version_of(fields), "a tuple of flat fields");
    version
}

fn short_version(canonical: &[u8]) -> String {
    let digest = Sha256::digest(canonical);
    let mut out = String::with_capacity(18);
    out.push_str("v_");
    out.push_str(&hex::encode(&digest[..8]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tuple_of_fields_has_the_version_its_canonical_value_has() {
        let texts = [
            "plain",
            "",
            "quote \" and back\\slash",
            "controls \u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}",
            "unicode é 東京 🙂 \u{2028}\u{2029} \u{feff}",
            "</script> & <b>",
        ];
        let numbers =
            [0i64, -1, 1, 9_007_199_254_740_993, i64::MIN, i64::MAX, 1_790_000_000_000_000];
        for (i, text) in texts.iter().enumerate() {
            for n in numbers {
                let none: Option<String> = None;
                let some = Some(text.to_string());
                let skills = vec![text.to_string(), "b".to_owned()];
                let tuple = (text, n, &none, &some, i % 2 == 0, &skills, n.wrapping_neg());
                assert_eq!(version_of_fields(&tuple), version_of(&tuple), "{text:?} {n}");
            }
        }
        // A different field makes a different version.
        assert_ne!(version_of_fields(&("a", 1)), version_of_fields(&("a", 2)));
    }

    #[test]
    fn key_order_does_not_change_the_canonical_form() {
        let a = json!({"b": 1, "a": {"d": [1, {"z": 1, "y": 2}], "c": null}});
        let b = json!({"a": {"c": null, "d": [1, {"y": 2, "z": 1}]}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}"#);
        assert_ne!(version_of(&a), version_of(&json!({"b": 2})));
    }

    #[test]
    fn canonical_text_and_versions_stay_what_clients_hold() {
        // Versions are compared with what a client read earlier, maybe from an older build:
        // the canonical text and its hash must not change with the code that writes them.
        let value = json!({"é\"\\\n": [1.5, -2, "x\u{1}", true, null, 18446744073709551615u64],
            "a": {"k": "ü"}});
        let text = canonical_json(&value);
        assert_eq!(
            text,
            r#"{"a":{"k":"ü"},"é\"\\\n":[1.5,-2,"x\u0001",true,null,18446744073709551615]}"#
        );
        assert_eq!(version_of(&value), format!("v_{}", &sha256_hex(text.as_bytes())[..16]));
        // sha256 of `["bkg_1",42,null]`, computed outside this code.
        assert_eq!(version_of(&("bkg_1", 42, None::<String>)), "v_411a354bd9696b4c");
    }
}

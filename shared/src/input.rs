//! Parsing arguments at the edge (R12, STYLE 4).
//!
//! Every adapter (MCP tools, REST query strings and bodies) turns caller input into a typed
//! input struct with [`parse_input`]: unknown fields are rejected with the allowed list, so an
//! ignored field can never make a caller believe it set something, and type errors name the
//! field. The allowed list comes from the same JSON Schema the tool publishes.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};

type FieldCache = RwLock<HashMap<&'static str, Arc<Vec<String>>>>;

/// The property names a schema declares, in declaration order. Computed once per type: building
/// a JSON Schema is far costlier than parsing the arguments it describes.
pub fn allowed_fields<T: JsonSchema>() -> Arc<Vec<String>> {
    static CACHE: LazyLock<FieldCache> = LazyLock::new(Default::default);
    let key = std::any::type_name::<T>();
    if let Some(found) = CACHE.read().unwrap_or_else(|p| p.into_inner()).get(key) {
        return found.clone();
    }
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    let fields: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| props.keys().cloned().collect())
        .unwrap_or_default();
    let fields = Arc::new(fields);
    CACHE.write().unwrap_or_else(|p| p.into_inner()).insert(key, fields.clone());
    fields
}

pub fn parse_input<T: DeserializeOwned + JsonSchema>(args: Value) -> Result<T> {
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        other => other,
    };
    let Value::Object(map) = &args else {
        return Err(Error::invalid("arguments", "arguments must be a JSON object"));
    };
    let allowed = allowed_fields::<T>();
    let mut unknown: Vec<String> = map.keys().filter(|k| !allowed.contains(k)).cloned().collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(Error::UnknownFields {
            unknown: shown_names(unknown),
            allowed: allowed.to_vec(),
        });
    }
    for (field, value) in map {
        if let Some((path, why)) = hidden_or_control(value, field) {
            return Err(Error::invalid(field, format!("`{path}` {why}")));
        }
    }
    serde_path_to_error::deserialize(args).map_err(|e| {
        // The argument the error is in: from the path serde walked (a type error), else from
        // the message (a missing field names itself there).
        let top = e.path().iter().find_map(|segment| match segment {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            _ => None,
        });
        let message = e.inner().to_string();
        let field = top
            .filter(|f| allowed.contains(f))
            .or_else(|| {
                message
                    .split('`')
                    .nth(1)
                    .filter(|f| allowed.iter().any(|a| a == f))
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "arguments".to_owned());
        Error::invalid(field, message)
    })
}

/// Unknown names as an answer shows them: at most ten, each cut to 64 characters, and how many
/// more there were (a caller's megabyte of field names is not echoed back).
fn shown_names(mut unknown: Vec<String>) -> Vec<String> {
    const SHOWN: usize = 10;
    const LONGEST: usize = 64;
    let more = unknown.len().saturating_sub(SHOWN);
    unknown.truncate(SHOWN);
    for name in &mut unknown {
        if name.chars().count() > LONGEST {
            *name = format!("{}…", name.chars().take(LONGEST).collect::<String>());
        }
        // A name with control or hidden characters is echoed with them written out.
        *name = crate::text::visible(name);
    }
    if more > 0 {
        unknown.push(format!("…and {more} more"));
    }
    unknown
}

/// The first string in an argument (at any depth) that carries a NUL, another control
/// character or a hidden character (see [`crate::text::refusal`]), with its path: every tool
/// and every REST body refuses these before any field is read, so none reaches the database,
/// a summary a person approves, or another model.
fn hidden_or_control(value: &Value, path: &str) -> Option<(String, String)> {
    match value {
        Value::String(s) => crate::text::refusal(s).map(|why| (path.to_owned(), why)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| hidden_or_control(item, &format!("{path}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            if let Some(why) = crate::text::refusal(k) {
                return Some((format!("{path} key"), why));
            }
            hidden_or_control(item, &format!("{path}.{k}"))
        }),
        _ => None,
    }
}

/// Accepts a whole number as a JSON number or as a string (query strings carry only strings).
pub fn lenient_u32<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u32>, D::Error> {
    use serde::de::Error as _;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("`limit` must be a whole number, got {n}"))),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("`limit` must be a whole number, got {s:?}"))),
        Some(other) => {
            Err(D::Error::custom(format!("`limit` must be a whole number, got {other}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Probe {
        booking: String,
        #[serde(default, deserialize_with = "lenient_u32")]
        limit: Option<u32>,
    }

    #[test]
    fn unknown_fields_are_rejected_with_the_allowed_list() {
        let err = parse_input::<Probe>(json!({"booking": "x", "tenant_id": 7, "workspace_id": 1}))
            .unwrap_err();
        match err {
            Error::UnknownFields { unknown, allowed } => {
                assert_eq!(unknown, vec!["tenant_id", "workspace_id"]);
                assert_eq!(allowed, vec!["booking", "limit"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn control_and_hidden_characters_are_refused_at_any_depth_naming_the_field() {
        for bad in ["a\u{0}b", "x\u{1b}[31m", "Eve \u{202E}live", "\u{E0041}"] {
            match parse_input::<Probe>(json!({"booking": bad})).unwrap_err() {
                Error::Invalid { field, .. } => assert_eq!(field, "booking", "{bad:?}"),
                other => panic!("unexpected {other:?}"),
            }
        }
        #[derive(Debug, Deserialize, JsonSchema)]
        #[expect(dead_code, reason = "only parsed")]
        struct Nested {
            items: Vec<serde_json::Value>,
        }
        let err = parse_input::<Nested>(json!({"items": ["ok", {"k": ["fine", "n\u{0}ul"]}]}))
            .unwrap_err();
        assert!(err.to_string().contains("items[1].k[1]"), "{err}");
        assert!(parse_input::<Probe>(json!({"booking": "line\nbreak\tand tab"})).is_ok());
    }

    #[test]
    fn a_type_error_names_its_field() {
        for args in [
            json!({"booking": ["a"]}),
            json!({"booking": null}),
            json!({"booking": "x", "limit": {}}),
        ] {
            let err = parse_input::<Probe>(args.clone()).unwrap_err();
            let Error::Invalid { field, .. } = err else { panic!("{err:?}") };
            let expected = if args.get("limit").is_some() { "limit" } else { "booking" };
            assert_eq!(field, expected, "{args}");
        }
        let Error::Invalid { field, .. } = parse_input::<Probe>(json!({})).unwrap_err() else {
            panic!("missing")
        };
        assert_eq!(field, "booking", "a missing field names itself");
    }

    #[test]
    fn unknown_names_are_echoed_bounded() {
        let mut args = serde_json::Map::new();
        args.insert("x".repeat(1_000_000), json!(1));
        args.insert("\u{1b}[31mred\u{202E}".to_owned(), json!(1));
        for i in 0..20_000 {
            args.insert(format!("f{i:05}"), json!(1));
        }
        match parse_input::<Probe>(Value::Object(args)).unwrap_err() {
            Error::UnknownFields { unknown, .. } => {
                assert_eq!(unknown.len(), 11);
                assert!(unknown.iter().all(|u| u.chars().count() <= 65), "{unknown:?}");
                assert!(!unknown.iter().any(|u| u.contains('\u{202E}')), "{unknown:?}");
                assert_eq!(unknown.last().map(String::as_str), Some("…and 19992 more"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn numbers_arrive_as_numbers_or_strings() {
        let a: Probe = parse_input(json!({"booking": "x", "limit": 5})).unwrap();
        assert_eq!(a.booking, "x");
        let b: Probe = parse_input(json!({"booking": "x", "limit": "5"})).unwrap();
        assert_eq!(a.limit, b.limit);
        assert!(parse_input::<Probe>(json!({"booking": "x", "limit": -1})).is_err());
        assert!(parse_input::<Probe>(json!({"limit": 1})).is_err());
    }
}

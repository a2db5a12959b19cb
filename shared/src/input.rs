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
        return Err(Error::UnknownFields { unknown, allowed: allowed.to_vec() });
    }
    serde_json::from_value(args).map_err(|e| {
        let message = e.to_string();
        let field = message
            .split('`')
            .nth(1)
            .filter(|f| allowed.iter().any(|a| a == f))
            .unwrap_or("arguments")
            .to_owned();
        Error::invalid(field, message)
    })
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
    fn numbers_arrive_as_numbers_or_strings() {
        let a: Probe = parse_input(json!({"booking": "x", "limit": 5})).unwrap();
        assert_eq!(a.booking, "x");
        let b: Probe = parse_input(json!({"booking": "x", "limit": "5"})).unwrap();
        assert_eq!(a.limit, b.limit);
        assert!(parse_input::<Probe>(json!({"booking": "x", "limit": -1})).is_err());
        assert!(parse_input::<Probe>(json!({"limit": 1})).is_err());
    }
}

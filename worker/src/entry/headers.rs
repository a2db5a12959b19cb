//! What the entry point checks in a request's headers before authentication: its `Origin`
//! against the allow-list, and the MCP routing headers against the body.

use super::*;

/// 403 for a request whose `Origin` is present and not on the allow-list (R20), matched as
/// rmcp matches it (RFC 6454: scheme, host, port; an entry's port `*` takes any port, no
/// port in an entry any port, `null` the opaque origin). rmcp checks again after us; this
/// check runs first so that the refusal does not depend on the request's credentials.
pub(super) fn foreign_origin(allowed: &[String], headers: &http::HeaderMap) -> Option<Response> {
    let origin = headers.get(header::ORIGIN)?;
    let forbidden = |message: &'static str| {
        let body = serde_json::json!({"error": "forbidden_origin", "error_description": message});
        Some((StatusCode::FORBIDDEN, Json(body)).into_response())
    };
    let Some(origin) = origin.to_str().ok().and_then(Origin::parse) else {
        return forbidden("Forbidden: Invalid Origin header");
    };
    if allowed.iter().any(|entry| Origin::allows(entry, &origin)) {
        None
    } else {
        forbidden("Forbidden: Origin header is not allowed")
    }
}

/// A browser origin: `null` or (scheme, host, port).
#[derive(Debug, PartialEq)]
pub(super) enum Origin {
    Null,
    Tuple { scheme: String, host: String, port: Option<u16> },
}

impl Origin {
    fn parse(value: &str) -> Option<Origin> {
        let value = value.trim();
        if value.eq_ignore_ascii_case("null") {
            return Some(Origin::Null);
        }
        let uri = http::Uri::try_from(value).ok()?;
        let authority = uri.authority()?;
        Some(Origin::Tuple {
            scheme: uri.scheme_str()?.to_ascii_lowercase(),
            host: authority.host().trim_matches(['[', ']']).to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }

    /// Whether the allow-list entry `entry` admits `origin`.
    fn allows(entry: &str, origin: &Origin) -> bool {
        let entry = entry.trim();
        let (base, any_port) = match entry.strip_suffix(":*") {
            Some(base) => (base, true),
            None => (entry, false),
        };
        match (Origin::parse(base), origin) {
            (Some(Origin::Null), Origin::Null) => !any_port,
            (
                Some(Origin::Tuple { scheme, host, port }),
                Origin::Tuple { scheme: s, host: h, port: p },
            ) => {
                let default = |scheme: &str| match scheme {
                    "http" => Some(80),
                    "https" => Some(443),
                    _ => None,
                };
                scheme == *s
                    && host == *h
                    && match port {
                        Some(_) if any_port => false,
                        Some(port) => p.or_else(|| default(s)) == Some(port),
                        None => true,
                    }
            }
            _ => false,
        }
    }
}

/// A legacy (2025-11-25 and older) request that carries `Mcp-Method` or `Mcp-Name` headers
/// disagreeing with its body is refused as 2026-07-28 refuses it (400, -32020). The older
/// revision does not define these headers, but intermediaries route and filter on them
/// without reading the body, so a request whose headers say one thing and whose body does
/// another is refused whatever revision it claims (docs/conformance.md). Headers that are
/// absent are not required of a legacy client; 2026-07-28 requests are rmcp's to check.
pub(super) fn legacy_header_mismatch(headers: &http::HeaderMap, body: &[u8]) -> Option<Response> {
    let modern = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::STANDARD_HEADERS.as_str());
    if modern || !(headers.contains_key("mcp-method") || headers.contains_key("mcp-name")) {
        return None;
    }
    let request: serde_json::Value = serde_json::from_slice(body).ok()?;
    let method = request.get("method").and_then(|m| m.as_str())?;
    let single = |name: &str| -> Result<Option<&str>, String> {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else { return Ok(None) };
        if values.next().is_some() {
            return Err(format!("duplicate {name} header"));
        }
        first.to_str().map(Some).map_err(|_| format!("{name} header contains invalid characters"))
    };
    let check = || -> Result<(), String> {
        if let Some(said) = single("mcp-method")?
            && said != method
        {
            return Err(format!(
                "Mcp-Method header `{said}` does not match body method `{method}`"
            ));
        }
        if let Some(said) = single("mcp-name")? {
            let said = decode_header_value(said).ok_or("Mcp-Name header is not valid Base64")?;
            let key = match method {
                "tools/call" | "prompts/get" => "name",
                "resources/read" | "resources/subscribe" | "resources/unsubscribe" => "uri",
                "tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/update" => "taskId",
                _ => {
                    return Err(format!(
                        "Mcp-Name header sent for `{method}`, which names nothing"
                    ));
                }
            };
            let named = request.get("params").and_then(|p| p.get(key)).and_then(|v| v.as_str());
            if named != Some(said.as_str()) {
                return Err(format!(
                    "Mcp-Name header `{said}` does not match body value `{}`",
                    named.unwrap_or("")
                ));
            }
        }
        Ok(())
    };
    let reason = check().err()?;
    let id = request
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {
        "code": rmcp::model::ErrorCode::HEADER_MISMATCH.0, "message": format!("Header mismatch: {reason}")}});
    Some((StatusCode::BAD_REQUEST, Json(body)).into_response())
}

//! Page cursors: the keyset of a list's last row, opaque to callers (base64url of a JSON array
//! of strings), and the error a cursor that is not one of ours gets.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::{Error, Result};

/// A cursor of these parts.
pub(crate) fn encode_cursor(parts: &[&str]) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(parts).unwrap_or_default())
}

/// The parts of a cursor of ours with `arity` parts; anything else is the caller's error.
pub(crate) fn decode_cursor(cursor: &str, arity: usize) -> Result<Vec<String>> {
    URL_SAFE_NO_PAD
        .decode(cursor.trim())
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Vec<String>>(&bytes).ok())
        .filter(|parts| parts.len() == arity)
        .ok_or_else(|| {
            Error::invalid(
                "cursor",
                "not a cursor from a previous page; repeat the search without it",
            )
        })
}

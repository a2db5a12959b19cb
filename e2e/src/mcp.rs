//! Talking to a stack as MCP clients do: raw requests, tool calls and lists, and the official
//! Python SDK's check script.

use super::*;

/// Runs the Python SDK check script and returns its JSON line.
pub fn sdk_check(url: &str, token: &str, mode: &str, calls: u32, writes: bool) -> Result<Value> {
    let python = python();
    if !python.exists() {
        bail!(
            "{} is missing; scripts/test creates it with the MCP SDK (pip install mcp==2.3.0)",
            python.display()
        );
    }
    let out = Command::new(&python)
        .arg(repo_root().join("e2e/py/sdk_check.py"))
        .args(["--url", url, "--token", token, "--mode", mode, "--calls", &calls.to_string()])
        .args(writes.then_some("--writes"))
        .output()?;
    if !out.status.success() {
        bail!(
            "sdk_check {mode} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    Ok(serde_json::from_str(line.lines().last().unwrap_or_default())?)
}

/// One 2026-07-28 MCP request with the protocol headers a real client sends, over a fresh HTTP
/// connection. `name` is the tool for `tools/call`.
pub async fn mcp_request(
    base: &str,
    token: &str,
    method: &str,
    name: Option<&str>,
    params: Value,
) -> reqwest::Response {
    let mut params = params;
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let mut request = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .bearer_auth(token)
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(name) = name {
        request = request.header("Mcp-Name", name);
    }
    request.send().await.expect("an MCP request")
}

/// A tools/call; returns the JSON-RPC `result` (null when the request was refused).
pub async fn tool_call(base: &str, token: &str, tool: &str, args: Value) -> Value {
    let response = mcp_request(
        base,
        token,
        "tools/call",
        Some(tool),
        serde_json::json!({"name": tool, "arguments": args}),
    )
    .await;
    let body: Value = response.json().await.unwrap_or(Value::Null);
    body["result"].clone()
}

/// The status of a tools/list and the tool names it returned.
pub async fn tool_names(base: &str, token: &str) -> (u16, Vec<String>) {
    let response = mcp_request(base, token, "tools/list", None, serde_json::json!({})).await;
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let names = body["result"]["tools"]
        .as_array()
        .map(|t| t.iter().map(|t| t["name"].as_str().unwrap_or_default().to_owned()).collect())
        .unwrap_or_default();
    (status, names)
}

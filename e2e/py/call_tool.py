"""One tool call through the official MCP Python SDK (2026-07-28 mode), as an agent makes it.

Usage: call_tool.py --url URL --token TOKEN --tool NAME --args JSON
Prints one JSON object: whether the result is an error, its text and its structured content;
non-zero when the call itself failed (transport, protocol).
"""

import argparse
import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def run(url: str, token: str, tool: str, args: dict) -> dict:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:
            result = await client.call_tool(tool, args)
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    texts = [getattr(c, "text", "") for c in (getattr(result, "content", None) or [])]
    return {
        "is_error": bool(getattr(result, "is_error", None) or getattr(result, "isError", None)),
        "text": "\n".join(t for t in texts if t),
        "structured": structured,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--tool", required=True)
    p.add_argument("--args", required=True)
    a = p.parse_args()
    try:
        out = asyncio.run(run(a.url, a.token, a.tool, json.loads(a.args)))
    except Exception as e:  # noqa: BLE001 - the test reads the message
        print(json.dumps({"error": repr(e)}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

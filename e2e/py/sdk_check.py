"""Drives Gatehouse with the official MCP Python SDK, as a real agent client would.

Usage: sdk_check.py --url URL --token TOKEN --mode 2026-07-28|legacy [--calls N]
Prints one JSON object describing what it saw; exits non-zero on any failure.
"""

import argparse
import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def structured(result):
    return getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)


def is_error(result):
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


async def run(url: str, token: str, mode: str, calls: int, write: bool) -> dict:
    workers: list[str] = []

    async def record(response):
        worker = response.headers.get("gatehouse-worker")
        if worker:
            workers.append(worker)

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    http.event_hooks = {"request": [], "response": [record]}
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            listed = await client.list_tools()
            names = [t.name for t in listed.tools]
            found = await client.call_tool("find_bookings", {"limit": 5})
            assert not is_error(found), found
            bookings = structured(found)["bookings"]
            booking = bookings[0]["booking"]
            got = await client.call_tool("get_booking", {"booking": booking})
            assert not is_error(got), got
            for _ in range(calls):
                again = await client.call_tool("find_technicians", {})
                assert not is_error(again), again
            refused = await client.call_tool("get_booking", {"booking": booking, "tenant_id": "other"})
            text = refused.content[0].text
            writes = await write_flow(client, mode) if write else None
    return {
        "mode": mode,
        "tools": names,
        "found": len(bookings),
        "booking": structured(got)["booking"],
        "refused_is_error": is_error(refused),
        "refused_text_starts": text.split(" ")[0],
        "workers": sorted(set(workers)),
        "responses": len(workers),
        "writes": writes,
    }


async def write_flow(client, mode: str) -> dict:
    """A silent write retried, then a two-step email prepared and confirmed."""
    args = {"name": f"SDK {mode}", "email": f"sdk-{mode}@example.net"}
    first = await client.call_tool("create_customer", args)
    again = await client.call_tool("create_customer", args)
    assert not is_error(first) and not is_error(again), (first, again)
    customer = structured(first)["customer"]["customer"]
    preview = await client.call_tool(
        "send_customer_message", {"customer": customer, "subject": "Welcome", "body": "Hello from the SDK."}
    )
    assert not is_error(preview), preview
    p = structured(preview)
    done = await client.call_tool(
        "confirm_action", {"confirm_token": p["confirm_token"], "confirm_summary": p["confirm_summary"]}
    )
    assert not is_error(done), done
    reused = await client.call_tool(
        "confirm_action", {"confirm_token": p["confirm_token"], "confirm_summary": p["confirm_summary"]}
    )
    return {
        "customer": customer,
        "first_replayed": structured(first)["replayed"],
        "again_replayed": structured(again)["replayed"],
        "preview_status": p["status"],
        "executed": structured(done)["status"],
        "reuse_code": structured(reused)["error"]["code"],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--writes", action="store_true", help="also run a write and a two-step flow")
    args = parser.parse_args()
    out = asyncio.run(run(args.url, args.token, args.mode, args.calls, args.writes))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

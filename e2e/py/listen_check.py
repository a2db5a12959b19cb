"""Holds a `subscriptions/listen` stream open with the official MCP Python SDK, as a real
client that keeps its model's tool list live would.

Usage: listen_check.py --url URL --token TOKEN
Prints one JSON line per event, flushed at once: {"event": "ready", "tools": [...]} after the
acknowledgement, {"event": "changed", "tools": [...]} for each toolsListChanged (the list
fetched again), {"event": "ended"} when the server ends the stream, {"event": "lost", ...}
if it drops. Reads nothing from stdin; the test kills it when done.
"""

import argparse
import asyncio
import json
import sys
import traceback

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def say(**event):
    print(json.dumps(event), flush=True)


async def tool_names(url: str, token: str) -> list[str]:
    # A fresh client per refetch: the listening one is busy with its stream.
    try:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return sorted(t.name for t in (await client.list_tools()).tools)
    except Exception as e:  # the connection may be refused now (a switch is off)
        return [f"refused: {type(e).__name__}"]


async def run(url: str, token: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            async with client.listen(tools_list_changed=True) as sub:
                say(event="ready", honored=str(getattr(sub, "honored", "")), tools=await tool_names(url, token))
                try:
                    async for event in sub:
                        say(event="changed", kind=type(event).__name__, tools=await tool_names(url, token))
                except Exception as e:
                    traceback.print_exception(e, file=sys.stderr)
                    say(event="lost", error=f"{type(e).__name__}: {e}")
                    return
            say(event="ended")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    try:
        asyncio.run(run(args.url, args.token))
    except Exception as e:
        traceback.print_exception(e, file=sys.stderr)
        say(event="lost", error=f"{type(e).__name__}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()

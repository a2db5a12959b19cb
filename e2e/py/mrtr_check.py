"""The official MCP Python SDK (2026-07-28 mode) confirms a Gatehouse two-step action in its own
UI: Gatehouse answers `input_required` with a form elicitation and a sealed requestState, the
SDK asks its elicitation callback (standing in for the person) and retries with the answer.

Usage: mrtr_check.py --url URL --token TOKEN --customer cus_... --answer accept|decline --subject S
Prints one JSON object: what the person was asked, and the final result; non-zero on failure.
"""

import argparse
import asyncio
import json
import sys

import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def run(url: str, token: str, customer: str, answer: str, subject: str) -> dict:
    asked: list[str] = []

    async def person(context, params):
        asked.append(getattr(params, "message", ""))
        return types.ElicitResult(action=answer, content={} if answer == "accept" else None)

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with Client(
            streamable_http_client(url, http_client=http), mode="2026-07-28", elicitation_callback=person
        ) as client:
            result = await client.call_tool(
                "send_customer_message",
                {"customer": customer, "subject": subject, "body": "Your technician arrives at 9."},
            )
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    return {
        "asked": asked,
        "is_error": bool(getattr(result, "is_error", None) or getattr(result, "isError", None)),
        "status": (structured or {}).get("status"),
        "result": structured,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--customer", required=True)
    p.add_argument("--answer", choices=["accept", "decline", "cancel"], required=True)
    p.add_argument("--subject", required=True)
    a = p.parse_args()
    try:
        out = asyncio.run(run(a.url, a.token, a.customer, a.answer, a.subject))
    except Exception as e:  # noqa: BLE001 - the test reads the message
        print(json.dumps({"error": repr(e)}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""A fleet workload: concurrent Python SDK clients doing reads, silent writes, previews and
confirmations against the load balancer while the test kills workers and flips switches.

Every call is retried (new JSON-RPC id, as a client must after a broken stream) until it gets
an answer, a bounded number of times. Prints one JSON report.

Usage: fleet_client.py --url URL --token TOKEN --clients N --rounds K
"""

import argparse
import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

MAX_TRIES = 200


def structured(result):
    return getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)


def is_error(result):
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


class Agent:
    def __init__(self, url: str, token: str, report: dict):
        self.url, self.token, self.report = url, token, report

    async def call(self, name: str, args: dict):
        """Calls until answered; transport failures and 503s are retried."""
        for attempt in range(MAX_TRIES):
            try:
                http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.token}"})
                async with http:
                    async with Client(streamable_http_client(self.url, http_client=http), mode="2026-07-28") as client:
                        return await client.call_tool(name, args)
            except Exception:  # noqa: BLE001 - a dead worker, a 503, a reset stream: retry
                self.report["retries"] += 1
                await asyncio.sleep(0.05 * min(attempt + 1, 10))
        raise RuntimeError(f"{name} never answered")


async def run_agent(agent: Agent, index: int, rounds: int, booking: str, customer: str):
    report = agent.report
    for r in range(rounds):
        found = await agent.call("find_bookings", {"limit": 3})
        assert not is_error(found), found
        text = f"fleet note {index}-{r}"
        report["notes_attempted"].append(text)
        note = await agent.call("add_booking_note", {"booking": booking, "text": text})
        assert not is_error(note), note
        report["notes_committed"].append(text)
        if r % 3 == 0:
            preview = await agent.call(
                "send_customer_message", {"customer": customer, "subject": f"Fleet {index}-{r}", "body": "Load test message."}
            )
            assert not is_error(preview), preview
            p = structured(preview)
            done = await agent.call("confirm_action", {"confirm_token": p["confirm_token"], "confirm_summary": p["confirm_summary"]})
            outcome = structured(done)["error"]["code"] if is_error(done) else structured(done)["status"]
            report["confirms"].append({"action": p["action"], "outcome": outcome})
        report["rounds_done"] += 1


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    report = {"notes_attempted": [], "notes_committed": [], "confirms": [], "retries": 0, "rounds_done": 0}
    setup = Agent(args.url, args.token, report)
    bookings = structured(await setup.call("find_bookings", {"limit": 1}))["bookings"]
    customers = structured(await setup.call("find_customers", {"query": "Wagner"}))["customers"]
    booking, customer = bookings[0]["booking"], customers[0]["customer"]
    await asyncio.gather(
        *(run_agent(Agent(args.url, args.token, report), i, args.rounds, booking, customer) for i in range(args.clients))
    )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

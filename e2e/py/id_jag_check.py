"""Enterprise-managed authorization with the official MCP Python SDK: the SDK's
`IdentityAssertionOAuthProvider` trades an ID-JAG for an access token at Gatehouse's
authorization server and calls tools through the load balancer.

The tenant's identity provider is the caller's key (published by the test as the IdP's key
set); this script mints the ID-JAGs with it, as the IdP's token exchange (leg 1) would.

Usage: id_jag_check.py --url MCP_URL --issuer AS_ISSUER --client-id ID --client-secret SECRET
       --idp-issuer ISS --idp-key-der-b64 KEY --kid KID --sub SUBJECT --scope SCOPE
Prints one JSON object describing what it saw; exits non-zero on any failure.
"""

import argparse
import asyncio
import base64
import json
import sys
import time
import uuid

import jwt
from cryptography.hazmat.primitives.serialization import load_der_private_key
from mcp import Client
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthToken


class Memory:
    def __init__(self):
        self.tokens = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken):
        self.tokens = tokens

    async def get_client_info(self):
        return None

    async def set_client_info(self, info):
        pass


def structured(result):
    return getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)


def is_error(result):
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


async def run(a) -> dict:
    key = load_der_private_key(base64.b64decode(a.idp_key_der_b64), password=None)
    minted: list[dict] = []

    async def id_jag(audience: str, resource: str) -> str:
        claims = {
            "iss": a.idp_issuer,
            "sub": a.sub,
            "aud": audience,
            "resource": resource,
            "client_id": a.client_id,
            "scope": a.scope,
            "iat": int(time.time()),
            "exp": int(time.time()) + 300,
            "jti": str(uuid.uuid4()),
        }
        minted.append({"aud": audience, "resource": resource})
        return jwt.encode(claims, key, algorithm="ES256", headers={"typ": "oauth-id-jag+jwt", "kid": a.kid})

    storage = Memory()
    auth = IdentityAssertionOAuthProvider(
        server_url=a.url,
        storage=storage,
        client_id=a.client_id,
        client_secret=a.client_secret,
        issuer=a.issuer,
        assertion_provider=id_jag,
        scope=a.scope,
    )
    workers: list[str] = []

    async def record(response):
        worker = response.headers.get("gatehouse-worker")
        if worker:
            workers.append(worker)

    http = create_mcp_http_client(auth=auth)
    http.event_hooks = {"request": [], "response": [record]}
    async with http:
        async with Client(streamable_http_client(a.url, http_client=http)) as client:
            listed = await client.list_tools()
            names = [t.name for t in listed.tools]
            found = await client.call_tool("find_bookings", {"limit": 3})
            assert not is_error(found), found
            for _ in range(3):
                again = await client.call_tool("find_technicians", {})
                assert not is_error(again), again
            # A write beyond the granted scope is refused by the server, whatever the client:
            # the SDK asks for a wider token, the IdP's ID-JAG does not carry it, and the call
            # stays refused (as a tool error or as the HTTP 403 the SDK raises).
            try:
                write = await client.call_tool("create_customer", {"name": "ID-JAG", "email": "idjag@example.net"})
                write_refused = is_error(write)
            except Exception as refused:  # noqa: BLE001 - any refusal shape counts
                write_refused = type(refused).__name__
    tokens = storage.tokens
    return {
        "tools": names,
        "found": len(structured(found)["bookings"]),
        "minted": minted,
        "scope": tokens.scope if tokens else None,
        "refresh_token": tokens.refresh_token if tokens else None,
        "write_refused": write_refused,
        "workers": sorted(set(workers)),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ["url", "issuer", "client-id", "client-secret", "idp-issuer", "idp-key-der-b64", "kid", "sub", "scope"]:
        p.add_argument(f"--{name}", required=True)
    out = asyncio.run(run(p.parse_args()))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks a Gatehouse audit export offline, trusting nothing but the public keys and the
checkpoints you kept outside Gatehouse (docs/operations.md, "Verifying without Gatehouse").

    python3 audit-offline-check.py EXPORT.csv KEYS.json ANCHORS [--checkpoint-secs 60] [--strict]

EXPORT.csv  the Audit page's unfiltered export (Audit -> Export CSV).
KEYS.json   the published key set: GET /.well-known/gatehouse-audit-keys, or
            `gatehousectl audit keys --json`.
ANCHORS     checkpoints held outside: the anchor file (JSON lines), the audit.checkpoint events
            your SIEM received (one JSON body a line), or a page of
            /.well-known/gatehouse-audit-checkpoints/{tenant}.

Every exported row is checked, chained or not: each chained row's hash is recomputed from its
canonical form, linked to the one before, placed at its position, and its canonical form must
say what the row's columns say; each checkpoint's Ed25519 signature is checked against the
public keys, each must commit to the one before it, and each head must be the export's hash at
that position; a checkpoint beyond the export's last row means its tail was deleted. Rows not
yet chained are listed; with --strict, rows no checkpoint covers after two checkpoint intervals
fail. Exit 0 when intact, 1 naming the first problem. Needs the `cryptography` package.
"""

import argparse
import base64
import csv
import datetime
import hashlib
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def jcs(value):
    # RFC 8785 for what Gatehouse signs: strings, integers, booleans, null, objects, arrays
    # (no floats), with keys in ASCII, so sorting and compact separators are the whole rule.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def fail(why, verdict="TAMPERED"):
    print(f"{verdict}: {why}")
    sys.exit(1)


def cell(value):
    # The export prefixes with ' a value a spreadsheet would run as a formula, and a value
    # that begins with ' itself, so exactly one leading ' before those is the export's.
    return value[1:] if value[:1] == "'" and value[1:2] in ("=", "+", "-", "@", "\t", "\r", "'") else value


def read_anchors(path):
    text = open(path, encoding="utf-8").read()
    try:
        whole = json.loads(text)
        items = whole.get("checkpoints", [whole]) if isinstance(whole, dict) else whole
    except json.JSONDecodeError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for item in items:
        if "type" in item:
            if item["type"] != "audit.checkpoint":
                continue
            item = item["data"]
        out.append(item)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export")
    p.add_argument("keys")
    p.add_argument("anchors")
    p.add_argument("--checkpoint-secs", type=int, default=60)
    p.add_argument("--strict", action="store_true")
    a = p.parse_args()

    keys = {k["kid"]: Ed25519PublicKey.from_public_bytes(b64url(k["public_key"]))
            for k in json.load(open(a.keys, encoding="utf-8"))["keys"]}
    rows = list(csv.DictReader(open(a.export, encoding="utf-8", newline="")))
    chained = sorted((r for r in rows if r["seq"]), key=lambda r: int(r["seq"]))
    waiting = [r for r in rows if not r["seq"]]
    if not chained:
        fail("the export holds no chained row")

    # The rows: position, link, hash, and the canonical form against the columns.
    tenant = None
    hashes = {}
    for prev, row in zip([None] + chained, chained):
        seq = int(row["seq"])
        if prev is None and seq == 1 and row["prev_hash"] != "00" * 32:
            fail("row 1 does not start the chain (rewritten)")
        if prev is not None:
            if seq != int(prev["seq"]) + 1:
                fail(f"rows {int(prev['seq']) + 1} to {seq - 1} are missing (deleted)")
            if row["prev_hash"] != prev["hash"]:
                fail(f"row {seq} does not link to row {seq - 1} (inserted or reordered)")
        digest = hashlib.sha256(bytes.fromhex(row["prev_hash"]) + row["canonical"].encode()).hexdigest()
        if digest != row["hash"]:
            fail(f"row {seq}: its hash is not its content's (edited)")
        c = json.loads(row["canonical"])
        if c.get("v", 1) >= 2:
            if c["seq"] != seq:
                fail(f"row {seq}: its canonical form names position {c['seq']} (moved)")
            tenant = tenant or c["tenant"]
            if c["tenant"] != tenant:
                fail(f"row {seq}: its canonical form names another tenant")
        shown = {"action": "action", "outcome": "outcome", "channel": "channel",
                 "connection_name": "connection_name", "client_name": "client_name",
                 "reason": "reason"}
        for column, field in shown.items():
            if cell(row[column]) != (c.get(field) or ""):
                fail(f"row {seq}: the {column} shown differs from what was chained")
        if cell(row["records"]) != " ".join(c.get("targets") or []):
            fail(f"row {seq}: the records shown differ from what was chained")
        if row["at"] != c["at"][:19] + "Z":
            fail(f"row {seq}: the time shown differs from what was chained")
        if c.get("v", 1) >= 2 and cell(row["connection"]) != (c.get("connection") or ""):
            fail(f"row {seq}: the connection shown differs from what was chained")
        if c.get("v", 1) >= 2 and "actor" in row and cell(row["actor"]) != (c.get("actor") or ""):
            fail(f"row {seq}: the person shown differs from what was chained")
        if "change" in row and (json.loads(cell(row["change"])) if cell(row["change"]) else None) != c.get("change"):
            fail(f"row {seq}: the change shown differs from what was chained")
        if "policy" in row and (json.loads(cell(row["policy"])) if cell(row["policy"]) else None) != c.get("policy"):
            fail(f"row {seq}: the policy shown differs from what was chained")
        hashes[seq] = row["hash"]
    first, last = int(chained[0]["seq"]), int(chained[-1]["seq"])

    # The checkpoints held outside: signed, chained to each other, on the export's hashes.
    anchors = sorted((c for c in read_anchors(a.anchors) if tenant is None or c["tenant"] == tenant),
                     key=lambda c: c["seq"])
    if not anchors:
        fail("no checkpoint of this tenant among the anchors")
    by_seq = {}
    for cp in anchors:
        key = keys.get(cp["kid"])
        if key is None:
            fail(f"checkpoint at row {cp['seq']}: key {cp['kid']} is not in the key set")
        body = {k: v for k, v in cp.items() if k != "signature"}
        try:
            key.verify(b64url(cp["signature"]), jcs(body).encode())
        except InvalidSignature:
            fail(f"checkpoint at row {cp['seq']}: the signature does not verify (replaced)")
        by_seq[cp["seq"]] = cp
    for cp in anchors:
        prev = cp.get("prev")
        if prev and prev["seq"] in by_seq:
            if hashlib.sha256(jcs(by_seq[prev["seq"]]).encode()).hexdigest() != prev["digest"]:
                fail(f"checkpoint at row {cp['seq']} does not commit to the one at row {prev['seq']}")
        if cp["seq"] > last:
            fail(f"checkpoint at row {cp['seq']} covers rows past the export's last ({last}): the tail was deleted")
        if cp["seq"] >= first and hashes.get(cp["seq"]) != cp["head"]:
            fail(f"row {cp['seq']}: the chain's hash is not the one checkpointed there (rewritten)")
    if first > 1:
        # Rows before the first are gone: only retention does that, and it cuts at a
        # checkpoint, which must be among the anchors and be what the first row extends.
        if (first - 1) not in by_seq:
            fail(f"rows 1 to {first - 1} are missing and no checkpoint at row {first - 1} anchors the rest (deleted)")
        if by_seq[first - 1]["head"] != chained[0]["prev_hash"]:
            fail(f"row {first} does not extend the checkpoint before it (rewritten)")

    newest = anchors[-1]
    uncovered = last - newest["seq"]
    print(f"chain intact: rows {first} to {last}, {len(anchors)} checkpoints verified, "
          f"the newest at row {newest['seq']} signed {newest['signed_at']} by {newest['kid']}")
    if uncovered:
        print(f"{uncovered} chained rows after the newest checkpoint: compare them once the next one arrives")
    if waiting:
        print(f"{len(waiting)} rows not chained yet (the export was taken while they waited)")
    if a.strict:
        limit = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=2 * a.checkpoint_secs)
        def written(r):
            return datetime.datetime.fromisoformat(r["at"].replace("Z", "+00:00"))
        stale = [r for r in chained if int(r["seq"]) > newest["seq"] and written(r) < limit]
        stale += [r for r in waiting if written(r) < limit]
        if stale:
            fail(f"{len(stale)} rows are not anchored by any checkpoint after two intervals", "UNANCHORED")


if __name__ == "__main__":
    main()

"""An OpenTelemetry OTLP/HTTP trace receiver for the e2e suite: Gatehouse exports its traces
here, and the tests read back what arrived. The bodies are decoded with the official protobuf
definitions (the `opentelemetry-proto` package), so a malformed export fails here as it would in
a real collector.

Usage: otlp_receiver.py --out DIR [--port N] [--host H]
       otlp_receiver.py --self-test

Prints `listening on PORT` as its first line once it accepts connections, then serves until
SIGTERM or SIGINT. `POST /v1/traces` takes `application/x-protobuf` or OTLP/JSON
(`application/json`), optionally `Content-Encoding: gzip`; `GET /healthz` answers `ok`.

Every request's decompressed body is appended to DIR/raw.bin, and every span to DIR/spans.jsonl
as one JSON object a line (written whole and flushed per request, so a poller sees whole lines):
  {"trace_id", "span_id", "parent_span_id" (hex, "" for a root), "name", "kind" ("SPAN_KIND_..."),
   "start_time_unix_nano", "end_time_unix_nano", "status": {"code": "STATUS_CODE_...", "message"},
   "attributes": {key: value}, "events": [{"name", "attributes"}], "links": [{"trace_id", "span_id"}],
   "resource": {key: value}, "scope": "instrumentation scope name"}
"""

import argparse
import base64
import gzip
import json
import os
import re
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BadRequest(Exception):
    """The body could not be decompressed or decoded: answered with 400."""


# --- Decoding -------------------------------------------------------------------------------

HEX = re.compile(r"^[0-9a-fA-F]*$")


def _hex_to_base64(value):
    # OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping expects base64.
    if isinstance(value, str) and HEX.match(value) and len(value) % 2 == 0:
        return base64.b64encode(bytes.fromhex(value)).decode()
    return value


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    doc = json.loads(body)
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for span in ss.get("spans") or []:
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = _hex_to_base64(span[field])
                for link in span.get("links") or []:
                    for field in ("traceId", "spanId"):
                        if field in link:
                            link[field] = _hex_to_base64(link[field])
    # Unknown fields are ignored, as the OTLP specification asks of receivers.
    return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)


def gunzip(body: bytes) -> bytes:
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error) as e:
        raise BadRequest(f"bad gzip body: {e}") from e


def decode(body: bytes, media_type: str) -> ExportTraceServiceRequest:
    try:
        if media_type == PROTOBUF:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            return request
        return parse_json(body)
    except (DecodeError, json_format.ParseError, ValueError, AttributeError, TypeError) as e:
        raise BadRequest(f"cannot decode the {media_type} body: {e}") from e


# --- Flattening spans to JSON lines ---------------------------------------------------------


def any_value(v):
    """An OTLP AnyValue as a plain Python value."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attributes(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


def enum_name(enum, number: int) -> str:
    try:
        return enum.Name(number)
    except ValueError:  # a value newer than our definitions
        return str(number)


def span_records(request: ExportTraceServiceRequest):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": enum_name(Span.SpanKind, s.kind),
                    "start_time_unix_nano": s.start_time_unix_nano,
                    "end_time_unix_nano": s.end_time_unix_nano,
                    "status": {
                        "code": enum_name(Status.StatusCode, s.status.code),
                        "message": s.status.message,
                    },
                    "attributes": attributes(s.attributes),
                    "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in s.events],
                    "links": [{"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex()} for k in s.links],
                    "resource": resource,
                    "scope": ss.scope.name,
                }


# --- The server -----------------------------------------------------------------------------


class Recorder:
    """Appends to raw.bin and spans.jsonl; one request's writes are never interleaved with another's."""

    def __init__(self, out_dir: str):
        os.makedirs(out_dir, exist_ok=True)
        self.lock = threading.Lock()
        self.raw = open(os.path.join(out_dir, "raw.bin"), "ab")
        self.spans = open(os.path.join(out_dir, "spans.jsonl"), "a", encoding="utf-8")

    def record(self, body: bytes, request: ExportTraceServiceRequest):
        lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in span_records(request))
        with self.lock:
            self.raw.write(body)
            self.raw.flush()
            self.spans.write(lines)
            self.spans.flush()

    def close(self):
        with self.lock:
            self.raw.close()
            self.spans.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as exporters expect
    recorder: Recorder  # set on the subclass made in serve()

    def reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size + 2)[:size])  # each chunk ends with CRLF
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, b"ok")
        else:
            self.reply(404, b"not found")

    def do_POST(self):
        body = self.read_body()  # read whole even when refused, so the connection stays usable
        if self.path.split("?")[0] != "/v1/traces":
            return self.reply(404, b"not found")
        media_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if media_type not in (PROTOBUF, JSON) or encoding not in ("identity", "gzip"):
            return self.reply(415, b"unsupported content type or encoding")
        try:
            if encoding == "gzip":
                body = gunzip(body)
            request = decode(body, media_type)
        except BadRequest as e:
            return self.reply(400, str(e).encode())
        self.recorder.record(body, request)
        response = ExportTraceServiceResponse()
        if media_type == PROTOBUF:
            self.reply(200, response.SerializeToString(), PROTOBUF)
        else:
            self.reply(200, json_format.MessageToJson(response).encode(), JSON)

    def log_request(self, code="-", size="-"):
        pass  # no access log; errors still go to stderr


def serve(out_dir: str, host: str, port: int):
    recorder = Recorder(out_dir)
    server = ThreadingHTTPServer((host, port), type("RecordingHandler", (Handler,), {"recorder": recorder}))
    server.daemon_threads = True

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        recorder.close()


# --- Self-test: runs this file as the e2e suite does, and checks what it records ------------


def self_test():
    import http.client
    import subprocess
    import tempfile
    import urllib.error
    import urllib.request

    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key, **value):
        return KeyValue(key=key, value=AnyValue(**value))

    trace_id = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    root_id, child_id = bytes.fromhex("b7ad6b7169203331"), bytes.fromhex("00f067aa0ba902b7")
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", string_value="gatehouse-selftest"))
    ss = rs.scope_spans.add()
    ss.scope.name = "gatehouse"
    root = ss.spans.add(trace_id=trace_id, span_id=root_id, name="POST /mcp", kind=Span.SPAN_KIND_SERVER,
                        start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_000_500_000_000)
    root.attributes.extend([
        kv("http.request.method", string_value="POST"),
        kv("http.response.status_code", int_value=200),
        kv("gatehouse.ratio", double_value=0.5),
        kv("gatehouse.cached", bool_value=True),
        kv("gatehouse.tools", array_value={"values": [AnyValue(string_value="a"), AnyValue(int_value=2)]}),
    ])
    root.status.code, root.status.message = Status.STATUS_CODE_ERROR, "upstream failed"
    root.events.add(name="exception", attributes=[kv("exception.type", string_value="Timeout")])
    child = ss.spans.add(trace_id=trace_id, span_id=child_id, parent_span_id=root_id, name="tools/call",
                         kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=1_700_000_000_100_000_000,
                         end_time_unix_nano=1_700_000_000_400_000_000)
    child.attributes.append(kv("mcp.tool", string_value="search"))
    child.links.add(trace_id=b"\x11" * 16, span_id=b"\x22" * 8)

    proto_body = request.SerializeToString()
    # OTLP/JSON as an exporter writes it: hex ids (protobuf's own JSON mapping would use base64).
    doc = json_format.MessageToDict(request)
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for holder in [span, *span.get("links", [])]:
            for field in ("traceId", "spanId", "parentSpanId"):
                if field in holder:
                    holder[field] = base64.b64decode(holder[field]).hex()
    json_body = json.dumps(doc).encode()

    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.Popen([sys.executable, __file__, "--out", out], stdout=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline().strip()
            assert re.fullmatch(r"listening on \d+", first), first
            base = f"http://127.0.0.1:{first.split()[-1]}"

            def post(path, body, content_type, encoding=None, method="POST"):
                headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
                req = urllib.request.Request(base + path, data=body, headers=headers, method=method)
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        return r.status, r.headers.get("Content-Type"), r.read()
                except urllib.error.HTTPError as e:
                    return e.code, e.headers.get("Content-Type"), e.read()

            status, ctype, body = post("/v1/traces", gzip.compress(proto_body), PROTOBUF, "gzip")
            assert (status, ctype) == (200, PROTOBUF), (status, ctype, body)
            ExportTraceServiceResponse().ParseFromString(body)
            status, ctype, body = post("/v1/traces", json_body, JSON + "; charset=utf-8")
            assert (status, ctype, json.loads(body)) == (200, JSON, {}), (status, ctype, body)

            assert post("/v1/traces", b"x", "text/plain")[0] == 415
            assert post("/v1/traces", proto_body, PROTOBUF, "br")[0] == 415
            assert post("/v1/metrics", proto_body, PROTOBUF)[0] == 404
            assert post("/v1/traces", b"\x0a\x05ab", PROTOBUF)[0] == 400  # truncated field
            assert post("/v1/traces", b"not gzip", PROTOBUF, "gzip")[0] == 400
            assert post("/v1/traces", gzip.compress(b"")[:10] + b"\xff" * 8, PROTOBUF, "gzip")[0] == 400  # bad deflate
            assert post("/v1/traces", b"{not json", JSON)[0] == 400
            status, _, body = post("/healthz", None, "text/plain", method="GET")
            assert (status, body) == (200, b"ok"), (status, body)

            # A chunked body (no Content-Length), then a second request on the same connection.
            conn = http.client.HTTPConnection("127.0.0.1", int(first.split()[-1]), timeout=10)
            conn.request("POST", "/v1/traces", iter([b'{"resourceSpans":', b"[]}"]), {"Content-Type": JSON})
            assert conn.getresponse().read() == b"{}"
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b"ok"
            conn.close()

            with open(os.path.join(out, "spans.jsonl")) as f:
                spans = [json.loads(line) for line in f]
            with open(os.path.join(out, "raw.bin"), "rb") as f:
                assert f.read() == proto_body + json_body + b'{"resourceSpans":[]}', "raw.bin: the accepted bodies"
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=10)
        assert code == 0, f"exit code {code} on SIGTERM"

    assert len(spans) == 4 and spans[:2] == spans[2:], "protobuf and JSON record the same spans"
    root_rec, child_rec = spans[:2]
    assert root_rec == {
        "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331", "parent_span_id": "",
        "name": "POST /mcp", "kind": "SPAN_KIND_SERVER",
        "start_time_unix_nano": 1_700_000_000_000_000_000, "end_time_unix_nano": 1_700_000_000_500_000_000,
        "status": {"code": "STATUS_CODE_ERROR", "message": "upstream failed"},
        "attributes": {"http.request.method": "POST", "http.response.status_code": 200, "gatehouse.ratio": 0.5,
                       "gatehouse.cached": True, "gatehouse.tools": ["a", 2]},
        "events": [{"name": "exception", "attributes": {"exception.type": "Timeout"}}],
        "links": [], "resource": {"service.name": "gatehouse-selftest"}, "scope": "gatehouse",
    }, root_rec
    assert child_rec["parent_span_id"] == "b7ad6b7169203331" and child_rec["span_id"] == "00f067aa0ba902b7"
    assert child_rec["kind"] == "SPAN_KIND_CLIENT" and child_rec["status"]["code"] == "STATUS_CODE_UNSET"
    assert child_rec["links"] == [{"trace_id": "11" * 16, "span_id": "22" * 8}]
    assert child_rec["attributes"] == {"mcp.tool": "search"}
    print("self-test passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for raw.bin and spans.jsonl")
    parser.add_argument("--port", type=int, default=0, help="0 (the default) picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--self-test", action="store_true", help="check this receiver end to end, then exit")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.out:
        parser.error("--out is required")
    serve(args.out, args.host, args.port)


if __name__ == "__main__":
    main()

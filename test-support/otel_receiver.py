#!/usr/bin/env python3
"""A small OTLP/HTTP trace receiver for tests (crates/cli/tests/telemetry.rs).

Decodes each POST /v1/traces body (protobuf `ExportTraceServiceRequest`, through the official
`opentelemetry-proto` package) and appends one JSON line per span to the output file:

    {"trace_id", "span_id", "parent_span_id", "name", "kind", "service", "attributes"}

ids in lower-case hex (parent "" for a root span), kind as the protobuf enum's name
(SPAN_KIND_SERVER...), attributes as a flat object (arrays as lists).

    otel_receiver.py --port-file PATH --out PATH [--port 0] [--count-only]

Listens on 127.0.0.1 (port 0: any free port), writes the port it got to --port-file once it
listens, answers each export with an empty `ExportTraceServiceResponse`, and stops on
SIGTERM or SIGINT. scripts/test installs its venv (target/otel-receiver).

--count-only (for overhead benchmarks on one machine, where decoding in Python would take CPU
from the process measured): each export is answered at once and only its byte size is logged
as `{"export_bytes": N}`, not decoded.
"""

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

LOCK = threading.Lock()


def any_value(value):
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def spans_of(request):
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "service": resource.get("service.name"),
                    "start_unix_nano": span.start_time_unix_nano,
                    "end_unix_nano": span.end_time_unix_nano,
                    "status": span.status.code,
                    "attributes": {kv.key: any_value(kv.value) for kv in span.attributes},
                }


class Handler(BaseHTTPRequestHandler):
    out = None
    count_only = False

    def do_POST(self):
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.count_only:
            with LOCK:
                with open(self.out, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"export_bytes": len(body)}) + "\n")
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            import gzip

            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as error:  # a malformed body is the exporter's bug: say so
            self.send_error(400, f"not an ExportTraceServiceRequest: {error}")
            return
        lines = [json.dumps(span, sort_keys=True) for span in spans_of(request)]
        with LOCK:
            with open(self.out, "a", encoding="utf-8") as out:
                for line in lines:
                    out.write(line + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--count-only", action="store_true")
    args = parser.parse_args()
    Handler.out = args.out
    Handler.count_only = args.count_only
    open(args.out, "a").close()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

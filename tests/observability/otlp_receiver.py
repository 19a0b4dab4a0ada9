"""An OTLP/HTTP trace receiver on loopback: what a collector would get, decoded."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict
    resource: dict


def _values(pairs) -> dict:
    out = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        out[pair.key] = getattr(pair.value, kind) if kind else None
    return out


class OTLPReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        resource = _values(resource_spans.resource.attributes)
                        for scope in resource_spans.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append(ReceivedSpan(
                                    span.name, span.trace_id.hex(), span.span_id.hex(),
                                    span.parent_span_id.hex(), _values(span.attributes), resource))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OTLPReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

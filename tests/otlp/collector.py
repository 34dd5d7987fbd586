"""An OTLP/gRPC trace collector for the router's tests, built on OpenTelemetry's own protocol
definitions (PyPI `opentelemetry-proto`, served with `grpcio`): it takes
`opentelemetry.proto.collector.trace.v1.TraceService/Export` calls on 127.0.0.1, prints its
port as the first line of stdout, then one JSON line per span received (ids in hex, the
resource's service.name, the attributes), and answers each call with an empty
ExportTraceServiceResponse. `--fail N`: the first N calls are answered UNAVAILABLE (a
collector in trouble). Runs until killed or its stdin closes.
"""

import argparse
import json
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, fail):
        self.fail = fail
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            if self.fail > 0:
                self.fail -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "collector in trouble")
            for rs in request.resource_spans:
                resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        print(json.dumps({
                            "service": resource.get("service.name"),
                            "scope": ss.scope.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "status": s.status.code,
                            "flags": s.flags,
                            "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                        }), flush=True)
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fail", type=int, default=0)
    args = ap.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(args.fail), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()

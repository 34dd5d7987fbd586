#!/usr/bin/env python3
"""What large prompts cost the router in memory (docs/security.md, "Admission").

Starts an engine that answers at once (this script, a thread: it reads the body and answers a
fixed completion; the simulated engine would spend simulated prefill time on a 5 MB prompt) and
a release `sgl-router` in front of it, sends N copies of one large completion (or chat) at once,
and prints the statuses and the router's resident memory at rest and at its peak (VmHWM).

  python3 benches/memory_budget.py [N] [POLICY] [WORDS] [-- router args...]
  e.g. python3 benches/memory_budget.py 8 cache_aware 200000 -- --max-request-memory-bytes 268435456
  CHAT=1 sends a chat instead of a completion. Build first: cargo build --release -p sgl-router.
"""
import json, os, re, subprocess, sys, threading, time, urllib.error, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


class Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, body, code=200):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply({"object": "list", "data": [{"id": "default", "object": "model"}]})
        elif self.path in ("/health", "/readiness"):
            self.reply({})
        else:
            self.reply({"error": "not found"}, 404)

    def do_POST(self):
        left = int(self.headers.get("content-length", 0))
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
        self.reply({"id": "x", "object": "text_completion", "model": "default",
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    n = int(args[0]) if len(args) > 0 else 8
    policy = args[1] if len(args) > 1 else "cache_aware"
    words = int(args[2]) if len(args) > 2 else 1_000_000
    engine = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    worker = f"http://127.0.0.1:{engine.server_address[1]}"
    binary = os.path.join(ROOT, "target/release/sgl-router")
    router = subprocess.Popen([binary, "--worker-urls", worker, "--policy", policy, "--host", "127.0.0.1",
                               "--port", "0", "--log-level", "error"] + extra,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = router.stdout.readline().strip().removeprefix("sgl-router listening on ")
    threading.Thread(target=lambda: [None for _ in router.stdout], daemon=True).start()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/readiness", timeout=1).status == 200:
                break
        except Exception:
            time.sleep(0.1)

    def rss():
        status = open(f"/proc/{router.pid}/status").read()
        field = lambda name: int(re.search(rf"{name}:\s+(\d+)", status).group(1)) // 1024
        return field("VmRSS"), field("VmHWM")

    chat = os.environ.get("CHAT") == "1"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text = "word " * words
    body = {"model": "default", "max_tokens": 1}
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    data = json.dumps(body).encode()
    base, _ = rss()
    statuses = []

    def one():
        request = urllib.request.Request(url + path, data=data, headers={"content-type": "application/json"})
        try:
            statuses.append(urllib.request.urlopen(request, timeout=600).status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
        except Exception as e:
            statuses.append(str(e)[:40])

    started = time.time()
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, peak = rss()
    print(f"{path}, body {len(data)} B x {n}, --policy {policy} {' '.join(extra)}: statuses {sorted(statuses, key=str)}; "
          f"router RSS {base} MiB at rest, peak {peak} MiB ({peak - base} over rest); {time.time() - started:.1f} s")
    router.terminate()
    router.wait()


if __name__ == "__main__":
    main()

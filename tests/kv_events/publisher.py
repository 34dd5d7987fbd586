#!/usr/bin/env python3
"""Drive an engine's REAL KV-event ZMQ publisher, step by step, for Rust tests.

    python tests/kv_events/publisher.py --engine sglang|vllm \
        --endpoint tcp://127.0.0.1:PORT --replay-endpoint tcp://127.0.0.1:PORT2 \
        [--topic T] [--dp-rank R] [--buffer-steps N] [--hwm N]

Runs ``ZmqEventPublisher`` from SGLang's ``sglang/srt/disaggregation/kv_events.py``
or vLLM's ``vllm/distributed/kv_events.py`` (imported with the minimal stubs of
``engine_events.py`` next to this file; no torch). Set up a venv with
``tests/kv_events/setup_venv.sh``.

Binding
-------
* Both engines add the DP rank to the port (``offset_endpoint_port``): rank r
  binds ``PORT + r`` and ``PORT2 + r``. This driver keeps that behaviour; the
  ``ready`` line reports the endpoints actually bound.
* SGLang: constructed with ``bind=True`` so a concrete host such as
  127.0.0.1 is bound (SGLang's own option).
* vLLM: the PUB socket binds only for a wildcard (``*`` / ``::``) or
  ipc/inproc endpoint and CONNECTS otherwise, so a concrete tcp host is
  rewritten to ``tcp://*:PORT`` (binds all interfaces). vLLM's replay ROUTER
  always binds, so the replay endpoint is passed unchanged.

Protocol: one JSON object per line on stdin, exactly one JSON line back on
stdout for each (nothing else is written to stdout; engine logs go to stderr).

  startup                      -> {"ready": true, "engine", "version", "endpoint", "replay_endpoint", "topic", "dp_rank"}
                                  (import failure: {"ready": false, "error"} and exit code 3)
  {"cmd": "publish", "events": [...], "dp_rank": null|int, "ts": float?}
                               -> {"ok": true, "seq": n, "dropped": bool, "payload_hex": "..."}
      Builds the engine's real event objects, calls ``publisher.publish(batch)``
      and acks once the publisher thread has passed the frames to the PUB
      socket's ``send_multipart`` (or skipped it, see drop_next). dp_rank null
      lets the publisher fill in its own rank (as the engines do).
  {"cmd": "drop_next"}         -> {"ok": true}
      The next published batch gets its seq and goes into the replay buffer,
      but is not sent on the PUB socket (one ``send_multipart`` call skipped).
  {"cmd": "restart"}           -> {"ok": true, "endpoint", "replay_endpoint"}
      ``shutdown()`` and a new publisher on the same endpoints: seq restarts at
      0, replay buffer empty. Acked once the new sockets are bound.
  {"cmd": "quit"}              -> {"ok": true}, then exit 0 (EOF on stdin does the same).
  anything failing             -> {"ok": false, "error": "..."}

Events use the fixture ``expect`` shape (tests/fixtures/kv_events/wire_cases.json):
  {"type": "BlockStored", "block_hashes": [H...], "parent": H|null, "token_ids": [...],
   "bigram": bool, "block_size": n, "medium": str|null, "lora_name": str|null,
   "cache_salt": str|null, "group_idx": int|null, "lora_id": int|null, "extra": {...}}
  {"type": "BlockRemoved", "block_hashes": [H...], "medium": str|null, "group_idx": int|null}
  {"type": "AllBlocksCleared"}
H is an integer (SGLang: signed i64; vLLM: unsigned u64) or {"i64": n} /
{"u64": n} / {"bytes_hex": "..."}. Missing keys mean None. ``bigram: true``
(SGLang) turns the raw tokens into the [t_i, t_i+1] pairs SGLang's recorder
emits. A field the engine's class does not have (SGLang: group_idx; vLLM:
cache_salt) is dropped and listed in the ack as "ignored". ``extra`` is passed
as keyword arguments to the engine's class (e.g. {"session_id": "s"}); an
unknown name there is an error.

Note: an ack means the publisher handed the frames to ZMQ, not that a
subscriber got them (PUB drops messages sent before a subscription arrives).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from pathlib import Path

OUT = sys.stdout
sys.stdout = sys.stderr  # keep stdout for the JSON protocol only
sys.path.insert(0, str(Path(__file__).resolve().parent))


def emit(obj) -> None:
    OUT.write(json.dumps(obj) + "\n")
    OUT.flush()


def parse_hash(h):
    if isinstance(h, bool):
        raise ValueError("bool is not a hash")
    if isinstance(h, int):
        return h
    if isinstance(h, dict):
        if "i64" in h:
            return int(h["i64"])
        if "u64" in h:
            return int(h["u64"])
        if "bytes_hex" in h:
            return bytes.fromhex(h["bytes_hex"])
    raise ValueError(f"bad hash {h!r}")


class Driver:
    def __init__(self, args):
        self.args = args
        self.engine = args.engine
        import engine_events

        if self.engine == "sglang":
            # Any installed version is driven (the ready line reports it);
            # the fixtures/pins are for 0.5.23.
            self.m = engine_events.SGLang(check_version=False)
        else:
            self.m = engine_events.VLLM()
        self.version = self.m.version
        self.endpoint = args.endpoint
        if self.engine == "vllm":
            self.endpoint = self._wildcard(args.endpoint)
        self.pub = None
        self.sent: queue.Queue = queue.Queue()
        self.drop_next = False
        self.start()

    @staticmethod
    def _wildcard(endpoint: str) -> str:
        """vLLM connects to concrete tcp hosts; bind needs ``tcp://*:P``."""
        if endpoint.startswith("tcp://"):
            hostport = endpoint[len("tcp://"):]
            host, _, port = hostport.rpartition(":")
            if host not in ("*",) and "::" not in host:
                return f"tcp://*:{port}"
        return endpoint

    # -- publisher lifecycle ------------------------------------------------

    def _construct(self):
        a = self.args
        kw = dict(endpoint=self.endpoint, replay_endpoint=a.replay_endpoint,
                  buffer_steps=a.buffer_steps, hwm=a.hwm, topic=a.topic)
        if self.engine == "sglang":
            return self.m.ZmqEventPublisher(attn_dp_rank=a.dp_rank, bind=True, **kw)
        return self.m.ZmqEventPublisher(data_parallel_rank=a.dp_rank, **kw)

    def start(self):
        import zmq

        deadline = time.monotonic() + 10.0
        while True:
            try:
                pub = self._construct()
                break
            except zmq.ZMQError as e:  # port still held by the previous publisher's sockets
                if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sock = pub._pub
        orig = sock.send_multipart

        def send_multipart(frames, *a, **kw):
            # Called by the publisher thread for every live batch.
            seq = int.from_bytes(frames[1], "big")
            dropped = self.drop_next
            if dropped:
                self.drop_next = False
            else:
                orig(frames, *a, **kw)
            self.sent.put((seq, dropped, bytes(frames[2])))

        sock.send_multipart = send_multipart  # monkeypatch (instance attribute)
        self.pub = pub

    def bound(self):
        p = self.pub
        return p._endpoint, p._replay_endpoint

    def stop(self):
        if self.pub is not None:
            self.pub.shutdown()
            self.pub = None

    # -- events -------------------------------------------------------------

    def build_event(self, e: dict, ignored: list):
        m = self.m
        typ = e.get("type")

        def make(cls, kw):
            # Fields this engine version lacks are dropped (and reported when set); "extra" adds raw ones.
            fields = getattr(cls, "__struct_fields__", ())
            for k in list(kw):
                if k not in fields:
                    if kw[k] is not None:
                        ignored.append(k)
                    del kw[k]
            kw.update(e.get("extra") or {})
            return cls(**kw)

        if typ == "BlockStored":
            toks = list(e.get("token_ids", []))
            if e.get("bigram"):
                if self.engine != "sglang":
                    raise ValueError("bigram token pairs are an SGLang-only shape")
                toks = [(toks[j], toks[j + 1]) for j in range(len(toks) - 1)]
            parent = e.get("parent", e.get("parent_block_hash"))
            kw = dict(
                block_hashes=[parse_hash(h) for h in e["block_hashes"]],
                parent_block_hash=None if parent is None else parse_hash(parent),
                token_ids=toks,
                block_size=int(e["block_size"]),
                lora_id=e.get("lora_id"),
                medium=e.get("medium"),
                lora_name=e.get("lora_name"),
                cache_salt=e.get("cache_salt"),
                group_idx=e.get("group_idx"),
            )
            return make(m.BlockStored, kw)
        if typ == "BlockRemoved":
            return make(m.BlockRemoved, dict(block_hashes=[parse_hash(h) for h in e["block_hashes"]],
                                             medium=e.get("medium"), group_idx=e.get("group_idx")))
        if typ == "AllBlocksCleared":
            return m.AllBlocksCleared()
        raise ValueError(f"unknown event type {typ!r}")

    def publish(self, cmd: dict) -> dict:
        ignored: list = []
        events = [self.build_event(e, ignored) for e in cmd.get("events", [])]
        ts = float(cmd["ts"]) if cmd.get("ts") is not None else time.time()
        dp = cmd.get("dp_rank")
        if self.engine == "sglang":
            batch = self.m.KVEventBatch(ts=ts, events=events, attn_dp_rank=dp)
        else:
            batch = self.m.KVEventBatch(ts=ts, events=events, data_parallel_rank=dp)
        while not self.sent.empty():  # stale entries (none expected)
            self.sent.get_nowait()
        self.pub.publish(batch)
        seq, dropped, payload = self.sent.get(timeout=10.0)
        ack = {"ok": True, "seq": seq, "dropped": dropped, "payload_hex": payload.hex()}
        if ignored:
            ack["ignored"] = sorted(set(ignored))
        return ack


def main() -> int:
    ap = argparse.ArgumentParser(description="drive an engine's real KV-event ZMQ publisher")
    ap.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    ap.add_argument("--endpoint", required=True, help="PUB endpoint, e.g. tcp://127.0.0.1:5557")
    ap.add_argument("--replay-endpoint", default=None, help="ROUTER endpoint for replay")
    ap.add_argument("--topic", default="")
    ap.add_argument("--dp-rank", type=int, default=0)
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--hwm", type=int, default=100_000)
    args = ap.parse_args()

    try:
        drv = Driver(args)
    except ImportError as e:
        emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 3
    except Exception as e:
        emit({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 4
    ep, rep = drv.bound()
    emit({"ready": True, "engine": args.engine, "version": drv.version, "endpoint": ep,
          "replay_endpoint": rep, "topic": args.topic, "dp_rank": args.dp_rank})

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            name = cmd.get("cmd")
            if name == "publish":
                emit(drv.publish(cmd))
            elif name == "drop_next":
                drv.drop_next = True
                emit({"ok": True})
            elif name == "restart":
                drv.stop()
                drv.start()
                ep, rep = drv.bound()
                emit({"ok": True, "endpoint": ep, "replay_endpoint": rep})
            elif name == "quit":
                drv.stop()
                emit({"ok": True})
                return 0
            else:
                emit({"ok": False, "error": f"unknown cmd {name!r}"})
        except Exception as e:
            emit({"ok": False, "error": f"{type(e).__name__}: {e}"})
    drv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

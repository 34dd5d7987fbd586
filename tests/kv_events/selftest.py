#!/usr/bin/env python3
"""Self-test of publisher.py against both engines with a plain pyzmq SUB/DEALER.

    /tmp/sgl-router-kv-venv/bin/python tests/kv_events/selftest.py [--engine sglang|vllm] [-v]

Checks: ready line; live messages are 3 frames (topic, 8-byte BE seq, payload
equal to the ack's payload_hex); drop_next makes a seq gap that the replay
ROUTER fills; the replay stream's exact frame shape and END_SEQ marker;
restart puts seq back to 0 with an empty replay buffer; dp_rank r binds
PORT + r. Prints what each engine's replay really sends.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import zmq

HERE = Path(__file__).resolve().parent
END_SEQ = b"\xff" * 8


def free_port_pair() -> int:
    """A base port P with P, P+1 (dp offset) free; replay uses P+10."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p < 60000:
            return p


class Proc:
    def __init__(self, *args):
        self.p = subprocess.Popen([sys.executable, str(HERE / "publisher.py"), *args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"publisher exited rc={self.p.wait()}")
        return json.loads(line)

    def cmd(self, **kw):
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return self.read()


def recv_all(sock, timeout_ms=2000):
    out = []
    while sock.poll(timeout_ms):
        out.append(sock.recv_multipart())
        timeout_ms = 200
    return out


def replay(ctx, endpoint, start_seq, verbose):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    d.send_multipart([b"", start_seq.to_bytes(8, "big")])
    msgs = []
    while d.poll(3000):
        m = d.recv_multipart()
        msgs.append(m)
        if END_SEQ in m:
            break
    d.close()
    if verbose:
        for m in msgs:
            print("   replay frames:", [f.hex() if len(f) <= 8 else f"<{len(f)} bytes>" for f in m])
    return msgs


def run(engine, topic, dp_rank, verbose) -> dict:
    base = free_port_pair()
    rbase = free_port_pair()
    args = ["--engine", engine, "--endpoint", f"tcp://127.0.0.1:{base}",
            "--replay-endpoint", f"tcp://127.0.0.1:{rbase}", "--topic", topic,
            "--dp-rank", str(dp_rank), "--buffer-steps", "100"]
    pr = Proc(*args)
    ready = pr.read()
    print(f"[{engine} topic={topic!r} dp={dp_rank}] ready: {ready}")
    assert ready["ready"] is True, ready
    pub_port = base + dp_rank
    rep_port = rbase + dp_rank
    assert ready["endpoint"].endswith(f":{pub_port}"), ready
    assert ready["replay_endpoint"].endswith(f":{rep_port}"), ready
    tb = topic.encode()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, tb)
    sub.connect(f"tcp://127.0.0.1:{pub_port}")
    time.sleep(0.5)  # slow joiner
    rep_ep = f"tcp://127.0.0.1:{rep_port}"

    ev1 = [{"type": "BlockStored", "block_hashes": [-3488128144981237669, 5674439469042975057],
            "parent": None, "token_ids": list(range(1, 9)), "block_size": 4, "medium": "GPU",
            "cache_salt": "tenant", "group_idx": 0}]
    ev2 = [{"type": "BlockRemoved", "block_hashes": [{"u64": 2**64 - 1}], "medium": "GPU"},
           {"type": "AllBlocksCleared"}]
    a1 = pr.cmd(cmd="publish", events=ev1, dp_rank=None)
    a2 = pr.cmd(cmd="publish", events=ev2, dp_rank=7)
    print("  acks:", {k: v for k, v in a1.items() if k != "payload_hex"},
          {k: v for k, v in a2.items() if k != "payload_hex"})
    assert a1["ok"] and a1["seq"] == 0 and a2["seq"] == 1, (a1, a2)
    live = recv_all(sub)
    assert [len(m) for m in live] == [3, 3], live
    for m, a in zip(live, (a1, a2)):
        assert m[0] == tb and len(m[1]) == 8 and int.from_bytes(m[1], "big") == a["seq"]
        assert m[2].hex() == a["payload_hex"]
    b1 = msgpack.unpackb(live[0][2], raw=False)
    b2 = msgpack.unpackb(live[1][2], raw=False)
    assert b1[2] == dp_rank and b2[2] == 7, (b1, b2)  # null -> the publisher's own rank
    if verbose:
        print("   live batch 1:", b1)
        print("   live batch 2:", b2)

    assert pr.cmd(cmd="drop_next") == {"ok": True}
    a3 = pr.cmd(cmd="publish", events=[{"type": "AllBlocksCleared"}])
    a4 = pr.cmd(cmd="publish", events=[{"type": "BlockRemoved", "block_hashes": [5]}])
    assert a3["seq"] == 2 and a3["dropped"] and a4["seq"] == 3 and not a4["dropped"], (a3, a4)
    live = recv_all(sub)
    assert [int.from_bytes(m[1], "big") for m in live] == [3], live  # seq 2 missing

    msgs = replay(ctx, rep_ep, 2, verbose)
    shapes = [len(m) for m in msgs]
    assert shapes == [4, 4, 4], (engine, shapes)
    for m, seq, a in zip(msgs[:2], (2, 3), (a3, a4)):
        assert m[0] == b"" and m[1] == tb and int.from_bytes(m[2], "big") == seq
        assert m[3].hex() == a["payload_hex"]
    assert msgs[2] == [b"", b"", END_SEQ, b""], msgs[2]
    msgs0 = replay(ctx, rep_ep, 0, False)
    assert [int.from_bytes(m[2], "big") for m in msgs0[:-1]] == [0, 1, 2, 3]

    r = pr.cmd(cmd="restart")
    assert r["ok"], r
    msgs = replay(ctx, rep_ep, 0, False)
    assert msgs == [[b"", b"", END_SEQ, b""]], msgs  # empty buffer after restart
    # libzmq resends a SUB's subscriptions after a reconnect only when the SUB's
    # own thread calls into it (commands are processed on send/recv/poll), so
    # keep polling while the SUB reconnects; a sleeping SUB stays unsubscribed.
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:
        assert not sub.poll(50)
    a5 = pr.cmd(cmd="publish", events=[{"type": "AllBlocksCleared"}])
    assert a5["seq"] == 0, a5
    live = recv_all(sub)
    got = [int.from_bytes(m[1], "big") for m in live]
    assert got == [0], got

    # bad command -> error ack, process survives
    bad = pr.cmd(cmd="publish", events=[{"type": "BlockStored", "block_hashes": [1.5]}])
    assert bad["ok"] is False, bad
    assert pr.cmd(cmd="quit") == {"ok": True}
    rc = pr.p.wait(timeout=10)
    assert rc == 0, rc
    sub.close()
    ctx.term()
    return {"engine": engine, "version": ready["version"], "replay_shapes": shapes}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("sglang", "vllm"))
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    engines = [a.engine] if a.engine else ["sglang", "vllm"]
    for e in engines:
        for topic, dp in (("", 0), ("kv-events", 1)):
            run(e, topic, dp, a.verbose)
    print("OK")


if __name__ == "__main__":
    main()

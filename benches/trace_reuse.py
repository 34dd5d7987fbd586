#!/usr/bin/env python3
"""How predictable prefix reuse is in a Mooncake-format trace (docs/benchmarks.md,
"Routing quality (simulation)"): for each request, whether a later request
extends its full blocks, and after how long, grouped by how many blocks the
request matched against everything before it (what a router can see).

    python3 benches/trace_reuse.py ../shared/traces/mooncake/conversation_trace.jsonl
"""
import collections
import json
import sys


def main(path: str) -> None:
    reqs = [json.loads(line) for line in open(path)]
    seen = set()
    depth = []
    for r in reqs:
        d = 0
        for b in r["hash_ids"]:
            if b not in seen:
                break
            d += 1
        depth.append(d)
        seen.update(r["hash_ids"])
    # A request is reused when a later one contains its last full block (the
    # last block is usually partial and changes when the prompt grows).
    next_seen = {}
    gap = [None] * len(reqs)
    for i in range(len(reqs) - 1, -1, -1):
        ids = reqs[i]["hash_ids"]
        if len(ids) >= 2 and ids[-2] in next_seen:
            gap[i] = (next_seen[ids[-2]] - reqs[i]["timestamp"]) / 1000
        for b in ids:
            next_seen[b] = reqs[i]["timestamp"]
    groups = collections.defaultdict(list)
    for i in range(len(reqs)):
        key = "0-1" if depth[i] <= 1 else ("2-9" if depth[i] < 10 else "10+")
        groups[key].append(gap[i])

    def q(xs, p):
        return xs[int(p * (len(xs) - 1))] if xs else float("nan")

    print(f"{'matched blocks':>14} {'requests':>9} {'reused':>7} {'gap p25':>8} {'p50':>7} {'p75':>7} {'p90':>7}")
    for key in ("0-1", "2-9", "10+", "all"):
        gs = [g for k in groups for g in groups[k]] if key == "all" else groups[key]
        reused = sorted(g for g in gs if g is not None)
        print(f"{key:>14} {len(gs):>9} {len(reused) / len(gs):>7.2f} "
              + " ".join(f"{q(reused, p):>7.0f}s" for p in (0.25, 0.5, 0.75, 0.9)))
    blocks = len(seen)
    span = (reqs[-1]["timestamp"] - reqs[0]["timestamp"]) / 1000
    print(f"new blocks per second: {blocks / span:.1f} ({blocks} over {span:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1])

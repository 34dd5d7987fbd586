#!/usr/bin/env python3
"""Baseline for `cargo bench --bench renderer`: HF transformers' apply_chat_template
+ tokenize on the same chats, so our speed can be quoted as a ratio.

Usage:
    python3 benches/renderer_transformers.py --write-inputs   # (re)writes benches/data/renderer_chats.json
    python3 benches/renderer_transformers.py                  # prints a table of median times

Needs `transformers` and `tokenizers` (tests/fixtures/gen_fixtures.sh makes a venv with them).
The chats are deterministic: 1 KiB, 16 KiB and 128 KiB multi-turn conversations with a
shared system prompt; each timed call changes only the last user message, as a live
conversation does.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INPUTS = os.path.join(HERE, "data", "renderer_chats.json")
TOKENIZER_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "qwen3")

SENTENCES = [
    "The router keeps an index of which replica holds which prefix in its KV cache.",
    "Each engine publishes BlockStored and BlockRemoved events over ZMQ.",
    "def route(request):\n    return min(workers, key=lambda w: w.load)\n",
    "路由器根据前缀缓存选择最合适的副本。",
    "Les caches de préfixe réduisent le temps jusqu'au premier jeton.",
    "Numbers: 3.14159, 2.71828, 1.41421 and 42.",
    "SELECT worker, count(*) FROM requests GROUP BY worker ORDER BY 2 DESC;",
    "Emoji are bytes too: 🚀🔥✅ and accented letters: ñ, ü, ø.",
]


def make_chat(target_bytes, seed):
    rng = random.Random(seed)
    system = "You are a careful assistant for a serving team. " + " ".join(rng.choice(SENTENCES) for _ in range(6))
    messages = [{"role": "system", "content": system}]
    size = len(system.encode())
    turn = 0
    while size < target_bytes:
        role = "user" if turn % 2 == 0 else "assistant"
        n = rng.randint(2, 12)
        text = " ".join(rng.choice(SENTENCES) for _ in range(n))
        messages.append({"role": role, "content": text})
        size += len(text.encode()) + 24
        turn += 1
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Summarize the conversation."})
    return messages


def write_inputs():
    chats = {name: make_chat(size, i) for i, (name, size) in enumerate([("1k", 1024), ("16k", 16 * 1024), ("128k", 128 * 1024)])}
    os.makedirs(os.path.dirname(INPUTS), exist_ok=True)
    with open(INPUTS, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "tests/fixtures/tokenizers/qwen3", "chats": chats}, f, ensure_ascii=False)
    print(f"wrote {INPUTS}")


def with_last(messages, i):
    out = [dict(m) for m in messages]
    out[-1]["content"] = f"{out[-1]['content']} (variant {i})"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-inputs", action="store_true")
    ap.add_argument("--seconds", type=float, default=3.0, help="time budget per size")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.write_inputs:
        write_inputs()
        return

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    data = json.load(open(INPUTS, encoding="utf-8"))
    rows = []
    for name, messages in data["chats"].items():
        samples, i, deadline = [], 0, time.perf_counter() + args.seconds
        while time.perf_counter() < deadline or len(samples) < 5:
            chat = with_last(messages, i)
            t0 = time.perf_counter()
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False)
            samples.append(time.perf_counter() - t0)
            i += 1
        rows.append({"chat": name, "bytes": len(text.encode()), "tokens": len(ids), "median_us": statistics.median(samples) * 1e6, "runs": len(samples)})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"transformers {sys.modules['transformers'].__version__}: apply_chat_template + encode (median)")
    print(f"{'chat':>6} {'bytes':>8} {'tokens':>7} {'median':>12} {'runs':>6}")
    for r in rows:
        print(f"{r['chat']:>6} {r['bytes']:>8} {r['tokens']:>7} {r['median_us']:>10.1f}us {r['runs']:>6}")


if __name__ == "__main__":
    main()

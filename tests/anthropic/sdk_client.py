#!/usr/bin/env python3
"""Anthropic's own Python SDK (PyPI `anthropic`) as the router's client.

    "$PY" tests/anthropic/sdk_client.py BASE_URL API_KEY

Runs, against the router at BASE_URL with the key API_KEY (sent as the SDK sends it,
`x-api-key`): a message, the same streamed (the SDK's event parser and its final message), a
token count, a request the router refuses (the SDK's error class and Anthropic's error type),
and a wrong key. Prints one JSON object of what it saw; the Rust test
(crates/router/tests/suite/anthropic.rs) asserts on it. Any exception the SDK raises where none
is expected propagates: the script exits non-zero.
"""
import json
import sys

import anthropic


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=30.0)
    system = "You are a terse assistant who answers in one line. " * 4
    out = {"sdk_version": anthropic.__version__}

    msg = client.messages.create(
        model="default",
        max_tokens=6,
        system=system,
        messages=[{"role": "user", "content": "What is a KV cache?"}],
    )
    out["create"] = {
        "type": msg.type,
        "role": msg.role,
        "text": "".join(b.text for b in msg.content if b.type == "text"),
        "stop_reason": msg.stop_reason,
        "input_tokens": msg.usage.input_tokens,
        "output_tokens": msg.usage.output_tokens,
    }

    events = []
    with client.messages.stream(
        model="default",
        max_tokens=5,
        system=system,
        messages=[{"role": "user", "content": [{"type": "text", "text": "And a page?"}]}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    out["stream"] = {
        "text": text,
        "final_text": "".join(b.text for b in final.content if b.type == "text"),
        "stop_reason": final.stop_reason,
        "output_tokens": final.usage.output_tokens,
        "cache_read_input_tokens": final.usage.cache_read_input_tokens or 0,
    }

    count = client.messages.count_tokens(
        model="default", system=system, messages=[{"role": "user", "content": "What is a KV cache?"}]
    )
    out["count_tokens"] = count.input_tokens

    try:
        client.messages.create(model="default", max_tokens=4, messages=[{"role": "robot", "content": "x"}])
        out["refused"] = None
    except anthropic.BadRequestError as e:
        out["refused"] = {"status": e.status_code, "type": e.body["error"]["type"], "message": e.body["error"]["message"]}

    wrong = anthropic.Anthropic(base_url=base_url, api_key=key + "-wrong", max_retries=0, timeout=30.0)
    try:
        wrong.messages.create(model="default", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        out["wrong_key"] = None
    except anthropic.AuthenticationError as e:
        out["wrong_key"] = {"status": e.status_code, "type": e.body["error"]["type"]}

    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Checks that a routing config's examples were not taken from a benchmark's questions: for
every example of every `domain` label, the largest share of its words that one question's
first turn also has (Jaccard over lower-case word sets). Fails above the limit.
    python3 tools/check_example_overlap.py CONFIG.yaml question.jsonl [LIMIT=0.5]"""
import json
import re
import sys


def words(text):
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def examples(path):
    # The examples are one quoted string per line under `examples:` (the configs under benches/data).
    out = []
    for line in open(path, encoding="utf-8"):
        m = re.match(r'\s*- "(.*)"\s*$', line)
        if m:
            out.append(m.group(1).replace('\\"', '"'))
    return out


def main():
    config, questions = sys.argv[1], sys.argv[2]
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    turns = [json.loads(l)["turns"][0] for l in open(questions, encoding="utf-8") if l.strip()]
    worst = (0.0, "", "")
    for e in examples(config):
        we = words(e)
        for t in turns:
            wt = words(t)
            j = len(we & wt) / max(1, len(we | wt))
            if j > worst[0]:
                worst = (j, e, t)
    print(f"{len(examples(config))} examples, {len(turns)} questions: highest word overlap {worst[0]:.2f}")
    print(f"  example:  {worst[1]}\n  question: {worst[2][:160]}")
    if worst[0] > limit:
        sys.exit(f"an example shares more than {limit:.0%} of its words with a question")


main()

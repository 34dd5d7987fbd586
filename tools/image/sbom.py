#!/usr/bin/env python3
"""Writes the image's SBOM (SPDX 2.3, JSON): the Rust crates linked into the binaries
(`cargo tree` with the image's features, normal edges, checksums from Cargo.lock) and the
Debian packages of its root (`dpkg-query` against the root's dpkg database).

    python3 tools/image/sbom.py --repo REPO --root ROOT --features F --packages P,Q \
        --name NAME --version V --revision R --created EPOCH --out FILE
"""
import argparse
import datetime
import hashlib
import json
import re
import subprocess
import sys
import tomllib

TREE_LINE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+) v(?P<version>\S+)(?: \((?P<source>[^)]*)\))?(?: \(\*\))?\|(?P<license>.*)$")


def spdx_id(kind, name, version):
    ident = re.sub(r"[^A-Za-z0-9.-]", "-", f"{name}-{version}")
    return f"SPDXRef-{kind}-{ident}"


def crates(repo, features, packages):
    cmd = ["cargo", "tree", "--locked", "--edges", "normal", "--prefix", "none",
           "--format", "{p}|{l}", "--features", features]
    for p in packages:
        cmd += ["-p", p]
    out = subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout
    with open(f"{repo}/Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    seen = {}
    for line in out.splitlines():
        line = line.strip().replace(" (*)", "")
        if not line:
            continue
        m = TREE_LINE.match(line)
        if not m:
            sys.exit(f"sbom: cannot read cargo tree line: {line!r}")
        name, version, source = m["name"], m["version"], m["source"] or ""
        macro = source == "proc-macro"
        if macro:
            source = ""
        local = source.startswith("/")
        # Cargo's legacy "MIT/Apache-2.0" means either: SPDX spells it with OR.
        license = " OR ".join(x.strip() for x in m["license"].split("/")) if "/" in m["license"] else m["license"]
        seen[(name, version)] = {
            "license": license.strip() or "NOASSERTION",
            "macro": macro,
            "local": local,
            "checksum": checksums.get((name, version)),
        }
    return seen


def debs(root):
    out = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
         "-f", "${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}\n"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        name, version, arch, status = line.split("\t")
        if status.strip() == "ii":
            rows.append((name, version, arch))
    return rows


def main():
    ap = argparse.ArgumentParser()
    for a in ("repo", "root", "features", "packages", "name", "version", "revision", "created", "out"):
        ap.add_argument(f"--{a}", required=True)
    a = ap.parse_args()
    created = datetime.datetime.fromtimestamp(int(a.created), datetime.timezone.utc)
    created = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    image_id = "SPDXRef-image"
    packages = [{
        "SPDXID": image_id,
        "name": a.name,
        "versionInfo": a.version,
        "downloadLocation": "NOASSERTION",
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "Apache-2.0",
        "copyrightText": "NOASSERTION",
        "comment": f"container image built from revision {a.revision}",
        "primaryPackagePurpose": "CONTAINER",
    }]
    rels = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
             "relatedSpdxElement": image_id}]
    for (name, version), c in sorted(crates(a.repo, a.features, a.packages.split(",")).items()):
        pid = spdx_id("crate", name, version)
        pkg = {
            "SPDXID": pid,
            "name": name,
            "versionInfo": version,
            "downloadLocation": "NOASSERTION" if c["local"]
            else f"https://crates.io/api/v1/crates/{name}/{version}/download",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": c["license"],
            "copyrightText": "NOASSERTION",
            "filesAnalyzed": False,
        }
        if c["local"]:
            pkg["comment"] = "a crate of this workspace"
        if c["macro"]:
            pkg["comment"] = "a procedural macro: runs at build time, not linked into the binaries"
        else:
            pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                    "referenceLocator": f"pkg:cargo/{name}@{version}"}]
        if c["checksum"]:
            pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": c["checksum"]}]
        packages.append(pkg)
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pid})
    for name, version, arch in debs(a.root):
        pid = spdx_id("deb", name, version)
        packages.append({
            "SPDXID": pid,
            "name": name,
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "filesAnalyzed": False,
            "comment": f"Debian package; its copyright: /usr/share/doc/{name}/copyright",
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:deb/debian/{name}@{version}?arch={arch}&distro=debian-12"}],
        })
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pid})
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{a.name}-{a.version}",
        "documentNamespace": f"https://github.com/sgl-router/sgl-router/sbom/{a.name}-{a.version}-{a.revision}-"
        + hashlib.sha256(json.dumps(packages, sort_keys=True).encode()).hexdigest()[:16],
        "creationInfo": {"created": created, "creators": ["Tool: sgl-router tools/image/sbom.py"]},
        "packages": packages,
        "relationships": rels,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    n_crates = sum(1 for p in packages if p["SPDXID"].startswith("SPDXRef-crate-"))
    n_debs = sum(1 for p in packages if p["SPDXID"].startswith("SPDXRef-deb-"))
    print(f"sbom: {a.out}: {n_crates} crates, {n_debs} Debian packages (SPDX 2.3)")


if __name__ == "__main__":
    main()

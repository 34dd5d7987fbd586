#!/usr/bin/env python3
"""Reads an OCI image archive (an OCI layout in a tar, as `buildah commit oci-archive:` and
`docker save` write it) without a container engine: checks every blob's digest and size against
its descriptor, prints the layer list and sizes, and unpacks the layers in order into a root
directory as a runtime would (whiteouts applied, owners and modes kept; members that would land
outside the root are refused). Prints the image's config as shell assignments for check.sh.

    python3 tools/image/oci.py ARCHIVE ROOT_DIR > image.env
"""
import gzip
import hashlib
import io
import json
import os
import posixpath
import shlex
import shutil
import stat
import sys
import tarfile

LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": None,
    "application/vnd.oci.image.layer.v1.tar+gzip": "gz",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gz",
}


def log(msg):
    print(msg, file=sys.stderr)


def fail(msg):
    sys.exit(f"oci: {msg}")


class Layout:
    def __init__(self, archive):
        self.tar = tarfile.open(archive)
        self.members = {posixpath.normpath(m.name): m for m in self.tar.getmembers()}

    def blob(self, desc):
        algo, digest = desc["digest"].split(":", 1)
        if algo != "sha256":
            fail(f"digest algorithm {algo} not supported")
        m = self.members.get(f"blobs/sha256/{digest}")
        if m is None:
            fail(f"blob {desc['digest']} missing from the archive")
        data = self.tar.extractfile(m).read()
        if len(data) != desc["size"]:
            fail(f"blob {desc['digest']}: {len(data)} bytes, its descriptor says {desc['size']}")
        if hashlib.sha256(data).hexdigest() != digest:
            fail(f"blob {desc['digest']}: content does not match its digest")
        return data

    def json(self, name):
        m = self.members.get(name)
        if m is None:
            fail(f"{name} missing: not an OCI layout")
        return json.load(self.tar.extractfile(m))


def inside(root, name):
    path = posixpath.normpath(posixpath.join("/", name)).lstrip("/")
    full = os.path.join(root, path)
    if os.path.commonpath([root, os.path.realpath(os.path.dirname(full))]) != root:
        fail(f"layer member {name!r} lands outside the root")
    return full, path


def remove(path):
    if os.path.islink(path) or not os.path.isdir(path):
        if os.path.lexists(path):
            os.unlink(path)
    else:
        shutil.rmtree(path)


def apply_layer(root, raw):
    layer = tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    members = layer.getmembers()
    keep = []
    for m in members:  # whiteouts first: they remove what lower layers put there
        d, base = posixpath.split(m.name)
        if base == ".wh..wh..opq":
            full, _ = inside(root, d)
            if os.path.isdir(full):
                for e in os.listdir(full):
                    remove(os.path.join(full, e))
        elif base.startswith(".wh."):
            full, _ = inside(root, posixpath.join(d, base[4:]))
            remove(full)
        else:
            keep.append(m)
    dirs = []
    for m in keep:
        full, path = inside(root, m.name)
        if m.islnk():
            inside(root, m.linkname)
        if os.path.lexists(full) and not (m.isdir() and os.path.isdir(full)):
            remove(full)
        layer.extract(m, root, set_attrs=True, numeric_owner=True)
        if m.isdir():
            dirs.append(m)
    for m in reversed(dirs):  # directory times and modes after their contents
        full, _ = inside(root, m.name)
        os.chmod(full, stat.S_IMODE(m.mode))
        os.utime(full, (m.mtime, m.mtime))
    return len(keep)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    archive, root = sys.argv[1], os.path.realpath(sys.argv[2])
    oci = Layout(archive)
    if oci.json("oci-layout").get("imageLayoutVersion") != "1.0.0":
        fail("oci-layout is not imageLayoutVersion 1.0.0")
    index = oci.json("index.json")
    if len(index.get("manifests", [])) != 1:
        fail(f"expected one manifest in index.json, found {len(index.get('manifests', []))}")
    mdesc = index["manifests"][0]
    manifest = json.loads(oci.blob(mdesc))
    config = json.loads(oci.blob(manifest["config"]))
    ref = mdesc.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
    log(f"image: {archive} ({os.path.getsize(archive)} bytes), ref {ref!r}, manifest {mdesc['digest']}")
    log(f"  platform: {config.get('os')}/{config.get('architecture')}, created {config.get('created')}")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    total, total_raw = 0, 0
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    if len(diff_ids) != len(manifest["layers"]):
        fail("the config's diff_ids and the manifest's layers differ in number")
    for i, desc in enumerate(manifest["layers"]):
        mt = desc["mediaType"]
        if mt not in LAYER_TYPES:
            fail(f"layer media type {mt} not supported")
        data = oci.blob(desc)
        raw = gzip.decompress(data) if LAYER_TYPES[mt] == "gz" else data
        n = apply_layer(root, raw)
        if "sha256:" + hashlib.sha256(raw).hexdigest() != diff_ids[i]:
            fail(f"layer {i}: uncompressed content does not match the config's diff_id")
        total += desc["size"]
        total_raw += len(raw)
        log(f"  layer {i}: {desc['digest'][:19]} {desc['size']:>11} bytes ({len(raw)} unpacked, {n} entries) {mt}")
    log(f"  layers: {len(manifest['layers'])}, {total} bytes ({total / 1048576:.1f} MiB) compressed, "
        f"{total_raw / 1048576:.1f} MiB unpacked")
    c = config.get("config", {})
    for k in ("User", "WorkingDir", "Entrypoint", "Cmd", "ExposedPorts", "Env"):
        log(f"  {k}: {json.dumps(c.get(k))}")
    for k, v in sorted(manifest.get("annotations", {}).items()):
        log(f"  annotation {k}: {v}")
    for k, v in sorted(c.get("Labels", {}).items()):
        log(f"  label {k}: {v}")
    # The user, resolved in the image's own /etc/passwd and /etc/group, as a runtime does.
    user = c.get("User") or "0"
    name, _, group = user.partition(":")
    uid = gid = None
    with open(os.path.join(root, "etc/passwd")) as f:
        for line in f:
            p = line.rstrip("\n").split(":")
            if p[0] == name or p[2] == name:
                uid, gid, home = int(p[2]), int(p[3]), p[5]
    if uid is None:
        fail(f"user {name!r} is not in the image's /etc/passwd")
    if group:
        gid = int(group) if group.isdigit() else None
        with open(os.path.join(root, "etc/group")) as f:
            for line in f:
                p = line.split(":")
                if p[0] == group:
                    gid = int(p[2])
        if gid is None:
            fail(f"group {group!r} is not in the image's /etc/group")
    out = {
        "IMAGE_UID": str(uid),
        "IMAGE_GID": str(gid),
        "IMAGE_HOME": home,
        "IMAGE_WORKDIR": c.get("WorkingDir") or "/",
        "IMAGE_BYTES": str(os.path.getsize(archive)),
        "IMAGE_LAYERS": str(len(manifest["layers"])),
    }
    for k, v in out.items():
        print(f"{k}={shlex.quote(v)}")
    print("IMAGE_ENTRYPOINT=(" + " ".join(shlex.quote(x) for x in c.get("Entrypoint") or []) + ")")
    print("IMAGE_ENV=(" + " ".join(shlex.quote(x) for x in c.get("Env") or []) + ")")
    print("IMAGE_PORTS=(" + " ".join(shlex.quote(x) for x in sorted(c.get("ExposedPorts") or {})) + ")")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Builds the container image from local parts only: no registry, no Docker engine. The same
# layout as the Dockerfile (which stays for those with a registry): a slim Debian bookworm root
# with ca-certificates (debootstrap --variant=minbase from Debian's packages, trimmed as
# debian:bookworm-slim is), the release binaries `sgl-router` and `sgl-mock-engine` built with
# the image's features (sgl-router/embed), the user `router` (uid 10001), entrypoint
# `sgl-router`, port 30000, OCI labels and annotations, and an SPDX SBOM at
# /usr/share/doc/sgl-router/sbom.spdx.json. Written with buildah as an OCI archive in two
# layers (the Debian root, then the binaries), loadable by `docker load` / `podman load`.
#
#   bash tools/image/build.sh OUT_DIR     # OUT_DIR/sgl-router-VERSION.oci.tar and .spdx.json
#   bash tools/image/build.sh --base DIR  # only the Debian root, into DIR (to reuse: IMAGE_BASE=DIR)
#
# Environment:
#   IMAGE_BASE         a root made by --base: reused instead of running debootstrap again
#   IMAGE_BIN_DIR      a directory holding sgl-router and sgl-mock-engine already built with the
#                      image's features: no cargo build
#   DEBIAN_MIRROR      default http://deb.debian.org/debian
#   SOURCE_DATE_EPOCH  the image's creation time and its files' times (default: HEAD's commit time)
# Needs root, debootstrap and buildah (Debian: apt-get install debootstrap buildah), python3, cargo.
set -euo pipefail

fail() { echo "image build: FAILED: $*" >&2; exit 1; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
FEATURES="sgl-router/embed" # for the SBOM's cargo tree
UID_ROUTER=10001

[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap and buildah's vfs storage need it)"

# The Debian root: minbase + ca-certificates, the user, trimmed like debian:bookworm-slim.
make_base() {
  local dir="$1"
  command -v debootstrap >/dev/null || fail "debootstrap is needed (apt-get install debootstrap)"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "== image: debootstrap --variant=minbase --include=ca-certificates bookworm ($MIRROR)"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$dir/root" "$MIRROR" >"$dir/debootstrap.log" 2>&1 \
    || { tail -n 20 "$dir/debootstrap.log" >&2; fail "debootstrap (log: $dir/debootstrap.log)"; }
  local r="$dir/root"
  chroot "$r" useradd --system --uid "$UID_ROUTER" --no-create-home router
  # What the slim images leave out, kept out of later `apt-get install`s too (copyright files stay).
  cat >"$r/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/groff/* "$r"/usr/share/lintian/*
  rm -rf "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/archives/partial/*
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/log/* "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
  # The runtime provides these (and the host's name and resolver must not be baked in).
  rm -rf "$r"/dev/* "$r"/proc/* "$r"/sys/* "$r"/run/* "$r"/tmp/*
  rm -f "$r/etc/hostname" "$r/etc/resolv.conf"
  touch "$dir/ok"
  echo "image base: $dir/root ($(du -sm "$r" | cut -f1) MiB)"
}

if [ "${1:-}" = "--base" ]; then
  [ $# -eq 2 ] || fail "usage: $0 --base DIR"
  make_base "$(realpath -m "$2")"
  exit 0
fi
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR | $0 --base DIR" >&2; exit 2; }
OUT="$(realpath -m "$1")"
command -v buildah >/dev/null || fail "buildah is needed (apt-get install buildah)"
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sgl-router-image.XXXXXX")"
B=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
cleanup() {
  "${B[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
licenses=$(sed -n '/^\[workspace.package\]/,/^\[/s/^license = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
revision=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ] || revision="$revision-dirty"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)}"
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || fail "no [workspace.package] version in Cargo.toml"

# 1. The Debian root.
base="${IMAGE_BASE:-$WORK/base}"
if [ -f "$base/ok" ]; then
  echo "== image: the Debian root from $base"
else
  make_base "$base"
fi

# 2. The binaries, built with the image's features (as the Dockerfile does), stripped.
bins="${IMAGE_BIN_DIR:-}"
if [ -z "$bins" ]; then
  # Two builds, as the wheel (pyproject.toml: features = ["embed"]) and `cargo build -p` do: after
  # the wheel's build the first is a no-op, and the second adds only the simulated engine's binary.
  echo "== image: cargo build --release --locked -p sgl-router --features embed; -p mock-engine"
  (cd "$REPO" && cargo build --release --locked -p sgl-router --features embed \
    && cargo build --release --locked -p mock-engine) || fail "cargo build"
  bins="$(cd "$REPO" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release"
fi
app="$WORK/app"
mkdir -p "$app/usr/local/bin" "$app/usr/share/doc/sgl-router"
for b in sgl-router sgl-mock-engine; do
  [ -x "$bins/$b" ] || fail "no $bins/$b"
  strip -o "$app/usr/local/bin/$b" "$bins/$b"
done
# The router must be built with the image's features: candle (feature embed) leaves its
# source paths in the binary's panic locations, stripped or not.
grep -q 'candle-core' "$app/usr/local/bin/sgl-router" \
  || fail "$bins/sgl-router was not built with $FEATURES (no candle in it)"

# 3. The SBOM: the crates linked in and the Debian packages of the root.
sbom="$app/usr/share/doc/sgl-router/sbom.spdx.json"
python3 "$HERE/sbom.py" --repo "$REPO" --root "$base/root" --features "$FEATURES" \
  --packages sgl-router,mock-engine --name sgl-router --version "$version" --revision "$revision" \
  --created "$epoch" --out "$sbom" || fail "sbom"

# 4. The layers and the config, with buildah (vfs storage in $WORK: nothing left on the host).
echo "== image: buildah (layers, config, OCI archive)"
tar -C "$base/root" --numeric-owner --xattrs -cf "$WORK/base.tar" .
tar -C "$app" --numeric-owner --owner=0 --group=0 -cf "$WORK/app.tar" .
ctr=$("${B[@]}" from --quiet scratch)
"${B[@]}" add --quiet "$ctr" "$WORK/base.tar" /
"${B[@]}" commit --quiet --format oci --timestamp "$epoch" --rm "$ctr" localhost/sgl-router-base:build >/dev/null
ctr=$("${B[@]}" from --quiet --pull=never localhost/sgl-router-base:build)
"${B[@]}" add --quiet "$ctr" "$WORK/app.tar" /
meta=(
  "org.opencontainers.image.title=sgl-router"
  "org.opencontainers.image.description=KV-cache-aware router for SGLang and vLLM replicas"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.source=$source_url"
  "org.opencontainers.image.url=$source_url"
  "org.opencontainers.image.documentation=$source_url/blob/main/docs/deploy.md"
  "org.opencontainers.image.licenses=$licenses"
  "org.opencontainers.image.created=$created"
  "org.opencontainers.image.base.name=debian:bookworm (debootstrap minbase)"
)
config=(--os linux --arch "$arch" --user router --workingdir / --port 30000
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --entrypoint '["sgl-router"]' --cmd '["--host", "0.0.0.0", "--help"]'
  --created-by "tools/image/build.sh")
for m in "${meta[@]}"; do config+=(--label "$m" --annotation "$m"); done
"${B[@]}" config "${config[@]}" "$ctr"
archive="$OUT/sgl-router-$version.oci.tar"
rm -f "$archive"
"${B[@]}" commit --quiet --format oci --timestamp "$epoch" --disable-compression=false --rm "$ctr" \
  "oci-archive:$archive:sgl-router:$version" >/dev/null || fail "buildah commit"
cp "$sbom" "$OUT/sgl-router-$version.spdx.json"
bytes=$(wc -c <"$archive")
echo "image: $archive ($bytes bytes, $(( (bytes + 524288) / 1048576 )) MiB), sgl-router $version ($revision), $arch"

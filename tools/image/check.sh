#!/usr/bin/env bash
# Runs the image that tools/image/build.sh wrote as a container runtime would, without one:
# checks the OCI archive (every blob against its digest), prints its layers and size, unpacks
# them into a root, and runs the image's entrypoint there with the image's env, working dir and
# user (a private mount namespace with /dev, /proc, /sys and a /tmp of its own; `unshare
# --root --setuid --setgid`, the image's uid and gid from its own /etc/passwd). Then:
#   - `sgl-router --version` and `sgl-mock-engine --help` answer;
#   - the demo (--mock-workers 2 --policy cache_aware --kv-events) runs as the image's
#     non-root user in the image's root, answers /readiness and a chat completion;
#   - SIGTERM drains it: a chat stream in flight when the signal comes ends with [DONE],
#     then the router exits 0.
#
#   bash tools/image/check.sh ARCHIVE WORK_DIR     # WORK_DIR/root is made afresh
# Needs root (mounts, setuid), util-linux's unshare, python3, curl.
set -euo pipefail

fail() { echo "image check: FAILED: $*" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: $0 ARCHIVE WORK_DIR" >&2; exit 2; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
ARCHIVE="$(realpath "$1")"
WORK="$(realpath -m "$2")"
ROOT="$WORK/root"
[ "$(id -u)" -eq 0 ] || fail "run as root (mounts in a private namespace, and the switch to the image's user)"
command -v curl >/dev/null || fail "curl is needed"
mkdir -p "$WORK"

echo "== image check: unpack $ARCHIVE"
python3 "$HERE/oci.py" "$ARCHIVE" "$ROOT" >"$WORK/image.env" || fail "the archive (above)"
# shellcheck disable=SC1091
source "$WORK/image.env"
[ "$IMAGE_UID" != 0 ] || fail "the image runs as root"
[ "${#IMAGE_ENTRYPOINT[@]}" -gt 0 ] || fail "the image has no entrypoint"
printf '  ports: %s\n' "${IMAGE_PORTS[*]}"
echo "  user: uid $IMAGE_UID, gid $IMAGE_GID; unpacked: $(du -sm "$ROOT" | cut -f1) MiB"

# The SBOM in the image: SPDX, the router's crates and the root's Debian packages.
python3 - "$ROOT/usr/share/doc/sgl-router/sbom.spdx.json" <<'PYEOF' || fail "the image's SBOM"
import json, sys
d = json.load(open(sys.argv[1]))
names = {p["name"] for p in d["packages"]}
missing = {"sgl-router", "gateway", "kv-index", "tokio", "candle-core", "libc6", "ca-certificates"} - names
if d.get("spdxVersion") != "SPDX-2.3" or missing:
    sys.exit(f"SBOM {sys.argv[1]}: {d.get('spdxVersion')}, missing {sorted(missing)}")
crates = sum(1 for p in d["packages"] if p["SPDXID"].startswith("SPDXRef-crate-"))
debs = sum(1 for p in d["packages"] if p["SPDXID"].startswith("SPDXRef-deb-"))
print(f"  SBOM /usr/share/doc/sgl-router/sbom.spdx.json: SPDX-2.3, {crates} crates, {debs} Debian packages")
PYEOF

# A real engine's loader, when there is one (Debian: podman; `podman run` itself cannot run in a
# sandbox that refuses it cgroups and rlimits): it must load the archive with its user, entrypoint
# and layers. Its storage is a directory of WORK_DIR, removed after.
if command -v podman >/dev/null; then
  P=(podman --storage-driver vfs --root "$WORK/podman" --runroot "$WORK/podman-run")
  loaded=$("${P[@]}" load -q -i "$ARCHIVE" 2>&1) || fail "podman load: $loaded"
  ref=${loaded##*: }
  seen=$("${P[@]}" image inspect "$ref" --format '{{.Config.User}} {{join .Config.Entrypoint " "}} {{len .RootFS.Layers}}') \
    || fail "podman image inspect $ref"
  [ "$seen" = "router ${IMAGE_ENTRYPOINT[*]} $IMAGE_LAYERS" ] || fail "podman sees '$seen' in $ref"
  echo "  podman load: $ref (user, entrypoint, layers: $seen)"
  "${P[@]}" rmi -a -f >/dev/null 2>&1 || true
  rm -rf "$WORK/podman" "$WORK/podman-run"
else
  echo "  (no podman here: the archive's loading by an engine not checked)"
fi

# Runs a command in the image: its root, env, working dir and user; mounts private to it. It
# execs (every step execs the next, so a background call's $! is the command's own pid): call
# it in a subshell.
in_image() {
  exec unshare --mount --propagation private -- /bin/bash -c '
    set -e; r="$1"; shift
    mount --rbind /dev "$r/dev"
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
    exec "$@"' _ "$ROOT" \
    env -i "${IMAGE_ENV[@]}" HOME="$IMAGE_HOME" HOSTNAME=sgl-router \
    unshare --root "$ROOT" --wd "$IMAGE_WORKDIR" --setgid "$IMAGE_GID" --setuid "$IMAGE_UID" -- "$@"
}

expected_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
out="$(in_image "${IMAGE_ENTRYPOINT[@]}" --version)" || fail "${IMAGE_ENTRYPOINT[*]} --version"
[ "$out" = "sgl-router $expected_version" ] || fail "--version printed '$out', expected 'sgl-router $expected_version'"
echo "  ${IMAGE_ENTRYPOINT[*]} --version: $out"
(in_image sgl-mock-engine --help >/dev/null) || fail "sgl-mock-engine --help"
echo "  sgl-mock-engine --help: ok"

echo "== image check: the demo (--mock-workers 2 --policy cache_aware --kv-events)"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
log="$WORK/demo.log"
router_pid=""
stream_pid=""
cleanup() {
  for p in $stream_pid $router_pid; do
    if kill -0 "$p" 2>/dev/null; then kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; fi
  done
}
trap cleanup EXIT
(in_image "${IMAGE_ENTRYPOINT[@]}" --host 127.0.0.1 --port "$port" \
  --mock-workers 2 --policy cache_aware --kv-events >"$log" 2>&1) &
router_pid=$!
ready=""
for _ in $(seq 1 120); do
  kill -0 "$router_pid" 2>/dev/null || { cat "$log" >&2; fail "the router exited before it was ready (log above)"; }
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readiness" || true)" = 200 ]; then ready=1; break; fi
  sleep 0.25
done
[ -n "$ready" ] || { cat "$log" >&2; fail "GET /readiness did not answer 200 within 30 s (log above)"; }
echo "  GET /readiness: 200 $(curl -s "$url/readiness")"

# It is the image's binary, in the image's root, as the image's user.
[ "$(readlink "/proc/$router_pid/root")" = "$ROOT" ] || fail "the router's root is $(readlink "/proc/$router_pid/root"), not $ROOT"
[ "$(readlink "/proc/$router_pid/exe")" = "$ROOT/usr/local/bin/sgl-router" ] \
  || fail "the router runs $(readlink "/proc/$router_pid/exe"), not the image's /usr/local/bin/sgl-router"
ids=$(awk '/^Uid:/ {print $2, $3} /^Gid:/ {print $2, $3} /^Groups:/ {print "groups:" $2}' "/proc/$router_pid/status" | tr '\n' ' ')
[ "$ids" = "$IMAGE_UID $IMAGE_UID $IMAGE_GID $IMAGE_GID groups: " ] || fail "the router runs as '$ids', not uid/gid $IMAGE_UID/$IMAGE_GID without groups"
echo "  running as uid $IMAGE_UID gid $IMAGE_GID (no supplementary groups), root $ROOT"

code=$(curl -s -o "$WORK/chat.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "default", "messages": [{"role": "user", "content": "Hello from the image!"}]}') || code="curl failed"
[ "$code" = 200 ] || { cat "$WORK/chat.json" >&2 2>/dev/null; cat "$log" >&2; fail "POST /v1/chat/completions answered $code"; }
python3 - "$WORK/chat.json" <<'PYEOF' || fail "the chat completion"
import json, sys
r = json.load(open(sys.argv[1]))
if not r.get("choices"):
    sys.exit(f"no choices in {r}")
print("  POST /v1/chat/completions: 200,", json.dumps(r["choices"][0].get("message"))[:120])
PYEOF

echo "== image check: SIGTERM drains a stream in flight, then the router exits 0"
stream="$WORK/stream.txt"
: >"$stream"
# 200 tokens at the simulated engine's 10 ms per token: about 2 s, in flight when the signal comes.
curl -sN -o "$stream" "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "default", "stream": true, "max_tokens": 200, "ignore_eos": true, "messages": [{"role": "user", "content": "Count slowly."}]}' &
stream_pid=$!
started=""
for _ in $(seq 1 200); do
  if grep -q '^data: {' "$stream"; then started=1; break; fi
  kill -0 "$stream_pid" 2>/dev/null || break
  sleep 0.05
done
[ -n "$started" ] || { cat "$stream" >&2; fail "the stream sent no chunk within 10 s"; }
grep -q '^data: \[DONE\]' "$stream" && fail "the stream ended before SIGTERM: make it longer"
kill -TERM "$router_pid"
status=0
wait "$stream_pid" || status=$?
stream_pid=""
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "the stream's curl exited $status after SIGTERM"; }
# Whole: 200 tokens, a finish reason, [DONE] last, no error event (a stream cut short by the
# shutdown ends with an error event and [DONE], which is not a drain).
chunks=$(python3 - "$stream" <<'PYEOF'
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
if not events or events[-1] != "[DONE]":
    sys.exit(f"the stream does not end with [DONE]: {events[-2:]}")
chunks = [json.loads(e) for e in events[:-1]]
errors = [c for c in chunks if "error" in c]
if errors:
    sys.exit(f"the stream in flight was cut: {errors[0]}")
tokens = sum(1 for c in chunks for ch in c["choices"] if ch.get("delta", {}).get("content"))
finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
if tokens != 200 or finish != ["length"]:
    sys.exit(f"the stream in flight has {tokens} tokens and finish reasons {finish}: expected 200 and ['length']")
print(len(chunks))
PYEOF
) || { tail -n 5 "$stream" >&2; fail "the stream in flight (above)"; }
status=0
wait "$router_pid" || status=$?
router_pid=""
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "the router exited $status after SIGTERM (log above)"; }
echo "  the stream in flight finished whole ($chunks chunks, 200 tokens, finish_reason length, [DONE]); the router exited 0"
echo
echo "image OK: $(basename "$ARCHIVE"), $IMAGE_BYTES bytes ($(( (IMAGE_BYTES + 524288) / 1048576 )) MiB), $IMAGE_LAYERS layers; the demo answered as uid $IMAGE_UID and drained on SIGTERM"

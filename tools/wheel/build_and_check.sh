#!/usr/bin/env bash
# Builds the sgl-router wheel (pyproject.toml: maturin, `bindings = "bin"`), installs
# it in a fresh venv and runs it: `sgl-router --version`, then the embedded demo
# (two simulated engines, cache_aware, KV events) until /readiness answers 200,
# and one chat completion through it.
#
#   bash tools/wheel/build_and_check.sh VENV_DIR_BASE      # e.g. /tmp/sgl-router-wheel
#
# Under VENV_DIR_BASE (outside the repo): build-venv/ (maturin), dist/ (the wheel),
# install-venv/ (made afresh on every run: only the wheel is installed in it).
# Needs python3 with venv (override with PYTHON=...), curl, cargo, and PyPI for maturin.
# The cargo build goes to the workspace's target/ (release profile, --locked).
set -euo pipefail

fail() { echo "build_and_check: FAILED: $*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 VENV_DIR_BASE" >&2; exit 2; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
BASE="$(realpath -m "$1")"
case "$BASE/" in
  "$REPO"/*) fail "VENV_DIR_BASE must live outside the repo (maturin and cargo see the repo): $BASE";;
esac
mkdir -p "$BASE"
command -v curl >/dev/null || fail "curl is needed for the demo check"
command -v cargo >/dev/null || fail "cargo is needed to build the wheel"

# pip's environment must not redirect these venvs: a PIP_REQUIRE_VIRTUALENV, PIP_USER
# or PIP_TARGET/PIP_PREFIX from the caller would install outside the venv (or refuse),
# and PYTHONPATH/PYTHONHOME would mix another interpreter's packages in.
unset PIP_USER PIP_TARGET PIP_PREFIX PIP_REQUIRE_VIRTUALENV PYTHONPATH PYTHONHOME VIRTUAL_ENV
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

expected_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
[ -n "$expected_version" ] || fail "no [workspace.package] version in Cargo.toml"

echo "== wheel: build venv with maturin ($BASE/build-venv)"
if [ ! -x "$BASE/build-venv/bin/python" ]; then
  "$PY" -m venv "$BASE/build-venv" || fail "$PY -m venv (on Debian/Ubuntu: apt-get install python3-venv)"
fi
"$BASE/build-venv/bin/python" -m pip install -q 'maturin>=1.5,<2' || fail "pip install maturin"
"$BASE/build-venv/bin/maturin" --version

echo "== wheel: maturin build --release --locked (crates/router, bindings = bin)"
# No --compatibility / --skip-auditwheel: maturin audits the binary itself and tags the
# wheel with the oldest manylinux policy its glibc symbols allow. The binary links only
# libc, libm, libgcc_s (allowed by every manylinux policy; rustls and aws-lc are built
# in), so nothing is grafted into the wheel and patchelf is not needed.
rm -rf "$BASE/dist"
start=$(date +%s)
(cd "$REPO" && "$BASE/build-venv/bin/maturin" build --release --locked --out "$BASE/dist") \
  || fail "maturin build"
build_secs=$(( $(date +%s) - start ))
shopt -s nullglob
wheels=("$BASE/dist"/sgl_router-*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || fail "expected one sgl_router-*.whl in $BASE/dist, found: ${wheels[*]:-none}"
wheel="${wheels[0]}"
wheel_name="$(basename "$wheel")"
wheel_bytes=$(wc -c < "$wheel")
echo "wheel: $wheel_name"
echo "wheel size: $wheel_bytes bytes ($(( (wheel_bytes + 524288) / 1048576 )) MiB); built in ${build_secs}s"
# (The wheel's version is Cargo's in PEP 440 spelling: 0.2.0-alpha.1 becomes 0.2.0a1.)
case "$wheel_name" in
  sgl_router-*-py3-none-*) ;;
  *) fail "wheel $wheel_name is not sgl_router-<version>-py3-none-<platform> (a bin wheel is Python-independent)";;
esac
"$BASE/build-venv/bin/python" - "$wheel" <<'PYEOF' || fail "the wheel's contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
scripts = [n for n in names if ".data/scripts/" in n]
print("wheel contents:", ", ".join(names))
if [s.rsplit("/", 1)[1] for s in scripts] != ["sgl-router"]:
    sys.exit(f"expected exactly the script sgl-router in the wheel, got {scripts}")
PYEOF

echo "== wheel: pip install in a fresh venv ($BASE/install-venv)"
rm -rf "$BASE/install-venv"
"$PY" -m venv "$BASE/install-venv" || fail "$PY -m venv"
# --no-index: the wheel has no dependencies, nothing may come from an index.
"$BASE/install-venv/bin/python" -m pip install -q --no-index "$wheel" || fail "pip install $wheel_name"
export PATH="$BASE/install-venv/bin:$PATH"
[ "$(command -v sgl-router)" = "$BASE/install-venv/bin/sgl-router" ] \
  || fail "sgl-router on PATH is $(command -v sgl-router || echo nothing), not the venv's"

echo "== wheel: sgl-router --version"
version_out="$(sgl-router --version)" || fail "sgl-router --version exited non-zero"
echo "$version_out"
[ "$version_out" = "sgl-router $expected_version" ] \
  || fail "sgl-router --version printed '$version_out', expected 'sgl-router $expected_version'"

echo "== wheel: the demo (--mock-workers 2 --policy cache_aware --kv-events)"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log="$BASE/demo.log"
router_pid=""
cleanup() {
  if [ -n "$router_pid" ] && kill -0 "$router_pid" 2>/dev/null; then
    kill "$router_pid" 2>/dev/null || true
    wait "$router_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT
# The caller's SGL_ROUTER_* variables are the router's flags (keys, workers, ...): not here.
for v in $(compgen -e | grep '^SGL_ROUTER_' || true); do unset "$v"; done
sgl-router --host 127.0.0.1 --port "$port" --mock-workers 2 --policy cache_aware --kv-events >"$log" 2>&1 &
router_pid=$!
url="http://127.0.0.1:$port"
ready=""
for _ in $(seq 1 120); do
  if ! kill -0 "$router_pid" 2>/dev/null; then
    cat "$log" >&2
    fail "sgl-router exited before it was ready (log above)"
  fi
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readiness" || true)" = 200 ]; then
    ready=1
    break
  fi
  sleep 0.25
done
[ -n "$ready" ] || { cat "$log" >&2; fail "GET $url/readiness did not answer 200 within 30 s (log above)"; }
echo "GET /readiness: 200 $(curl -s "$url/readiness")"

body="$BASE/chat.json"
code=$(curl -s -o "$body" -w '%{http_code}' "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "default", "messages": [{"role": "user", "content": "Hello!"}]}') || code="curl failed"
[ "$code" = 200 ] || { cat "$body" >&2 2>/dev/null; cat "$log" >&2; fail "POST /v1/chat/completions answered $code"; }
"$PY" - "$body" <<'PYEOF' || { cat "$log" >&2; fail "the chat completion has no choices"; }
import json, sys
r = json.load(open(sys.argv[1]))
choices = r.get("choices")
if not choices:
    sys.exit(f"no choices in {r}")
print("POST /v1/chat/completions: 200, choices[0].message:", json.dumps(choices[0].get("message"))[:200])
PYEOF

# SIGTERM: the router drains (nothing in flight) and exits 0.
kill -TERM "$router_pid"
status=0
wait "$router_pid" || status=$?
router_pid=""
[ "$status" -eq 0 ] || { cat "$log" >&2; fail "sgl-router exited $status after SIGTERM (log above)"; }
echo "sgl-router stopped (SIGTERM, exit 0)"
echo
echo "wheel OK: $wheel_name, $wheel_bytes bytes, built in ${build_secs}s; $version_out; demo answered /readiness and a chat completion"

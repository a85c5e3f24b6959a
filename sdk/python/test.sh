#!/usr/bin/env bash
# Tests of the Python SDK against a real daemon: makes (or reuses) a virtualenv under
# target/tools, installs the SDK from sdk/python afresh (not editable: the install itself is
# under test) with pinned test tools, type-checks it with mypy --strict, then runs pytest,
# whose session fixture starts `sandcell serve` ($SANDCELL_BIN, default the release build); the
# agent-run tests start daemons of their own, each pointed at the test kit's scripted model, and
# the packages test one pointed at the test kit's fake package registries (both built here).
# Idempotent; on a fresh Debian 12 it installs python3-venv first.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTEST=9.0.3
PYTEST_ASYNCIO=1.3.0
MYPY=1.19.1
FLIT_CORE=3.12.0
venv="$repo/target/tools/sdk-python-venv"
export SANDCELL_BIN="${SANDCELL_BIN:-$repo/target/release/sandcell}"
if [ ! -x "$SANDCELL_BIN" ]; then
  echo "sdk/python: no sandcell binary at $SANDCELL_BIN (build it with 'cargo build --release', or set SANDCELL_BIN)" >&2
  exit 1
fi
if ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "sdk/python: installing python3-venv" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" "pytest==$PYTEST" "pytest-asyncio==$PYTEST_ASYNCIO" "mypy==$MYPY" "flit_core==$FLIT_CORE"
# Uninstalled first so that the current sources are what gets tested, whatever the version.
"$venv/bin/pip" uninstall -q -y sandcell >/dev/null 2>&1 || true
"${pip[@]}" --no-build-isolation "$here"
# The test kit's scripted model, which the agent-run tests point their daemons at (cheap after
# `cargo test`, which has built the test kit); SANDCELL_SCRIPTED_LLM names another build.
if [ -z "${SANDCELL_SCRIPTED_LLM:-}" ]; then
  echo "sdk/python: building scripted-llm" >&2
  (cd "$repo" && cargo build -q -p sandcell-testkit --features llm --bin scripted-llm)
  export SANDCELL_SCRIPTED_LLM="$repo/target/debug/scripted-llm"
fi
# The test kit's fake package registries, which the packages test installs from (through a
# daemon of its own); SANDCELL_FAKE_REGISTRIES names another build.
if [ -z "${SANDCELL_FAKE_REGISTRIES:-}" ]; then
  echo "sdk/python: building fake-registries" >&2
  (cd "$repo" && cargo build -q -p sandcell-testkit --features registries --bin fake-registries)
  export SANDCELL_FAKE_REGISTRIES="$repo/target/debug/fake-registries"
fi
# Caches go under target/, not into the source tree.
export PYTHONDONTWRITEBYTECODE=1
cache="$repo/target/tools/sdk-python-cache"
echo "sdk/python: mypy --strict" >&2
(cd "$here" && "$venv/bin/mypy" --strict --cache-dir "$cache/mypy" src/sandcell examples)
echo "sdk/python: pytest" >&2
cd "$here"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Python tools the test suite drives (schemathesis; the official MCP client, package `mcp`;
# from PyPI) in a virtualenv under target/tools. Idempotent: installs only what is missing or
# at another version.
set -euo pipefail
cd "$(dirname "$0")/.."
SCHEMATHESIS=4.32.5
MCP=2.3.0
venv=target/tools/venv
if ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "tools: installing python3-venv" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
if [ "$("$venv/bin/schemathesis" --version 2>/dev/null | awk '{print $NF}')" != "$SCHEMATHESIS" ]; then
  echo "tools: installing schemathesis $SCHEMATHESIS" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$SCHEMATHESIS"
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" != "$MCP" ]; then
  echo "tools: installing mcp $MCP" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "mcp==$MCP"
fi
# CRIU 4 for process-fidelity snapshots on the process backend (optional: its tests skip with
# the reason when it could not be built).
scripts/criu.sh || echo "tools: CRIU was not built; the tests that need it will skip" >&2

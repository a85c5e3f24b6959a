#!/usr/bin/env bash
# Builds the TypeScript SDK and runs its tests against a real daemon.
#
#   bash sdk/typescript/test.sh [build/some.test.js ...]
#
# Idempotent, and fine on a fresh Debian 12: installs npm when it is missing (Debian's nodejs
# package has none), installs the pinned devDependencies only when they are missing or
# package.json changed, compiles with `strict` (a type error fails the run), then runs the
# tests with Node's own runner. The daemon binary is $SANDCELL_BIN, else
# <repo>/target/release/sandcell; the agent-run tests also need the test kit's scripted-llm,
# and the packages test its fake-registries, both built here.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

export SANDCELL_BIN="${SANDCELL_BIN:-$repo/target/release/sandcell}"
if [[ ! -x "$SANDCELL_BIN" ]]; then
  echo "test.sh: no sandcell binary at $SANDCELL_BIN (build it with cargo build --release, or set SANDCELL_BIN)" >&2
  exit 1
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "test.sh: installing npm (and Node.js) from Debian's packages" >&2
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
fi

# The devDependencies, installed again only when package.json's list of them changes.
stamp="node_modules/.sandcell-devdeps"
wanted="$(node -e 'console.log(JSON.stringify(require("./package.json").devDependencies))')"
if [[ ! -x node_modules/.bin/tsc || "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
  # No lockfile: the exact versions are pinned in package.json.
  npm install --no-package-lock --no-audit --no-fund --loglevel=error
  printf '%s' "$wanted" >"$stamp"
fi

# The test kit's scripted model, which the agent-run tests point their daemons at (cheap after
# `cargo test`, which has built the test kit); SANDCELL_SCRIPTED_LLM names another build.
if [[ -z "${SANDCELL_SCRIPTED_LLM:-}" ]]; then
  echo "test.sh: building scripted-llm" >&2
  (cd "$repo" && cargo build -q -p sandcell-testkit --features llm --bin scripted-llm)
  export SANDCELL_SCRIPTED_LLM="$repo/target/debug/scripted-llm"
fi
# The test kit's fake package registries, which the packages test installs from (through a
# daemon of its own); SANDCELL_FAKE_REGISTRIES names another build.
if [[ -z "${SANDCELL_FAKE_REGISTRIES:-}" ]]; then
  echo "test.sh: building fake-registries" >&2
  (cd "$repo" && cargo build -q -p sandcell-testkit --features registries --bin fake-registries)
  export SANDCELL_FAKE_REGISTRIES="$repo/target/debug/fake-registries"
fi

# A fresh build each time, so no file of a removed source lingers.
rm -rf dist build
node_modules/.bin/tsc -p tsconfig.json
node_modules/.bin/tsc -p test/tsconfig.json

exec node build/run.js "$@"

#!/usr/bin/env bash
# Fuzzes the daemon's REST API from its own OpenAPI document with schemathesis: a bounded
# number of generated requests per operation (SCHEMATHESIS_EXAMPLES, default 25); any 5xx,
# undocumented status, wrong content type or answer that breaks its schema fails the run.
# Runs against the release binary on a free loopback port with a scratch home.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/tools.sh
BIN=${SANDCELL_BIN:-$PWD/target/release/sandcell}
[ -x "$BIN" ] || { echo "schemathesis: no binary at $BIN (cargo build --release)" >&2; exit 1; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/sandcell-schemathesis.XXXXXX")
port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
# Few sandboxes at a time (generated creates hit the cap and get 429, which is documented),
# stopped with the daemon.
"$BIN" serve --home "$scratch/home" --listen "127.0.0.1:$port" \
  --set limits.max_per_owner=4 --set shutdown.sandboxes=stop >"$scratch/serve.log" 2>&1 &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
key=$(cat "$scratch/home/admin.key")
cd "$scratch"
"$OLDPWD/target/tools/venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  -H "X-API-Key: $key" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --phases examples,coverage,fuzzing --max-examples "${SCHEMATHESIS_EXAMPLES:-25}" \
  --workers 2 --request-timeout 60 --no-color \
  || { echo "schemathesis: failures above; the daemon's log:"; tail -20 "$scratch/serve.log"; exit 1; }

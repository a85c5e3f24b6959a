#!/usr/bin/env bash
# Fuzzes the daemon's REST API from its own OpenAPI document with schemathesis: a bounded
# number of generated requests per operation (SCHEMATHESIS_EXAMPLES, default 25) in the
# examples, coverage and fuzzing phases, then the stateful phase (sequences chained by the
# document's links); any 5xx, undocumented status, wrong content type or answer that breaks its
# schema fails the run. Runs against the release binary on a free loopback port with a scratch
# home. Arguments go to `schemathesis run` (e.g. `--seed N` to repeat a run).
#
# Every generated request reaches its handler: the run authenticates with the admin key, and
# every `{id}`-like path parameter is a real resource made here first (a sandbox with a Python
# context, a process, an export, a snapshot, a run, a memory, an infer job, a template and a
# build), so requests
# get past the 404 of unknown ids.
# Operations that end a resource get a live one of their own before each call
# (scripts/schemathesis_hooks.py), `DELETE /v1/keys/{key_id}` included: schemathesis reuses ids
# it reads in answers, and once revoked the very key it authenticates with (listed by
# `GET /v1/keys`), after which every request was a 401.
# The run fails when schemathesis warns that operations answered only 401/403 or only 404.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/tools.sh
BIN=${SANDCELL_BIN:-$PWD/target/release/sandcell}
[ -x "$BIN" ] || { echo "schemathesis: no binary at $BIN (cargo build --release)" >&2; exit 1; }
venv=$PWD/target/tools/venv
scratch=$(mktemp -d "${TMPDIR:-/tmp}/sandcell-schemathesis.XXXXXX")
port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
# Few sandboxes at a time (generated creates and forks hit the cap and get 429, which is
# documented), stopped with the daemon.
# Agent runs and memory infer jobs ask the daemon itself for a model: it answers 404 at once,
# so a generated run ends quickly (provider_error), a job fails, and nothing outside loopback
# is reached.
# Generated builds whose base is `debian:<suite>` (the built-ins' too) would make one with
# mmdebstrap (seconds each, one build at a time: the run crawled): a stand-in that fails at
# once comes first on the daemon's PATH.
# Generated git URLs name made-up hosts: only a name of the tests' own resolves (to
# loopback), so nothing asks the machine's resolver.
mkdir -p "$scratch/bin"
printf '#!/bin/sh\necho "no Debian mirror in the fuzzing run" >&2\nexit 1\n' >"$scratch/bin/mmdebstrap"
chmod 755 "$scratch/bin/mmdebstrap"
PATH="$scratch/bin:$PATH" \
SANDCELL_TEST=1 SANDCELL_TEST_RESOLVE="git.test=127.0.0.1" SANDCELL_TEST_RESOLVE_ONLY=1 \
"$BIN" serve --home "$scratch/home" --listen "127.0.0.1:$port" \
  --set limits.max_per_owner=5 --set shutdown.sandboxes=stop \
  --set "agent.openai.base_url=http://127.0.0.1:$port/v1" \
  --set "agent.anthropic.base_url=http://127.0.0.1:$port" \
  --set memory.infer_model=openai/seed-model >"$scratch/serve.log" 2>&1 &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
for _ in $(seq 100); do
  curl -fs "$base/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
key=$(cat "$scratch/home/admin.key")

# api METHOD PATH [JSON BODY] [FIELD]: the answer's FIELD (the whole answer without one).
api() {
  local out
  out=$(curl -fsS -X "$1" "$base$2" -H "X-API-Key: $key" -H 'content-type: application/json' \
    ${3:+--data-binary "$3"}) || { echo "schemathesis: seeding $1 $2 failed" >&2; exit 1; }
  if [ -n "${4:-}" ]; then
    printf '%s' "$out" | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$4"
  else
    printf '%s\n' "$out"
  fi
}

# The resources the run works on: a sandbox with a Python context, a process that has ended
# (its output and stream answer at once), a file, an export, a snapshot. Operations that end
# resources get theirs from the hooks.
sb=$(api POST /v1/sandboxes '{"template": "python"}' id)
ctx=$(api POST "/v1/sandboxes/$sb/contexts" '{"language": "python"}' id)
done_pid=$(api POST "/v1/sandboxes/$sb/processes" '{"cmd": "echo seeded"}' pid)
api GET "/v1/sandboxes/$sb/processes/$done_pid/output" >/dev/null
api POST "/v1/sandboxes/$sb/import" '{"path": "/workspace/seed.txt", "text": "seed\n"}' >/dev/null
export_id=$(api POST "/v1/sandboxes/$sb/exports" '{"path": "/workspace/seed.txt"}' id)
snapshot=$(api POST "/v1/sandboxes/$sb/snapshots" '{"name": "seed"}' id)
# A volume for the routes of one (`DELETE /v1/volumes/{volume}` gets its own from the hooks).
volume=$(api POST /v1/volumes '{"name": "seed-volume"}' name)
# Only so that every path parameter has a value here: the hooks give
# `DELETE /v1/keys/{key_id}` keys of its own.
victim_key=$(api POST /v1/keys '{"name": "victim"}' id)
# A run that has ended (its budget cannot fit one call), for the routes of one run.
run=$(api POST /v1/runs '{"task": "seed", "model": "openai/seed-model", "budgets": {"token_budget": 1}, "wait": true}' id)

# An infer job of the sandbox's (it fails: see the model above), which the owner's route
# finds too.
job=$(api POST "/v1/sandboxes/$sb/memories/infer" '{"text": "seed"}' id)
# A memory of the sandbox's (the owner's routes find it too; deletes get their own from the
# hooks).
memory=$(api POST "/v1/sandboxes/$sb/memories" '{"text": "seed"}' id)

# A template (an image imported into the daemon's store: a root filesystem of one folder)
# and a build (it fails at once: its base is not in the store), for the routes of one of
# each; `DELETE /v1/templates/{name}` gets templates of its own from the hooks.
mkdir -p "$scratch/rootfs/usr/bin" "$scratch/rootfs/etc"
echo "ID=seed" >"$scratch/rootfs/etc/os-release"
tar -C "$scratch/rootfs" -cf "$scratch/rootfs.tar" .
"$BIN" image import "$scratch/rootfs.tar" --as seed-template:v1 --home "$scratch/home" >/dev/null
build=$(api POST /v1/templates '{"name": "seed-build", "dockerfile": "FROM not-in-the-store\nRUN true\n", "wait": true}' id)

cat >"$scratch/schemathesis.toml" <<EOF
hooks = "$PWD/scripts/schemathesis_hooks.py"

[parameters]
"path.id" = "$sb"
"path.context" = "$ctx"
"path.pid" = $done_pid
"path.export_id" = "$export_id"
"path.snapshot_id" = "$snapshot"
"path.key_id" = "$victim_key"
"path.run_id" = "$run"
"path.job_id" = "$job"
"path.memory_id" = "$memory"
"path.name" = "seed-template:v1"
"path.build_id" = "$build"
"path.volume" = "$volume"
EOF
export SANDCELL_FUZZ_BASE=$base SANDCELL_FUZZ_KEY=$key SANDCELL_FUZZ_SANDBOX=$sb
export SANDCELL_FUZZ_BIN=$BIN SANDCELL_FUZZ_HOME=$scratch/home SANDCELL_FUZZ_ROOTFS=$scratch/rootfs.tar

cd "$scratch"
start=$(date +%s)
status=0
"$venv/bin/schemathesis" --config-file "$scratch/schemathesis.toml" run "$base/openapi.json" \
  -H "X-API-Key: $key" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --phases examples,coverage,fuzzing,stateful --max-examples "${SCHEMATHESIS_EXAMPLES:-25}" \
  --workers 2 --request-timeout 60 --no-color "$@" 2>&1 | tee "$scratch/run.log" || status=$?
echo "schemathesis: $(($(date +%s) - start)) s"
if [ "$status" != 0 ]; then
  cp "$scratch/serve.log" "$OLDPWD/target/schemathesis-serve.log"
  echo "schemathesis: failures above; the daemon's log (all of it in target/schemathesis-serve.log):"
  tail -20 "$scratch/serve.log"
  exit 1
fi
# Requests that never got past authentication or never found their resource test nothing.
if grep -E 'returned only 401/403|returned only 404|repeatedly returned 404' "$scratch/run.log"; then
  echo "schemathesis: operations above never reached their handlers (see the warnings)" >&2
  exit 1
fi

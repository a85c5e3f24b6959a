#!/usr/bin/env bash
# The whole test suite: formatting, lints, the release build, unit + integration +
# end-to-end tests (real sandboxes, real binary). The acceptance floors run separately
# (scripts/acceptance.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/tools.sh

echo "== fmt"; cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== release build"; cargo build --release --quiet
echo "== tests"; cargo test --workspace --quiet
echo "== schemathesis"; scripts/schemathesis.sh

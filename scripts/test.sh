#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration + end-to-end tests (real
# sandboxes), then the foundation acceptance floor against the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== fmt"; cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== release build"; cargo build --release --quiet
echo "== tests"; cargo test --workspace --quiet 2>&1 | tee /tmp/sandcell-test.log
if [ -f ../shared/acceptance/foundation.sh ]; then
  echo "== acceptance: foundation"
  bash ../shared/acceptance/foundation.sh
fi

#!/usr/bin/env bash
# Runs the shared acceptance floors (../shared/acceptance/*.sh) against a release build.
# Usage: scripts/acceptance.sh [NAME…]   (default: foundation)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
for name in "${@:-foundation}"; do
  echo "== acceptance: $name"
  bash "../shared/acceptance/$name.sh"
done

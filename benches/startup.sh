#!/usr/bin/env bash
# Sandbox start-up against plain exec and bubblewrap, measured in one run.
# Usage: benches/startup.sh [RUNS]   (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
exec target/release/sandcell bench startup --runs "${1:-50}"

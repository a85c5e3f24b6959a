#!/usr/bin/env bash
# Installs what building, running and testing Sandcell needs on Debian/Ubuntu. Idempotent:
# installs only what is missing, so it is cheap to run before every build or test.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/bin/node ] || need+=(nodejs)
have bwrap || need+=(bubblewrap)      # benchmarks and acceptance compare against it
[ -x /usr/bin/tinyproxy ] || need+=(tinyproxy)  # `bench egress` compares the proxy against it
have gcc || need+=(gcc)               # linker for cargo
have ps || need+=(procps)
# Kernels and their tests: plots, data frames, R with ggplot2.
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
/usr/bin/python3 -c 'import pandas' >/dev/null 2>&1 || need+=(python3-pandas)
# Kernel state capture (snapshots): session functions and classes pickled by value.
/usr/bin/python3 -c 'import cloudpickle' >/dev/null 2>&1 || need+=(python3-cloudpickle)
# Validation-aware agent runs check answers with pytest inside sandboxes.
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || need+=(python3-pytest)
# The gvisor backend (and the suites that run on it).
have runsc || need+=(runsc)
[ -x /usr/bin/Rscript ] || need+=(r-base-core)
[ -d /usr/lib/R/site-library/ggplot2 ] || need+=(r-cran-ggplot2)
# Templates: the image store is an OCI layout, which the tests read back with a standard tool.
have umoci || need+=(umoci)
# Templates `FROM debian:<suite>`: the base is made from the configured Debian mirror.
have mmdebstrap || need+=(mmdebstrap)
# Sandboxes from image templates are tested on a tiny root filesystem made of busybox.
[ -x /bin/busybox ] || need+=(busybox-static)

if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "setup: installing ${need[*]}" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! have cargo; then
  echo "setup: cargo not found; install a Rust toolchain (1.95 or newer) first" >&2
  exit 1
fi

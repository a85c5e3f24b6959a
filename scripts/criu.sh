#!/usr/bin/env bash
# Builds CRIU 4 from Debian's own source package into target/tools/criu (Debian 12's CRIU
# 3.17 fails `criu check` on newer kernels; 4.x works). Optional: process-fidelity snapshots
# on the process backend need it, and their tests skip with the reason when it is missing.
# Idempotent: does nothing when target/tools/criu/criu passes `criu check` and carries the
# patches below (their list is stamped next to it).
#
# Two patches. First, `criu dump` skips check_user_ns, a sanity check that re-enters the sandbox's
# namespaces as their root. A sandbox restored by CRIU has an agent that was never executed
# inside it; non-dumpable (so its own sandbox cannot read its memory), its /proc/<pid>/ns stays
# closed to that root, and the check would refuse to checkpoint it again. Sandcell's jail makes
# every namespace of a checkpointable sandbox from its user namespace, which is what the check
# verifies. Second, a TCP socket's SO_PASSCRED and SO_PASSSEC that the kernel will not read
# (Linux 6.16 and later answer EOPNOTSUPP for them on anything but Unix and netlink sockets)
# are dumped as off instead of failing the dump: without it no established TCP connection (a preview being
# served, a program's own client and server) could be checkpointed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/tools/criu
patches="skip-check-user-ns passcred-passsec-unsupported"
if [ -x "$out/criu" ] && "$out/criu" check >/dev/null 2>&1 \
   && [ "$(cat "$out/patches" 2>/dev/null)" = "$patches" ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
deps=(gcc make pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
      libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler
      uuid-dev iptables xz-utils)
missing=()
for d in "${deps[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "criu: installing build dependencies ${missing[*]}" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
work=target/tools/criu-src
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
# The newer Debian release's source package, from the mirror this host already uses.
uri=$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
      | awk '$1 == "URIs:" {print $2; exit} $1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}')
cat > "$work/sources" <<SRC
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri trixie main
SRC
apt_opts=(-o "Dir::Etc::sourcelist=$PWD/$work/sources" -o Dir::Etc::sourceparts=/dev/null
          -o "Dir::State::Lists=$PWD/$work/lists" -o "Dir::Cache=$PWD/$work/cache")
apt-get "${apt_opts[@]}" update -qq >/dev/null
version=$(apt-cache "${apt_opts[@]}" showsrc criu | awk '/^Version:/ {print $2; exit}')
upstream=${version%-*}
( cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq criu >/dev/null 2>&1 || true )
tarball="$work/criu_${upstream}.orig.tar.xz"
[ -f "$tarball" ] || { echo "criu: could not download the source of criu $version" >&2; exit 1; }
rm -rf "$work/criu-$upstream"
tar -C "$work" -xf "$tarball"
sed -i 's/^\tif (check_user_ns(pid))$/\tif (0 \&\& check_user_ns(pid))/' "$work/criu-$upstream/criu/namespaces.c"
grep -q 'if (0 && check_user_ns(pid))' "$work/criu-$upstream/criu/namespaces.c" \
  || { echo "criu: the check_user_ns patch no longer applies to criu $upstream" >&2; exit 1; }
sed -i 's/^\tif (getsockopt(sk, level, name, val, &aux) < 0) {$/&\n\t\tif (errno == EOPNOTSUPP \&\& level == SOL_SOCKET \&\& (name == SO_PASSCRED || name == SO_PASSSEC)) {\n\t\t\tmemset(val, 0, len);\n\t\t\treturn 0;\n\t\t}/' "$work/criu-$upstream/criu/sockets.c"
grep -q 'errno == EOPNOTSUPP && level == SOL_SOCKET' "$work/criu-$upstream/criu/sockets.c" \
  || { echo "criu: the SO_PASSCRED/SO_PASSSEC patch no longer applies to criu $upstream" >&2; exit 1; }
echo "criu: building criu $upstream" >&2
make -C "$work/criu-$upstream" -j"$(nproc)" criu >"$work/build.log" 2>&1 \
  || { echo "criu: build failed, see $work/build.log" >&2; exit 1; }
mkdir -p "$out"
cp "$work/criu-$upstream/criu/criu" "$out/criu"
"$out/criu" check >/dev/null 2>&1 || { echo "criu: the built criu fails criu check here" >&2; exit 1; }
echo "$patches" > "$out/patches"
echo "criu: $out/criu ready" >&2

#!/usr/bin/env bash
# What the build and the tests need on a fresh machine, installed where
# missing (scripts/test.sh runs it first; .ci/run before its lints, since
# building needs protoc):
#
# - protoc (protobuf-compiler): etcd-client builds etcd's gRPC API from
#   its .proto files;
# - pyarrow: tests/pushlog.rs reads a sealed push log with it, as an
#   outside Arrow reader;
# - git: the import tests build real repositories;
# - systemd-analyze: primary/tests/systemd.rs verifies the shipped units;
# - mkfs.ext4: tests/full_disk.rs fills a small loop-mounted file system;
# - etcd (Debian's etcd-server): the failover arbiter the tests start on
#   loopback (testkit::etcd);
# - Garage: the S3-compatible server the archive's tests start on
#   loopback (testkit::garage). It is not packaged: it is built from
#   crates.io (AGPL, run as its own process, never linked) into
#   ~/.cache/twinlog/garage-<version>, once per machine. Unoptimized: on
#   2 cores that build takes about 4.5 minutes, an optimized one 8, and
#   the tests move megabytes.
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v git >/dev/null || missing+=(git)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
[ -x "${ETCD_BIN:-/usr/bin/etcd}" ] || missing+=(etcd-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import pyarrow' 2>/dev/null; then
  echo "installing pyarrow" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore pyarrow
fi


GARAGE_VERSION=2.5.0
garage_root="${GARAGE_ROOT:-$HOME/.cache/twinlog/garage-$GARAGE_VERSION}"
if [ -z "${GARAGE_BIN:-}" ] && [ ! -x "$garage_root/bin/garage" ]; then
  echo "building garage $GARAGE_VERSION into $garage_root (about 5 minutes on 2 cores)" >&2
  cargo install garage --version "$GARAGE_VERSION" --locked --debug \
    --no-default-features --features lmdb,bundled-libs \
    --root "$garage_root" -j2 --quiet
fi

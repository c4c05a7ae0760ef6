#!/usr/bin/env bash
# The main job in one command: build, mint certificates, start a primary and
# a twin on loopback, drive a mixed workload with twin durability, and show
# both heads equal with every acknowledged frame verified on the twin.
#
#   scripts/demo.sh [data-dir]      (default: ./twinlog-demo, recreated)
set -euo pipefail
cd "$(dirname "$0")/.."
demo=${1:-twinlog-demo}
frames=${FRAMES:-2000}
blob_mib=${BLOB_MIB:-256}

echo "== building"
# Building needs protoc (etcd-client builds etcd's API from its .proto
# files): installed where missing, with what the tests need.
command -v protoc >/dev/null || scripts/install-deps.sh
cargo build -j2 --release -p primary -p twin
bin=target/release

rm -rf "$demo"
mkdir -p "$demo"
echo "== minting certificates"
twin_fp=$("$bin/twin" init --data "$demo/twin" --primary 127.0.0.1:7400 --metrics 127.0.0.1:9401 | awk '/fingerprint/ {print $NF}')
primary_fp=$("$bin/primary" init --data "$demo/primary" --listen 127.0.0.1:7400 --metrics 127.0.0.1:9400 \
  --twin-fingerprint "$twin_fp" | awk '/fingerprint/ {print $NF}')
"$bin/twin" pin --config "$demo/twin/twin.toml" "$primary_fp"
echo "primary $primary_fp"
echo "twin    $twin_fp"

echo "== starting the primary and the twin (logs in $demo/*.log)"
"$bin/primary" serve --config "$demo/primary/primary.toml" 2>"$demo/primary.log" &
primary_pid=$!
"$bin/twin" serve --config "$demo/twin/twin.toml" 2>"$demo/twin.log" &
twin_pid=$!
trap 'kill $primary_pid $twin_pid 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 50); do
  "$bin/primary" status --config "$demo/primary/primary.toml" >/dev/null 2>&1 && break
  sleep 0.1
done

echo "== driving $frames small frames and a $blob_mib MiB blob, twin durability"
"$bin/primary" load --config "$demo/primary/primary.toml" --frames "$frames" --blob-mib "$blob_mib" \
  --verify-twin-log "$demo/twin/log"

echo "== status"
"$bin/primary" status --config "$demo/primary/primary.toml"
"$bin/twin" status --config "$demo/twin/twin.toml"
p=$("$bin/primary" status --json --config "$demo/primary/primary.toml" | sed 's/.*"head":\([0-9]*\).*/\1/')
t=$("$bin/twin" status --json --config "$demo/twin/twin.toml" | sed 's/.*"head":\([0-9]*\).*/\1/')
if [ "$p" = "$t" ]; then
  echo "== both heads are $p"
else
  echo "== heads differ: primary $p, twin $t" >&2
  exit 1
fi

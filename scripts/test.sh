#!/usr/bin/env bash
# The test command: install what the tests need on a fresh machine
# (scripts/install-deps.sh says what and why), then run every test. CI
# runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec cargo test -j2 "$@"

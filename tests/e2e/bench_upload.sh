#!/usr/bin/env bash
# `make bench-upload`: kubectl pets upload beside kubectl cp on the running cluster (bench_upload.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
use_cluster "${1:-local}"
shift || true
require_cluster
exec .venv/bin/python tests/e2e/bench_upload.py "$@"

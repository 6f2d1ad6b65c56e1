#!/usr/bin/env bash
# Debian's Chromium for the browser checks of the e2e suite (test_tensorboard.py), installed when missing.
set -euo pipefail
if command -v chromium >/dev/null; then exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium >/dev/null
chromium --version

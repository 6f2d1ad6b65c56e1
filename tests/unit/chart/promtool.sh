#!/usr/bin/env bash
# Print the path of promtool (Prometheus's rule checker and tester), installing Debian's `prometheus`
# package, which ships it, when it is missing. The chart's alert tests call this, so a fresh machine (CI)
# gets it like the project's other tools. The package's own Prometheus service is not started: a
# policy-rc.d refuses service starts for the install.
set -euo pipefail

if command -v promtool >/dev/null; then
  command -v promtool
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "promtool not found: install Debian's prometheus package (apt-get install prometheus) as root" >&2
  exit 1
fi
# One install at a time (pytest -n 2 may run two chart tests at once); the second finds it installed.
exec 9>"${TMPDIR:-/tmp}/pets-promtool.lock"
flock 9
if ! command -v promtool >/dev/null; then
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "promtool.sh: apt-get install prometheus (for promtool)" >&2
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 prometheus >/dev/null
fi
command -v promtool

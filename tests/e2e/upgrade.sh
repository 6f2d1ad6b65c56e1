#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# make test-upgrade: on the running cluster, the previous release installed as it was released, trainings
# started under it in every state, then upgraded to this tree as docs/chart.md tells users (the CRD
# server-side, then helm upgrade), and rolled back (tests/e2e/test_upgrade.py).
#
#   tests/e2e/upgrade.sh [local|kind] [pytest args...]
#
# The previous release is CHANGELOG.md's newest released section: its tag vX.Y.Z, or the commit the
# section names ("cut from commit ...") where a clone lacks the tag. Its chart comes from that commit.
# Its images are that commit's code (src/, operator/) on this tree's image layers: a second trainer
# dependency layer is 6 GB on every node, which a CI machine's disk does not hold; where the release's
# requirements differ from this tree's, this says so.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
use_cluster "${1:-local}"
shift || true
require_cluster
log() { printf '[upgrade] %s\n' "$*" >&2; }

# A shallow clone lacks the release's commit: deepen it from its origin first.
if [[ $(git rev-parse --is-shallow-repository) == true ]]; then
  git fetch --quiet --unshallow --tags || die "a shallow clone, and its origin would not deepen it: the upgrade test needs the release's commit"
fi
read -r PREVIOUS COMMIT < <(python3 - <<'EOF'
import re, subprocess
text = open("CHANGELOG.md").read()
found = re.search(r"^## (\d+\.\d+\.\d+) - .*?(?=^## |\Z)", text, re.M | re.S)
if not found:
    raise SystemExit("CHANGELOG.md has no released section (## X.Y.Z - date): nothing to upgrade from")
version = found.group(1)
tag = subprocess.run(["git", "rev-parse", "-q", "--verify", f"refs/tags/v{version}^{{commit}}"],
                     capture_output=True, text=True)
named = re.search(r"cut from commit ([0-9a-f]{7,40})", found.group(0))
if tag.returncode != 0 and not named:
    raise SystemExit(f"no tag v{version}, and CHANGELOG.md's {version} section names no commit")
ref = tag.stdout.strip() if tag.returncode == 0 else named.group(1)
print(version, subprocess.run(["git", "rev-parse", f"{ref}^{{commit}}"], capture_output=True, text=True,
                              check=True).stdout.strip())
EOF
)
[[ $PREVIOUS != "$VERSION" ]] || die "this tree is at $VERSION, the previous release's version: set the next -dev version"
log "from $PREVIOUS (commit ${COMMIT:0:12}) to this tree ($VERSION)"

release=$PETS_STATE/upgrade/$PREVIOUS
rm -rf "$release"
mkdir -p "$release"
git archive "$COMMIT" charts src operator image/requirements.py pyproject.toml | tar -x -C "$release"
# The release's console scripts (pets-launch, ...), as pip would write them from its pyproject.toml: this
# tree's may name a function the release's code does not have.
python3 - "$release" <<'EOF'
import pathlib, sys, tomllib
root = pathlib.Path(sys.argv[1])
(root / "bin").mkdir()
for name, target in tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"].items():
    module, function = target.split(":")
    script = root / "bin" / name
    script.write_text(f"#!/opt/venv/bin/python\nimport sys\nfrom {module} import {function}\n"
                      f"if __name__ == '__main__':\n    sys.exit({function}())\n")
    script.chmod(0o755)
EOF

for name in trainer operator; do
  if ! diff -q <(python3 "$release/image/requirements.py" "$name" --runtime) \
    <(python3 image/requirements.py "$name" --runtime) >/dev/null; then
    log "note: $PREVIOUS's $name requirements differ from this tree's; its code runs on this tree's layers:"
    diff <(python3 "$release/image/requirements.py" "$name" --runtime) \
      <(python3 image/requirements.py "$name" --runtime) >&2 || true
  fi
done

t0=$SECONDS
image/build.sh all >/dev/null
# The release's packages replace this tree's in a copy of each image; the layers under them are shared.
packages=$(cd "$release" && ls -d src/*/ operator/*/ | grep -v egg-info | tr '\n' ' ')
for name in operator trainer; do
  {
    echo "FROM pets-training/$name:$VERSION"
    echo "USER 0"
    echo "RUN cd /opt/venv/lib/python3.11/site-packages && rm -rf pets_training pets_operator pets_client pets_contract"
    for package in $packages; do
      echo "COPY $package /opt/venv/lib/python3.11/site-packages/$(basename "$package")/"
    done
    echo "COPY bin/ /opt/venv/bin/"
    echo "USER 65532:65532"
    echo "LABEL org.opencontainers.image.version=$PREVIOUS org.opencontainers.image.revision=$COMMIT"
  } >"$release/Dockerfile.$name"
  DOCKER_BUILDKIT=0 docker build -q -f "$release/Dockerfile.$name" -t "pets-training/$name:$PREVIOUS" "$release" >/dev/null
done
log "images built in $((SECONDS - t0)) s: pets-training/{operator,trainer}:$PREVIOUS and :$VERSION"
t0=$SECONDS
load_images
tests/cluster/load-image.sh --all-nodes "pets-training/operator:$PREVIOUS"
tests/cluster/load-image.sh "pets-training/trainer:$PREVIOUS"
# Kueue before the test: one of its trainings waits in a queue across the upgrade.
tests/cluster/cluster.sh addon-up kueue >/dev/null
log "images loaded and Kueue up in $((SECONDS - t0)) s"

PETS_PREVIOUS_VERSION=$PREVIOUS PETS_PREVIOUS_CHART=$release/charts/pets-training \
  .venv/bin/pytest --capture=tee-sys --durations=0 -m upgrade tests/e2e/test_upgrade.py "$@"

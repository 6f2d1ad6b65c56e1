#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Load an image into the containerd of every local node that runs pods (namespace k8s.io), without a
# registry. With several nodes the control-plane node gets none (pods do not run there), unless
# --all-nodes: for what is placed there on purpose (the e2e suite's operator, like a system component).
#
# usage: load-image.sh [--all-nodes] IMAGE | --archive FILE | --remove IMAGE
#        load-image.sh IMAGE            docker save IMAGE | ctr images import -  (needs docker); a no-op
#                                       when containerd has that docker image already; a node with an
#                                       earlier build gets only the layers it lacks (the config alone,
#                                       with no docker save, when it lacks none), and the earlier build
#                                       is removed after the import
#        load-image.sh --archive FILE   an OCI or docker archive made elsewhere (no docker needed)
#        load-image.sh --remove IMAGE   remove IMAGE (every name of it) from every node's containerd, the
#                                       control-plane node's included (a test's own image, when done)
# PETS_CLUSTER=kind loads into the kind cluster instead (kind load docker-image / image-archive).
# Pods then use the image with imagePullPolicy IfNotPresent or Never. Docker names are imported
# as containerd normalises them: pets-training/trainer:0.1.0 -> docker.io/pets-training/trainer:0.1.0,
# which is also what kubelet looks up for `image: pets-training/trainer:0.1.0`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=load-image
# shellcheck source=lib.sh
source "$HERE/lib.sh"

all_nodes=false
if [[ "${1:-}" == --all-nodes ]]; then all_nodes=true; shift; fi

if [[ "${PETS_CLUSTER:-local}" == kind ]]; then
  # kind's nodes run their own containerd; kind loads images into them.
  kind="$PETS_BIN/kind"
  [[ -x "$kind" ]] || die "$kind is missing: run tests/cluster/build.sh kind"
  case "${1:-}" in
    --remove) log "kind: --remove is not done here (kind's node images are kind's)"; exit 0 ;;
    --archive) exec "$kind" load image-archive "${2:?--archive needs a file}" --name "${PETS_KIND_NAME:-pets-training}" ;;
    "" | -*) die "usage: $0 IMAGE | --archive FILE (got '${1:-}')" ;;
    *) exec "$kind" load docker-image "$1" --name "${PETS_KIND_NAME:-pets-training}" ;;
  esac
fi

# The containerd of every node that runs pods: the first node, unless it is a dedicated (tainted)
# control-plane node, and nodes 2..N (cluster.sh, PETS_NODES).
first="$PETS_STATE/containerd/containerd.sock"
[[ -S "$first" ]] || die "no containerd socket at $first: is the local cluster up (tests/cluster/cluster.sh up local)?"
sockets=()
[[ -f "$PETS_STATE/control-plane-node" && $all_nodes == false && ${1:-} != --remove ]] || sockets+=("$first")
for s in "$PETS_STATE"/nodes/*/containerd/containerd.sock; do [[ -S "$s" ]] && sockets+=("$s"); done
sock=""
ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }

# Which docker image an import came from, so loading the same image again is a no-op.
ID_LABEL=dev.pets-training.docker-id

# containerd's name for a docker name: pets-training/trainer:0.1.0 -> docker.io/pets-training/trainer:0.1.0
containerd_ref() {
  local name=$1
  [[ $name == */* ]] || name=library/$name
  [[ ${name%%/*} == *[.:]* || ${name%%/*} == localhost ]] || name=docker.io/$name
  echo "$name"
}

# The digest (of its manifest) that the image named REF points at; nothing when there is none.
image_digest() { ctr_ images ls "name==$1" | awk 'NR == 2 { print $3 }'; }

# The image REF named before, and every other name of it (the CRI adds "sha256:<config>" names), is
# removed, so its content and unpacked layers (12 GB for the trainer) do not pile up across loads.
# A container that still uses them keeps them alive.
remove_superseded() {
  local digest names
  digest=$(image_digest "$1")
  [[ -n $digest ]] || return 0
  mapfile -t names < <(ctr_ images ls | awk -v d="$digest" 'NR > 1 && $3 == d { print $1 }')
  log "removing the superseded $1 (${digest:7:12}; ${#names[@]} names)"
  ctr_ images rm --sync "${names[@]}" >/dev/null
}

# Images left with only their "sha256:" name (their tag moved on by an earlier import).
remove_orphans() {
  local orphans
  mapfile -t orphans < <(ctr_ images ls | awk 'NR > 1 { if ($1 ~ /^sha256:/) id[$1] = $3; else named[$3] = 1 }
    END { for (r in id) if (!(id[r] in named)) print r }')
  [[ ${#orphans[@]} -gt 0 ]] || return 0
  log "removing ${#orphans[@]} image(s) no name refers to any more"
  ctr_ images rm --sync "${orphans[@]}" >/dev/null
}

# node_of SOCKET: the node a containerd socket belongs to, for the log.
node_of() { [[ $1 == "$PETS_STATE/nodes/"* ]] && { local d=${1#"$PETS_STATE/nodes/"}; echo "${d%%/*}"; } || echo "the first node"; }

t0=$SECONDS
case "${1:-}" in
  --archive)
    [[ -f "${2:-}" ]] || die "--archive: '${2:-}' is not a file"
    for sock in "${sockets[@]}"; do ctr_ images import "$2"; done
    ;;
  --remove)
    ref=$(containerd_ref "${2:?--remove needs an image name}")
    for sock in "${sockets[@]}"; do
      remove_superseded "$ref"
      remove_orphans
    done
    ;;
  "" | -*)
    die "usage: $0 IMAGE | --archive FILE | --remove IMAGE (got '${1:-}')"
    ;;
  *)
    command -v docker >/dev/null || die "docker not found: load-image.sh IMAGE needs docker (or use --archive FILE)"
    id=$(docker image inspect --format '{{.Id}}' "$1" 2>/dev/null) ||
      die "image '$1' is not in docker (docker images lists what is)"
    ref=$(containerd_ref "$1")
    # A control-plane node this image does not go to keeps the build it has (a single-node cluster
    # loaded it, the demo's): its unpacked layers, about 6 GB, make the next single-node load slim.
    pending=()
    updates=()  # per pending node: whether it holds an earlier build of this image (then: its config alone, or slim)
    for sock in "${sockets[@]}"; do
      if ctr_ images ls "name==$ref" | grep -q "$ID_LABEL=$id"; then
        log "$ref is already in containerd of $(node_of "$sock") (docker image ${id:7:12}): nothing to load"
        continue
      fi
      if ctr_ images ls -q "name==$ref" | grep -q .; then
        updates+=(true)  # the earlier build goes after the import: its unpacked layers are reused
      else
        updates+=(false)
        remove_orphans
      fi
      pending+=("$sock")
    done
    [[ ${#pending[@]} -gt 0 ]] || exit 0
    keep="$ref-load-image-previous"
    fifos=$(mktemp -d)
    trap 'rm -rf "$fifos"' EXIT
    # The image's config as docker keeps it (slim_image_archive.py checks that its sha256 is the image
    # id): with it, a node that has every layer of the image unpacked already gets the config alone.
    config="$(docker info --format '{{.DockerRootDir}}/image/{{.Driver}}' 2>/dev/null)/imagedb/content/sha256/${id#sha256:}"
    pids=() outs=() how=()
    for i in "${!pending[@]}"; do
      sock=${pending[$i]}
      if [[ ${updates[$i]} == true ]]; then
        # The import moves $ref to the new build, and the earlier build is left with no name (what
        # is loaded here gets no CRI `sha256:` name): containerd then collected its snapshots while
        # the new build was unpacked onto them (seen once: "parent snapshot ... does not exist").
        # A name of our own keeps them until the import is done.
        ctr_ images tag --force "$ref" "$keep" >/dev/null
        { ctr_ snapshots ls; ctr_ content ls; } >"$fifos/present-$i"
        # The usual case of a commit that changed neither src/ nor operator/: a new config (the revision
        # label), the same layers. Nothing of the 6 GB is read then, not even by docker save.
        ctr_ content get "$(image_digest "$keep")" >"$fifos/earlier-$i" 2>/dev/null || true
        if [[ ! -r $config ]]; then
          echo "not the config alone: docker keeps no config at $config" >"$fifos/why-$i"
        elif python3 "$HERE/slim_image_archive.py" --config-only "$config" "$id" "$1" \
               "$fifos/present-$i" "$fifos/earlier-$i" >"$fifos/layout-$i" 2>"$fifos/why-$i" &&
             ctr_ images import "$fifos/layout-$i" >/dev/null; then
          how[$i]="the config alone"
          continue
        fi
        how[$i]="slim"
        log "$(node_of "$sock"): $(sed 's/^slim_image_archive: //' "$fifos/why-$i" 2>/dev/null | tail -n 1)"
      elif ctr_ snapshots ls | awk 'NR > 1 { found = 1 } END { exit !found }'; then
        # No build of this name, but layers of others (the same image under its previous version's tag):
        # slim too, or a new version would stream all 6 GB into every node's ingest at once.
        how[$i]="slim"
        { ctr_ snapshots ls; ctr_ content ls; } >"$fifos/present-$i"
      else
        how[$i]="whole"
      fi
      mkfifo "$fifos/$i"
      outs+=("$fifos/$i")
      if [[ ${how[$i]} == slim ]]; then
        (python3 "$HERE/slim_image_archive.py" "$fifos/present-$i" "$PETS_CACHE/docker-layer-chains" \
          <"$fifos/$i" | ctr_ images import - >/dev/null) &
      else
        ctr_ images import - <"$fifos/$i" >/dev/null &
      fi
      pids[$i]=$!
    done
    log "$1 into $(for i in "${!pending[@]}"; do echo "$(node_of "${pending[$i]}") (${how[$i]})"; done | paste -sd, -)"
    # One `docker save` for every node that needs more than the config, imported by all at once (a
    # fifo each): the trainer's 6 GB is read from docker once, however many workers there are. A node
    # that holds an earlier build gets slim_image_archive.py's OCI layout without the layers it has
    # unpacked (the trainer's 5.9 GB of dependencies, unless they changed), and then drops the layers'
    # blobs, as its unpacked snapshots are all a pod needs; a node without one gets docker's archive.
    # tee -p: a node whose import fails early does not stop the others' stream; its own status says.
    if ((${#outs[@]})); then
      docker save "$1" | tee -p "${outs[@]}" >/dev/null || log "docker save $1 | tee: not every node took the whole stream"
    fi
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" && continue
      [[ ${how[$i]} == slim ]] || die "importing $1 into $(node_of "${pending[$i]}") failed"
      # A slim import that failed is done again whole: slower, and it needs nothing of the node's.
      sock=${pending[$i]}
      log "the slim import into $(node_of "$sock") failed; importing docker's whole archive there"
      docker save "$1" | ctr_ images import - >/dev/null || die "importing $1 into $(node_of "$sock") failed"
    done
    for i in "${!pending[@]}"; do
      sock=${pending[$i]}
      ctr_ images label "$ref" "$ID_LABEL=$id" >/dev/null
      [[ ${how[$i]} != whole ]] || continue
      if [[ ${updates[$i]} == true ]]; then
        ctr_ images rm --sync "$keep" >/dev/null
        remove_orphans
      fi
      mapfile -t layers < <(ctr_ content get "$(image_digest "$ref")" |
        python3 -c 'import json, sys; print(*(layer["digest"] for layer in json.load(sys.stdin)["layers"]), sep="\n")')
      ctr_ content rm "${layers[@]}" >/dev/null 2>&1 || true  # blobs left out were never there
    done
    ;;
esac
log "loaded in $((SECONDS - t0)) s"

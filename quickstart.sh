#!/usr/bin/env bash
# Set up espn on a fresh Debian machine and run a quick, real continual-learning job:
# ESPN-0.2 on 5 Rotated Fashion-MNIST tasks (real images, offline), printing the result and
# writing runs/quickstart/results.json and runs/quickstart/accuracy.png. The size rule is off
# (--no-step-floor): 10 epochs of 6000 images per task, not the paper's 2350 steps, to stay quick.
# It installs only what this job needs: espn and its required dependencies (no extras), and
# torch only if none is importable (a torch you installed, e.g. a CUDA build, is kept).
set -euo pipefail
cd "$(dirname "$0")"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
fi
if python3 -c "import torch" 2>/dev/null; then
  # keep the installed torch: pin its distribution version, so that pip adds torchvision and
  # the rest for it and never installs another torch
  keep=$(mktemp)
  trap 'rm -f "$keep"' EXIT
  python3 -c "from importlib.metadata import version; print('torch==' + version('torch'))" >"$keep"
  python3 -m pip install -q -c "$keep" -e .
else
  python3 -m pip install -q torch==2.14.1 torchvision==0.29.1
  python3 -m pip install -q -e .
fi
espn run --benchmark rotated-fashion-mnist --tasks 5 --train-per-task 6000 \
  --method espn --gamma 0.2 --no-step-floor --out runs/quickstart --overwrite "$@"

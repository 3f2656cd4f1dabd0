#!/usr/bin/env bash
# Wheels for the GPU machine, which cannot download: the packages pipe needs that
# its image lacks (jsonschema and structlog with their dependencies, pcpp, and cuobjdump with
# nvdisasm, which the judge reads a variant's SASS with). Run here, in
# the repo root; the device call then carries .whl and installs from it
# (see tools/device-run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  'jsonschema==4.26.0' 'jsonschema-specifications==2025.9.1' 'referencing==0.37.0' 'rpds-py==0.30.0' \
  'structlog==26.1.0' 'pcpp==1.30' 'optuna==5.0.0' 'alembic==1.20.1' 'colorlog==6.12.0' 'sqlalchemy==2.1.9' 'mako==1.4.3' 'nvidia-ml-py==13.580.126' \
  'nvidia-cuda-cuobjdump==13.5.37' 'nvidia-cuda-nvdisasm==13.5.37'
ls -la .whl

#!/bin/bash
# Session 44 red team of the CUDA build rules (no GPU). From the scratch clone:
#   bash datasets/judge-redteam/s44-cuda/run.sh
# Each variant vN_*/ holds variant.cu.j2 (the shipped template's text, includes in place, edited),
# spec.yaml (the shipped spec, kernel.template pointing at the variant) and meta.json.
# check.py prints, per variant: [1] `pipe render vN/spec.yaml --compile`, [2] the verdict of the
# trial path (Builder.build with approved_sources: the variant judged against the SHIPPED template),
# [3] the forbidden construct counted in the accepted build's PTX and SASS.
set -e
cd "$(dirname "$0")/../../.."
python datasets/judge-redteam/s44-cuda/mk.py            # (re)writes the variant folders; v1 needs redteam-s44/h/fast.cuh at its absolute path
python datasets/judge-redteam/s44-cuda/check.py "$@" 2>&1 | grep -v Warning

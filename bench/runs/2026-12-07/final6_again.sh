#!/bin/bash
# After final_checks_6.sh, in the same sitting, nothing else running: the rows it read below
# 0.95x beside two busy processes again, with more passes: qwen3-vl-8b's useless draft
# (16 passes, beside its A/A control) and the demo's bad draft (bench/load.py, 6 passes).
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/useless_drafts.py --loads 2 --repeat 16 --control --models /tmp/useless-models \
    --rows qwen3-vl-8b --json $OUT/final6-useless-2competitors-again.json \
    > $OUT/final6-useless-2competitors-again.txt 2>&1
uptime
python bench/load.py --rows bad --loads 2 --repeat 6 \
    --json $OUT/final6-load-2competitors-bad.json > $OUT/final6-load-2competitors-bad.txt 2>&1
uptime

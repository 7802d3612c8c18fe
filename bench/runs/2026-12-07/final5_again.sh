#!/bin/bash
# After final_checks_5.sh, in the same sitting, nothing else running: the rows it read
# below 0.95x again, with more passes (each beside its A/A control): qwen25-vl-7b idle
# (8 passes), llava15-7b and mistral3-24b beside two busy processes (5 passes).
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/useless_drafts.py --loads 0 --repeat 8 --control --models /tmp/useless-models \
    --rows qwen25-vl-7b --json $OUT/final5-useless-idle-again.json \
    > $OUT/final5-useless-idle-again.txt 2>&1
uptime
python bench/useless_drafts.py --loads 2 --repeat 5 --control --models /tmp/useless-models \
    --rows llava15-7b,mistral3-24b --json $OUT/final5-useless-2competitors-again.json \
    > $OUT/final5-useless-2competitors-again.txt 2>&1
uptime

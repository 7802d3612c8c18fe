#!/bin/bash
# Issue 60's done-when checks at the session's final commit, in one sitting (the machine's
# load average is printed before each): the default (the target's hidden-state head, auto
# length) on the demo, on 24 real photo crops and beside a useless draft (bench/load.py, 3
# passes, idle); MMSpec's questions (vlmspec bench, the default's method against
# target-only, the draft's chain and the EAGLE-3 head); calibrate with its defaults.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
uptime
python bench/load.py --rows demo,photos,bad --loads 0 --repeat 3 \
    --photos-from /tmp/sk-site/sklearn/datasets/images --json $OUT/final-load-idle.json \
    > $OUT/final-load-idle.txt 2>&1
uptime
vlmspec bench examples/mmspec/mmspec.jsonl --methods none,hidden,chain,eagle3 --json \
    > $OUT/final-mmspec.json 2> $OUT/final-mmspec.txt
uptime
/usr/bin/time -f "wall %e s" vlmspec calibrate examples/images/ --json \
    > $OUT/final-calibrate-idle.json 2> $OUT/final-calibrate-idle.txt
uptime

#!/bin/bash
# Issue 60's and 61's done-when checks at the final commit of the session after stop 64, in
# one sitting, nothing else running (the load average is printed before each): the default
# (the target's hidden-state head, head-v4, auto length) on the demo, 24 real photo crops
# and beside a useless draft, idle (3 passes) and beside two busy processes (2 passes);
# MMSpec's questions; calibrate with its defaults; a useless draft on every shipped
# real-family profile with its A/A control (idle), and the three first rows beside two busy
# processes; the folder at B = 8 (target-only batched against each method batched).
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
PHOTOS=${PHOTOS:-/tmp/sk-site/sklearn/datasets/images}
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/load.py --rows demo,photos,bad --loads 0 --repeat 3 --photos-from $PHOTOS \
    --json $OUT/final2-load-idle.json > $OUT/final2-load-idle.txt 2>&1
uptime
vlmspec bench examples/mmspec/mmspec.jsonl --methods none,hidden,chain,eagle3 --json \
    > $OUT/final2-mmspec.json 2> $OUT/final2-mmspec.txt
uptime
/usr/bin/time -f "wall %e s" vlmspec calibrate examples/images/ --json \
    > $OUT/final2-calibrate-idle.json 2> $OUT/final2-calibrate-idle.txt
uptime
python bench/load.py --rows demo,bad --loads 2 --repeat 2 \
    --json $OUT/final2-load-2competitors.json > $OUT/final2-load-2competitors.txt 2>&1
uptime
python bench/useless_drafts.py --loads 0 --repeat 2 --control \
    --json $OUT/final2-useless-idle.json > $OUT/final2-useless-idle.txt 2>&1
uptime
python bench/scale.py --folder --inputs 24 --photos-from $PHOTOS --batch-sizes 8 --passes 2 \
    --threads 1 --max-new-tokens 48 --gamma 5 \
    --methods hidden:3,hidden:4,hidden,hidden:auto12,chain,tree \
    --json $OUT/final2-scale-folder.json > $OUT/final2-scale-folder.txt 2>&1
uptime
python bench/useless_drafts.py --rows qwen25-vl-7b,llava15-7b,walk --loads 2 --repeat 2 --control \
    --json $OUT/final2-useless-2competitors.json > $OUT/final2-useless-2competitors.txt 2>&1
uptime

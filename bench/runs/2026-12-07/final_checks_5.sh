#!/bin/bash
# Issue 60's done-when checks again after a probe due within a new request began coming at
# its first chosen round (73befb7), in one sitting, nothing else running (the load average
# is printed before each): a useless draft on every shipped real-family profile and the
# own-model walk's pair, each row beside its A/A control, idle and beside two busy
# processes (6 passes each: at 4, one row's pass-to-pass spread was wider than the 5% the
# done-when leaves); the default on the demo, 24 real photo crops and beside a useless
# draft (idle, 2 passes); MMSpec's questions; calibrate with its defaults idle and beside two
# busy processes; the demo and the useless draft beside two busy processes (2 passes).
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
PHOTOS=${PHOTOS:-/tmp/sk-site/sklearn/datasets/images}
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/useless_drafts.py --loads 0 --repeat 6 --control --models /tmp/useless-models \
    --json $OUT/final5-useless-idle.json > $OUT/final5-useless-idle.txt 2>&1
uptime
python bench/useless_drafts.py --loads 2 --repeat 6 --control --models /tmp/useless-models \
    --json $OUT/final5-useless-2competitors.json > $OUT/final5-useless-2competitors.txt 2>&1
uptime
python bench/load.py --rows demo,photos,bad --loads 0 --repeat 2 --photos-from $PHOTOS \
    --json $OUT/final5-load-idle.json > $OUT/final5-load-idle.txt 2>&1
uptime
vlmspec bench examples/mmspec/mmspec.jsonl --methods none,hidden,chain,eagle3 --json \
    > $OUT/final5-mmspec.json 2> $OUT/final5-mmspec.txt
uptime
{ uptime; echo '$ vlmspec calibrate examples/images/ --json  (idle)'; } > $OUT/final5-calibrate-idle.txt
/usr/bin/time -f "wall %e s" vlmspec calibrate examples/images/ --json \
    > $OUT/final5-calibrate-idle.json 2>> $OUT/final5-calibrate-idle.txt
uptime >> $OUT/final5-calibrate-idle.txt
uptime
SPIN='import time
t = time.time() + 600
while time.time() < t: pass'
python -c "$SPIN" & A=$!
python -c "$SPIN" & B=$!
sleep 5
{ uptime; echo '$ vlmspec calibrate examples/images/ --json  (beside 2 busy python loops)'; } \
    > $OUT/final5-calibrate-2competitors.txt
/usr/bin/time -f "wall %e s" vlmspec calibrate examples/images/ --json \
    > $OUT/final5-calibrate-2competitors.json 2>> $OUT/final5-calibrate-2competitors.txt
uptime >> $OUT/final5-calibrate-2competitors.txt
kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
uptime
python bench/load.py --rows demo,bad --loads 2 --repeat 2 \
    --json $OUT/final5-load-2competitors.json > $OUT/final5-load-2competitors.txt 2>&1
uptime

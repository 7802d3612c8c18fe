#!/bin/bash
# Issue 60's done-when checks after plain rounds while drafting is off began to be observed
# one in eight (3f45db6), in one sitting, nothing else running (the load average is printed
# before each): a useless draft on every shipped real-family profile and the own-model
# walk's pair, each row beside its A/A control, idle (6 passes) and beside two busy
# processes (8 passes: at 5-6 a row's interval was wider than the 5% the done-when
# leaves); the default on the demo, 24 real photo crops and beside a useless draft (idle,
# 2 passes); MMSpec's questions; the demo and the useless draft beside two busy processes
# (2 passes); then plain-rounds/ab.sh's loaded half for llava15-7b three times more.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
PHOTOS=${PHOTOS:-/tmp/sk-site/sklearn/datasets/images}
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/useless_drafts.py --loads 0 --repeat 6 --control --models /tmp/useless-models \
    --json $OUT/final6-useless-idle.json > $OUT/final6-useless-idle.txt 2>&1
uptime
python bench/useless_drafts.py --loads 2 --repeat 8 --control --models /tmp/useless-models \
    --json $OUT/final6-useless-2competitors.json > $OUT/final6-useless-2competitors.txt 2>&1
uptime
python bench/load.py --rows demo,photos,bad --loads 0 --repeat 2 --photos-from $PHOTOS \
    --json $OUT/final6-load-idle.json > $OUT/final6-load-idle.txt 2>&1
uptime
vlmspec bench examples/mmspec/mmspec.jsonl --methods none,hidden,chain,eagle3 --json \
    > $OUT/final6-mmspec.json 2> $OUT/final6-mmspec.txt
uptime
python bench/load.py --rows demo,bad --loads 2 --repeat 2 \
    --json $OUT/final6-load-2competitors.json > $OUT/final6-load-2competitors.txt 2>&1
uptime
AB=$OUT/plain-rounds
for i in 4 5 6; do
  for side in base new; do
    (cd /work/wt/$side && PYTHONPATH=/work/wt/$side python "/work/main/$AB/inload.py" \
        llava15-7b 12 2 "/work/main/$AB/$side-llava15-7b-spin2-$i.json")
  done
done
uptime

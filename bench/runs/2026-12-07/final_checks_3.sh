#!/bin/bash
# Issue 60's remaining done-when checks at the final commit of the session after stop 65, in
# one sitting, nothing else running (the load average is printed before each): a useless
# draft on every shipped real-family profile and the own-model walk's pair, each row beside
# its A/A control, idle (5 passes) and beside two busy processes (3 passes), now that
# --compare takes turns at which side decodes an input first; calibrate with its defaults
# beside two busy processes (its budget); the demo and the bad draft idle and beside two.
set -u
cd "$(dirname "$0")/../../.."
OUT=bench/runs/2026-12-07
git log -1 --format='commit %h %s' | cut -c1-100
uptime
python bench/useless_drafts.py --loads 0 --repeat 5 --control --models /tmp/useless-models \
    --json $OUT/final3-useless-idle.json > $OUT/final3-useless-idle.txt 2>&1
uptime
python bench/useless_drafts.py --loads 2 --repeat 3 --control --models /tmp/useless-models \
    --json $OUT/final3-useless-2competitors.json > $OUT/final3-useless-2competitors.txt 2>&1
uptime
# calibrate beside two busy processes (python spin loops, as bench/load.py's competitors)
SPIN='import time
t = time.time() + 600
while time.time() < t: pass'
python -c "$SPIN" & A=$!
python -c "$SPIN" & B=$!
sleep 5
{ uptime; echo '$ vlmspec calibrate examples/images/ --json  (beside 2 busy python loops)'; } \
    > $OUT/final3-calibrate-2competitors.txt
/usr/bin/time -f "wall %e s" vlmspec calibrate examples/images/ --json \
    > $OUT/final3-calibrate-2competitors.json 2>> $OUT/final3-calibrate-2competitors.txt
uptime >> $OUT/final3-calibrate-2competitors.txt
kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
uptime
python bench/load.py --rows demo,bad --loads 0,2 --repeat 2 \
    --json $OUT/final3-load.json > $OUT/final3-load.txt 2>&1
uptime

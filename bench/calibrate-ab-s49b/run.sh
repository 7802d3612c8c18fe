#!/bin/bash
# The recorded run of RESULTS "calibrate's predictions priced by each probe's timed rounds" (session 49, final code).
# /tmp/cza: a clone at 398494b (before), /tmp/czb: a clone at 5e7b3dd (after); photo crops and bad draft as in ../calibrate-ab-s49/run.sh.
# calibrate before (398494b, /tmp/cza) and after (the final code, /tmp/czb), one after the other per set
out=/tmp/s49/calab2; mkdir -p $out
PY=/work/main/.venv/bin/python
for set in demo photos video bad; do
  case $set in
    demo) args="examples/images/ --budget 60";;
    photos) args="/tmp/s49/photos --budget 60";;
    video) args="-p tinyworld-video examples/videos/ --budget 60";;
    bad) args="examples/images/ --set draft.model=/tmp/vlmspec-bad-draft --budget 40";;
  esac
  for side in a b; do
    cd /tmp/cz$side
    echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $set $side ($(git log --format=%h -1)): python -m vlmspec_cli calibrate $args --json" >> $out/log.txt
    $PY -m vlmspec_cli calibrate $args --json > $out/$set-$side.json 2> $out/$set-$side.err
    echo "rc $?" >> $out/log.txt
  done
done

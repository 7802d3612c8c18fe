#!/bin/bash
# The recorded run of RESULTS "calibrate's predictions priced by each probe's timed rounds" (session 49).
# /tmp/cza: a clone at 398494b (before), /tmp/czb: a clone at 144f9b6 (after); the photo crops:
#   (cd bench && python -c "from pathlib import Path; from load import photo_set; photo_set(Path(\"/tmp/sk-site/sklearn/datasets/images\"), Path(\"/tmp/s49/photos\"), 8)")
# the bad draft: bench/auto_gamma.py bad_draft (/tmp/vlmspec-bad-draft).
# calibrate before (398494b, /tmp/cza) and after (144f9b6, /tmp/czb), interleaved, one at a time
out=/tmp/s49/calab; mkdir -p $out
PY=/work/main/.venv/bin/python
for set in demo photos bad; do
  case $set in
    demo) args="examples/images/ --budget 60";;
    photos) args="/tmp/s49/photos --budget 60";;
    bad) args="examples/images/ --set draft.model=/tmp/vlmspec-bad-draft --budget 40";;
  esac
  for side in a b; do
    cd /tmp/cz$side
    echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $set $side: python -m vlmspec_cli calibrate $args --json" >> $out/log.txt
    $PY -m vlmspec_cli calibrate $args --json > $out/$set-$side.json 2> $out/$set-$side.err
    echo "rc $?" >> $out/log.txt
  done
done

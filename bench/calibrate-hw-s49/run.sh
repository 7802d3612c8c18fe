#!/bin/bash
# calibrate from a hardware profile's tables (vlmspec profile --write /tmp/s49/hw49.yaml, in a clone at 3bc0f7a),
# before (0d95dc8, /tmp/czd) and after (3bc0f7a, /tmp/czc) Eq. 1 taken over whole requests
out=/tmp/s49/calhw; mkdir -p $out
PY=/work/main/.venv/bin/python
for set in demo photos; do
  case $set in
    demo) args="examples/images/ -p /tmp/s49/withhw.yaml --budget 60";;
    photos) args="/tmp/s49/photos -p /tmp/s49/withhw.yaml --budget 60";;
  esac
  for side in d c; do
    cd /tmp/cz$side
    echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $set $side ($(git log --format=%h -1)): python -m vlmspec_cli calibrate $args --json" >> $out/log.txt
    $PY -m vlmspec_cli calibrate $args --json > $out/$set-$side.json 2> $out/$set-$side.err
    echo "rc $?" >> $out/log.txt
  done
done

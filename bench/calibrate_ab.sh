#!/bin/bash
# `vlmspec calibrate` by two checkouts of vlmspec, set by set, one run after the other: the
# before/after records of bench/history/RESULTS-until-2026-12-07.md (bench/runs/2026-11-27/calibrate-*-s49/). Each run's --json and stderr go
# to OUT/SET-SIDE.{json,err}, the command, load and exit code to OUT/log.txt.
#   bench/calibrate_ab.sh OUT BEFORE_CLONE AFTER_CLONE 'NAME=ARGS' ['NAME=ARGS' ...]
#   e.g. bench/calibrate_ab.sh /tmp/ab /tmp/cza /tmp/czb 'demo=examples/images/ --budget 60'
# SIDE is the clone's folder name without "/tmp/cz" as the session-49 runs named them (a, b, …).
out=$1 before=$2 after=$3; shift 3
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p "$out"
for spec in "$@"; do
  set=${spec%%=*} args=${spec#*=}
  for clone in "$before" "$after"; do
    side=${clone#/tmp/cz}
    cd "$clone" || exit 2
    echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $set $side ($(git log --format=%h -1)): python -m vlmspec_cli calibrate $args --json" >> "$out/log.txt"
    $PY -m vlmspec_cli calibrate $args --json > "$out/$set-$side.json" 2> "$out/$set-$side.err"
    echo "rc $?" >> "$out/log.txt"
  done
done

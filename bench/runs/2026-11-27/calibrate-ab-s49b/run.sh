#!/bin/bash
# The recorded run of RESULTS "calibrate's predictions priced by each probe's timed rounds" (session 49).
# /tmp/cza: a clone at 398494b (before), /tmp/czb: a clone at 5e7b3dd (after); photo crops and bad draft
# as in ../calibrate-ab-s49/run.sh. (Run then as an inline copy of bench/calibrate_ab.sh's loop.)
bench/calibrate_ab.sh /tmp/s49/calab2 /tmp/cza /tmp/czb \
  'demo=examples/images/ --budget 60' 'photos=/tmp/s49/photos --budget 60' \
  'video=-p tinyworld-video examples/videos/ --budget 60' \
  'bad=examples/images/ --set draft.model=/tmp/vlmspec-bad-draft --budget 40'

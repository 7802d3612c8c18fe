#!/bin/bash
# The recorded run of RESULTS "calibrate's predictions priced by each probe's timed rounds" (session 49,
# first version). /tmp/cza: a clone at 398494b (before), /tmp/czb: a clone at 144f9b6 (after); the photo crops:
#   (cd bench && python -c "from pathlib import Path; from load import photo_set; photo_set(Path(\"/tmp/sk-site/sklearn/datasets/images\"), Path(\"/tmp/s49/photos\"), 8)")
# the bad draft: bench/auto_gamma.py bad_draft (/tmp/vlmspec-bad-draft). (Run then as an inline copy of
# bench/calibrate_ab.sh's loop, which was written from it.)
bench/calibrate_ab.sh /tmp/s49/calab /tmp/cza /tmp/czb \
  'demo=examples/images/ --budget 60' 'photos=/tmp/s49/photos --budget 60' \
  'bad=examples/images/ --set draft.model=/tmp/vlmspec-bad-draft --budget 40'

#!/bin/bash
# The recorded run of RESULTS "calibrate from a hardware profile's tables, Eq. 1 over whole requests"
# (session 49): hw49.yaml from `vlmspec profile --write /tmp/s49/hw49.yaml` in a clone at 3bc0f7a,
# withhw.yaml includes it; /tmp/czd: a clone at 0d95dc8 (before), /tmp/czc: one at 3bc0f7a (after).
# (Run then as an inline copy of bench/calibrate_ab.sh's loop.)
bench/calibrate_ab.sh /tmp/s49/calhw /tmp/czd /tmp/czc \
  'demo=examples/images/ -p /tmp/s49/withhw.yaml --budget 60' \
  'photos=/tmp/s49/photos -p /tmp/s49/withhw.yaml --budget 60'

#!/bin/bash
# A/B of "while drafting is off, one plain round in eight is observed" (3f45db6) against
# the commit before it (4941ef9), in one sitting on the 2-core machine, nothing else
# running: inload.py, base and new taking turns three times per row, idle (20 passes)
# and beside two busy Python processes (12 passes).
#   git worktree add /work/wt/base 4941ef9; git worktree add /work/wt/new 3f45db6
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
uptime
for spin in 0 2; do
  passes=$([ $spin = 0 ] && echo 20 || echo 12)
  for row in llava15-7b mistral3-24b; do
    for i in 1 2 3; do
      for side in base new; do
        (cd /work/wt/$side && PYTHONPATH=/work/wt/$side $PY "$HERE/inload.py" $row $passes $spin \
            "$HERE/$side-$row-spin$spin-$i.json")
      done
    done
  done
done
uptime

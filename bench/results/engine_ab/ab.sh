#!/bin/bash
# Alternate the baseline tree (2d610cd) and the engine tree, same commands, one after the other.
OUT=/work/wt-engine/bench/results/engine_ab
PY=/work/main/.venv/bin/python
for round in 1 2 3; do
  for tree in base engine; do
    dir=/work/wt-engine; [ $tree = base ] && dir=/work/wt-engine-base
    (cd $dir && PYTHONPATH=$dir $PY -m bench.decode --lengths 32 128 --rounds 2 --json $OUT/decode_${tree}_${round}.json > $OUT/decode_${tree}_${round}.log 2>&1)
    echo "$(date +%T) decode $tree $round $(uptime | sed 's/.*load/load/')" >> $OUT/ab.log
  done
  for tree in engine base; do
    dir=/work/wt-engine; [ $tree = base ] && dir=/work/wt-engine-base
    (cd $dir && PYTHONPATH=$dir $PY -m bench.hf_generate --rounds 1 --json $OUT/hf_generate_${tree}_${round}.json > $OUT/hf_generate_${tree}_${round}.log 2>&1)
    echo "$(date +%T) hf_generate $tree $round $(uptime | sed 's/.*load/load/')" >> $OUT/ab.log
  done
done
echo done >> $OUT/ab.log

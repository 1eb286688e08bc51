#!/bin/bash
# swap.sh SRC_PASS_DIR DEST_DIR FACTOR: rescore a pass's multi-process runs with its profile's host_cold_factor set to FACTOR
src=$1; dst=$2; f=$3
mkdir -p $dst
python3 -c "
import json,sys; p=json.load(open('$src/profile-cpu.json')); p['host_cold_factor']=float('$f'); json.dump(p,open('$dst/profile-cpu.json','w'),indent=1)"
for r in ${RUNS:-$src/heldout-nproc*}; do
  [ -d "$r" ] || continue
  python -m earl.cli validate --rescore $r --hardware $dst/profile-cpu.json --out $dst/$(basename $r) > $dst/$(basename $r).log 2>&1 || echo "fail $r"
done

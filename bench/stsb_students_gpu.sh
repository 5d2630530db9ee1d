#!/usr/bin/env bash
# STS-B transformer students on one GPU, in one run (docs/distillation.md "Transformer
# students"): the distill/stsb-students.yaml plan (the MiniLM-L6 cross-encoder teacher;
# students of its first 2 and 3 layers on the train pairs and their AugSBERT recombinations;
# the match_ngram baseline), the chosen student's seeds 2 and 3 (bench/distill_seeds.py) and
# every student's int8 export and n-gram cascade (bench/student_cascades.py).
#
#   bash bench/stsb_students_gpu.sh [plan key=value ...]
#
# Extra arguments are the plan's overrides (e.g. raw=/tmp/stsb-small for a smoke run).
# PYTHON (default python) runs every step; THREADS (default 8): onnxruntime's. After the
# grid, seeds 2 and 3 train at once (two processes on the one GPU: each alone leaves it
# mostly idle, its batches of 32 short pairs are bound by Python) while the seed-1 exports
# and cascades run on the CPU; then the seeds are scored together and their cascades built.
set -euo pipefail
PY=${PYTHON:-python}
THREADS=${THREADS:-8}
PLAN=distill/stsb-students.yaml
stamp() { echo "[stsb_students $(date +%H:%M:%S)] $*" >&2; }
plan() { $PY -c "import sys; from xdpx.distill.plan import load_plan; print(getattr(load_plan('$PLAN', sys.argv[2:]), sys.argv[1]))" "$@"; }
RAW=$(plan raw "$@")
C=$(plan configs_dir "$@")
R=$(plan report_dir "$@")
if [ ! -f "$RAW/train.tsv" ]; then
  stamp "materialize stsb -> $RAW"
  $PY -c "from studies.corpora import materialize; materialize('stsb', '$RAW')"
fi
$PY -m stages.distill configs --params "$PLAN" "$@"
for step in teacher transfer label students decide; do
  stamp "$step"
  $PY -m stages.distill "$step" "$C"
done
stamp "seeds 2 and 3 (GPU) beside the seed-1 exports and cascades (CPU)"
$PY bench/distill_seeds.py --configs "$C" --report "$R" --seeds 2 --json "$R/seeds-2.json" > "$R/seeds-2.log" 2>&1 &
S2=$!
$PY bench/distill_seeds.py --configs "$C" --report "$R" --seeds 3 --json "$R/seeds-3.json" > "$R/seeds-3.log" 2>&1 &
S3=$!
$PY bench/student_cascades.py --configs "$C" --report "$R" --threads "$THREADS" --json "$R/cascades-seed1.json"
wait $S2 || { stamp "seed 2 failed: $R/seeds-2.log"; exit 1; }
wait $S3 || { stamp "seed 3 failed: $R/seeds-3.log"; exit 1; }
stamp "seeds 1-3 scored together"
$PY bench/distill_seeds.py --configs "$C" --report "$R" --seeds 2 3 --json "$R/seeds.json"
stamp "exports and cascades of the seeds"
$PY bench/student_cascades.py --configs "$C" --report "$R" --threads "$THREADS"
stamp "done"

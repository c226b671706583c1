#!/usr/bin/env bash
# One 600 s call on a two-GPU machine (device kind nvidia-h200-x2): tensor parallel TP=2.
#   1. fuzz: `dynspec:random` switching every step at C=8 and C=64 (>= 2,000 decode steps each)
#      beside `off` and `on`, outputs compared with `off`;
#   2. sweep: `dynspec:goodput` beside `off` and `on`.
# DYNSPEC_TRACE=1: each dynspec server writes the plugin's decision trace per scheduler process
# (= per TP rank); run_sweep.sh then adds the ranks' step-by-step agreement to the result JSON
# (`tp_rank_agreement`, from benchmarks.dynspec_bench.rank_traces); the traces are in the logs.
#
# Usage, from the repository root (carry .gpu-bundle and dist):
#   bash benchmarks/device/run_tp2.sh
# Env knobs: DYNSPEC_TP2_END_S (default 560: no sweep level starts after it), DYNSPEC_TP2_C
# (sweep levels, default 1,8,64,128), DYNSPEC_TP2_FUZZ_S (max seconds per fuzz level, default 75).
set -uo pipefail
T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
END_S=${DYNSPEC_TP2_END_S:-560}
TP="--tp 2"

n=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$n" -lt 2 ]; then echo "run_tp2.sh: needs 2 GPUs, torch sees $n" >&2; exit 2; fi

DYNSPEC_TRACE=1 DYNSPEC_NAME=tp2-fuzz-0512 DYNSPEC_BUDGET_S=300 bash benchmarks/device/run_sweep.sh fuzz -C 8,64 \
  --policy random --policy-args '{"seed":0}' --min-decode-steps 2000 \
  --max-seconds-per-c "${DYNSPEC_TP2_FUZZ_S:-75}" --extra-flags "$TP"

LEFT=$(( END_S - ($(date +%s) - T0) ))
DYNSPEC_TRACE=1 DYNSPEC_NAME=tp2-sweep-0512 DYNSPEC_BUDGET_S=$LEFT bash benchmarks/device/run_sweep.sh sweep \
  --modes off,on,dynspec:goodput -C "${DYNSPEC_TP2_C:-1,8,64,128}" --output-len 128 --extra-flags "$TP"
echo "[run_tp2] total $(( $(date +%s) - T0 ))s"

#!/usr/bin/env bash
# One 600 s call on a two-GPU machine (device kind nvidia-h200-x2): two run_pair.sh pipelines side
# by side, one per GPU, each building its own pair (weights cannot be shared between GPUs quickly
# enough) and measuring off / on / dynspec:goodput on it, with decision traces on:
#   GPU 0, row 1:    closed loop at C = 1,2,5,10,30,70,100,250, 256 in / 128 out, greedy, 8×C requests
#                    (at most 600) per level, greedy outputs compared with `off`, accept pass of `on`.
#   GPU 1, rows 3+4: one start wave; (3) closed loop at C = 1,10,100 with each request's output length
#                    drawn from [32, 512] (seeded, the same for every mode), temperature 0.7, 8×C requests
#                    (at most 400: see the budget below); (4) then an open-loop trace, same lengths and
#                    temperature: 3 cycles of LOW (2 requests/s, ~2 in flight) and HIGH (25 requests/s,
#                    >= 30 in flight) phases of 8 s, shortened to fit the deadline (never below 5 s per
#                    phase; skipped, and recorded, when even that does not fit: row 3 comes first).
# Both measure level-major (every mode at one C before the next), so a deadline cuts the highest C
# of all modes rather than dynspec's last levels.
#
# Usage, from the repository root (carry .gpu-bundle and dist):
#   bash benchmarks/device/run_pair_x2.sh
# Files left in $OUT (7 of the 8 that come back):
#   <prefix>-g0-row1.{json,png}, <prefix>-g0-row1-logs.tar.xz, the same for <prefix>-g1-rows34,
#   <prefix>-summary.md (the table printed at the end). Each logs tarball holds the server logs,
#   the harness output (driver.log), the decision traces (trace/), phase times, the pair build log
#   (pair-build.log), its manifest (pair.json) and this pipeline's console (<name>.console).
#
# Budget (s from the start; pair runs of 0512 in benchmarks/results and shared/data): pair build
# 225-240 (prompts at ~20-40, target out ~175 when `off` starts, draft ~245); speculative servers ready
# ~290-330 (44-90 s starts, three per GPU); pack and stop ~15-20 after the deadline. GPU 0: accept pass
# 15 + levels ≈ 45 (off) + 60 (on) + 80 (goodput) → ends ≈ 500-530. GPU 1: C=1 ≈ 25, C=10 ≈ 35,
# C=100 ≈ 60 with 400 requests (≈ 85 with 600, ≈ 110 with 800) for the three modes → the trace gets
# ≈ 100-150 s, i.e. 3 × (6 phases × 5-7 s + 10); 8×C uncapped at C=100 would leave it too little.
#
# Env knobs (defaults in brackets):
#   DYNSPEC_X2_END_S      deadline, s after start: no level or trace that would not end by then starts [570]
#   DYNSPEC_X2_PREFIX     result file prefix [pairx2]
#   DYNSPEC_X2_PAIR_ROOT  folder of the two pairs (pair-g0, pair-g1) [/tmp]
#   DYNSPEC_X2_GPUS       the two CUDA devices [0 1];  DYNSPEC_X2_PORTS  their harness base ports [30000 32000]
#   DYNSPEC_X2_ROW1_C     row 1 levels [1,2,5,10,30,70,100,250]
#   DYNSPEC_X2_ROW3_C     row 3 levels [1,10,100];  DYNSPEC_X2_ROW3_MAX_REQ  requests per level at most [400]
#   DYNSPEC_X2_LEN_RANGE  rows 3+4 output lengths [32,512];  DYNSPEC_X2_TEMP  their temperature [0.7]
#   DYNSPEC_X2_TRACE      row 4: low_rate,high_rate,phase_s,cycles [2,25,8,3]; `none`: no trace
#   DYNSPEC_X2_ARGS, DYNSPEC_X2_G0_ARGS, DYNSPEC_X2_G1_ARGS  extra harness arguments (word-split): both / one
#   DYNSPEC_X2_NEED_GPUS  GPUs torch must see [2] (0 for a CPU dry run with fake servers)
#   DYNSPEC_PAIR_*, DYNSPEC_SITE, DYNSPEC_BUNDLE, OUT as in run_pair.sh / run_sweep.sh
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
OUT=${OUT:-$REPO/benchmarks/results/device-out}
P=${DYNSPEC_X2_PREFIX:-pairx2}
ROOT=${DYNSPEC_X2_PAIR_ROOT:-/tmp}
read -r GPU0 GPU1 <<<"${DYNSPEC_X2_GPUS:-0 1}"
read -r PORT0 PORT1 <<<"${DYNSPEC_X2_PORTS:-30000 32000}"
N0=$P-g0-row1
N1=$P-g1-rows34
mkdir -p "$OUT"
note() { echo "[run_pair_x2 +$(( $(date +%s) - T0 ))s] $*"; }

need=${DYNSPEC_X2_NEED_GPUS:-2}
if [ "$need" -gt 0 ]; then
  n=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$n" -lt "$need" ]; then echo "run_pair_x2.sh: needs $need GPUs, torch sees $n" >&2; exit 2; fi
fi

export DYNSPEC_TRACE=${DYNSPEC_TRACE:-1} DYNSPEC_PAIR_END_S=${DYNSPEC_X2_END_S:-570} DYNSPEC_PAIR_SIDE=logs
export OUT

# One pipeline: run_pair.sh on one GPU, its console prefixed on ours and kept for its logs tarball.
pipeline() {
  local gpu=$1 name=$2
  shift 2
  local console=/tmp/$name.console
  ( CUDA_VISIBLE_DEVICES=$gpu DYNSPEC_PAIR_NAME=$name DYNSPEC_PAIR_DIR=$ROOT/pair-g$gpu \
      DYNSPEC_PACK_FILES=$console bash "$REPO/benchmarks/device/run_pair.sh" "$@" 2>&1
    echo "exit $?" > "/tmp/$name.rc"
  ) | tee "$console" | sed -u "s/^/[g$gpu] /"
}

rm -f "/tmp/$N0.rc" "/tmp/$N1.rc"
note "GPU $GPU0: row 1 ($N0); GPU $GPU1: rows 3 and 4 ($N1); deadline +${DYNSPEC_PAIR_END_S}s"
# shellcheck disable=SC2086  # the *_ARGS knobs are word-split on purpose
DYNSPEC_PAIR_C=${DYNSPEC_X2_ROW1_C:-1,2,5,10,30,70,100,250} DYNSPEC_PAIR_ACCEPT_MODES= \
  DYNSPEC_PAIR_ACCEPT_T=0,0.7 DYNSPEC_PAIR_MAX_REQ=600 \
  pipeline "$GPU0" "$N0" --base-port "$PORT0" --level-order level \
  ${DYNSPEC_X2_ARGS:-} ${DYNSPEC_X2_G0_ARGS:-} &
PID0=$!
TRACE=${DYNSPEC_X2_TRACE:-2,25,8,3}
TRACE_ARGS="--add-trace $TRACE"
[ "$TRACE" = none ] && TRACE_ARGS=""
# shellcheck disable=SC2086
DYNSPEC_PAIR_C=${DYNSPEC_X2_ROW3_C:-1,10,100} DYNSPEC_PAIR_ACCEPT_MODES= DYNSPEC_PAIR_ACCEPT_T= \
  DYNSPEC_PAIR_MAX_REQ=${DYNSPEC_X2_ROW3_MAX_REQ:-400} \
  pipeline "$GPU1" "$N1" --base-port "$PORT1" --level-order level \
  --output-len-range "${DYNSPEC_X2_LEN_RANGE:-32,512}" --temperature "${DYNSPEC_X2_TEMP:-0.7}" \
  $TRACE_ARGS ${DYNSPEC_X2_ARGS:-} ${DYNSPEC_X2_G1_ARGS:-} &
PID1=$!
wait "$PID0"
wait "$PID1"
RC0=$(cat "/tmp/$N0.rc" 2>/dev/null || echo "exit ?")
RC1=$(cat "/tmp/$N1.rc" 2>/dev/null || echo "exit ?")
note "GPU $GPU0 pipeline: $RC0; GPU $GPU1 pipeline: $RC1"

python3 "$REPO/benchmarks/report.py" --short "$OUT/$N0.json" "$OUT/$N1.json" | tee "$OUT/$P-summary.md"
nfiles=$(find "$OUT" -type f | wc -l)
[ "$nfiles" -le 8 ] || note "WARNING: $nfiles files in $OUT; only 8 come back"
ls -la "$OUT"
note "done, total $(( $(date +%s) - T0 ))s"
[ "$RC0" = "exit 0" ] && [ "$RC1" = "exit 0" ]

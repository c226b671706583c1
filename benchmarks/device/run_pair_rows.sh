#!/usr/bin/env bash
# One 600 s call on ONE H200 (device kind nvidia-h200), planned as three calls back to back, each a
# run_pair.sh pipeline (off / on / dynspec:goodput on the trained pair, decision traces on, level-major
# order: a deadline cuts the highest C of every mode, not dynspec's last levels). The pair lives in the
# repository's ignored .pair/ with DYNSPEC_PAIR_REUSE=1: a warm machine keeps ignored files when the
# next call starts within ~30 s, so only the first call pays the ~230 s build; a cold one rebuilds.
#   row1    closed loop at C = 1,2,5,10,30,70,100,250, 256 in / 128 out, greedy, max(32, 8×C) requests
#           (at most 2000), greedy outputs compared with `off`, accept pass of `on` at t=0 (the pass goes to
#           static `on` modes only: the dynspec server never serves it, so its cost tables start clean).
#   rows34  (3) closed loop at C = 1,10,100, output lengths uniform 32..512 (seeded, the same for every
#           mode), temperature 0.7, 8×C requests (at most 800); (4) then the open-loop trace, greedy, lengths
#           32..256: 3 cycles of LOW 1 req/s and HIGH 40 req/s, 10 s phases (shrunk to fit the deadline, not
#           below 6 s; skipped, and recorded, when even that does not fit: row 3 comes first).
#   row2    SGLang 0.5.15 (its own bundle and unpack, not a warm machine's 0.5.12): if asked
#           (DYNSPEC_ROWS2_PYTEST_ARGS, off by default: see below), the GPU tests (tests/gpu via
#           run_sweep.sh pytest) first, beside the pair build when there is no pair to reuse;
#           the sweep's servers start after both (beside the tests' servers they would not fit in GPU memory,
#           and the tests would disturb the timings), then off / on@topk4 / dynspec:goodput@topk4 (topk 4, 2 steps,
#           16 draft tokens) at C = 1,5,30,100,250, greedy, 128 tokens, accept pass of on@topk4 at t=0.
#
# Usage, from the repository root; carry .gpu-bundle and dist (row2: .gpu-bundle-0.5.15 and dist; never .pair):
#   bash benchmarks/device/run_pair_rows.sh row1|rows34|row2
# Files left in $OUT (row1, rows34: 4; row2: 6 of the 8 that come back): <prefix>-<row>.{json,png},
# <prefix>-<row>-logs.tar.xz (server logs, driver.log, traces, phases, pair-build.log, pair.json,
# <prefix>-<row>.console), <prefix>-<row>-summary.md (the report.py --short table printed at the end);
# row2 also <prefix>-row2-gpu-tests-logs.tar.xz (pytest.txt, junit.xml, the tests' server logs) and
# <prefix>-row2-gpu-tests.txt (pytest's short summary).
#
# Time (s from start; pairx2c-*-logs.tar.xz: build 228 s, three servers ready at ~277 (~80 s after their
# weights), row-1 levels 45 + 55 + 68 s with 8×C requests; pairx2-g1: row-3 levels 53 + 61 + 63 s with 400
# requests at C=100; gpu-tests-0512: a test's first server ~80 s, each further one ~60 s):
#   row1   cold (builds): servers ~280, accept 5, levels ~195 (32 requests at C=1,2 add ~25 s) → ~480,
#          + stop/pack ~15 → ~495.  Warm (pair reused): servers ~85 → ~300.
#   rows34 warm: servers ~85, row 3 ~180 → ~265, trace 3 modes × (6 × 10 s + ~6) → ~465, + 15 → ~480.
#          Cold: row 3 ends ~460; the trace (>= 3 × (36 + 10) s) no longer fits and is skipped → ~475.
#   row2   warm: unpack ~5, tests ~240 (-n 3: e2e beside the topk1 and topk4 spec_v2 tests, 2-3 servers
#          in a row each; bounded at 330), sweep servers ~85-100 (topk 4 graphs to bs 256) → ~335, accept 6,
#          levels ~180 → ~520, + 15 → ~535; tests that run to 330 leave the levels ~120 s (C=250, maybe
#          C=100 cut). Cold: the build (~230-260 s, slowed by the tests' servers; time-budgeted, so
#          that pair trains fewer steps than row 1's) ends before the tests → about the same.
#   Calls return by ~560 s at worst (harness deadline 540 + stop/pack); with 30-60 s of machine start and
#   transfers each, the three take ~26-28 of the 30 device-minutes.
#
# Env knobs (defaults in brackets; run_pair.sh's DYNSPEC_PAIR_* also apply unless set here):
# Requests per level: 8×C (at least the MIN_REQ), the caps no lower than 8 × the largest default C: with
# 600 at C=250 a level was 2.4 lockstep cohorts, and one refill stall moved it by several % (pair1h-*).
# 8×C at C=250 is ~35 s per mode on the pair: row 1's eight levels no longer fit one call with the
# build; split them (DYNSPEC_ROWS1_C), as pair1i-row1 + pair1i-hi-row1 did.  SGLang's default piecewise
# CUDA graphs are on by default here (DYNSPEC_ROWS_ARGS unset: --piecewise-cuda-graph, as in every row run since
# pair1i; ~18 s more per server start): pair2a-rows34 ran without them by omission, and its eager prefills
# (18-20 ms per admitted request) overloaded every mode's high phases. DYNSPEC_ROWS_ARGS= (empty) runs without.
#   DYNSPEC_ROWS_END_S    the call's wall-time target: the harness deadline is this less DYNSPEC_ROWS_PACK_S [560]
#   DYNSPEC_ROWS_PACK_S   seconds kept for stopping servers, packing and the report [20]
#   DYNSPEC_ROWS_PREFIX   result names <prefix>-row1 / -rows34 / -row2 [pair1g]
#   DYNSPEC_ROWS_PORT     harness base port [30000];  DYNSPEC_ROWS_ARGS  extra harness arguments (word-split) [--piecewise-cuda-graph]
#   DYNSPEC_ROWS_MODES    swept modes [off,on,dynspec:goodput; row2: off,on@topk4,dynspec:goodput@topk4]
#   DYNSPEC_ROWS_NEED_GPUS GPUs torch must see [1] (0 for a CPU dry run with fake servers)
#   DYNSPEC_ROWS_GIB_PER_SERVER GPU memory one server of the pair takes [27]: fewer GiB than modes x this on
#                         GPU 0 refuses the call at once (an H100's 79 GiB holds two, an H200's 139 five)
#   DYNSPEC_PAIR_DIR      the pair [<repo>/.pair/pair];  DYNSPEC_PAIR_REUSE [1]
#   row1:   DYNSPEC_ROWS1_C [1,2,5,10,30,70,100,250], DYNSPEC_ROWS1_MIN_REQ [32], DYNSPEC_ROWS1_MAX_REQ [2000],
#           DYNSPEC_ROWS1_ACCEPT_T accept-pass temperatures of `on` [0] (empty: no pass)
#   rows34: DYNSPEC_ROWS3_C [1,10,100], DYNSPEC_ROWS3_LEN_RANGE [32,512], DYNSPEC_ROWS3_TEMP [0.7],
#           DYNSPEC_ROWS3_MIN_REQ [8], DYNSPEC_ROWS3_MAX_REQ [800];
#           DYNSPEC_ROWS4_TRACE low,high,phase_s,cycles [1,40,10,3] (`none`: no trace; on the H200 pair only
#           1 / 40 gave every high phase an `off` lead of >= 1.3x: pair1p/pair1q-rows34; 16-30 req/s did not),
#           DYNSPEC_ROWS4_MIN_PHASE_S [6],
#           DYNSPEC_ROWS4_TEMP [0], DYNSPEC_ROWS4_LEN_RANGE [32,256]
#   row2:   DYNSPEC_ROWS2_C [1,5,30,100,250], DYNSPEC_ROWS2_MIN_REQ [32], DYNSPEC_ROWS2_MAX_REQ [2000],
#           DYNSPEC_ROWS2_ACCEPT_T [0], DYNSPEC_ROWS2_TESTS_END_S tests end by then (pytest --timeout) [330],
#           DYNSPEC_ROWS2_PYTEST_ARGS pytest arguments of the GPU tests [none: no tests]. On the H200
#           (2026-12-01) `-n 3` failed: the three tests' servers did not fit in GPU memory together
#           (OOM at start, pair1g-row2-gpu-tests.txt); one after the other they took 561 s on a fresh
#           machine (gputests-0512-head.txt), more than a call holds beside the sweep: run them alone;
#           DYNSPEC_ROWS2_TESTS_BESIDE_GIB [100]: on a smaller GPU the tests wait for the pair build (an H100's
#           79 GiB did not hold a test server beside it, pair2h-row2; `-k topk4` alone, after a pair2i-row2 call,
#           was still running at 380 s on a warm H100 and was killed there), and with fewer than
#           DYNSPEC_ROWS2_TESTS_MIN_S [150] left to DYNSPEC_ROWS2_TESTS_END_S then (a cold call) they are not run; DYNSPEC_BUNDLE [.gpu-bundle-0.5.15],
#           DYNSPEC_SITE [/tmp/site-0.5.15]
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
ROW=${1:-}
shift || true
case "$ROW" in
  row1|rows34|row2) ;;
  *) echo "run_pair_rows.sh: first argument must be row1|rows34|row2, got '$ROW'" >&2; exit 2 ;;
esac
OUT=${OUT:-$REPO/benchmarks/results/device-out}
P=${DYNSPEC_ROWS_PREFIX:-pair1g}
NAME=$P-$ROW
END=${DYNSPEC_ROWS_END_S:-560}
PACK_S=${DYNSPEC_ROWS_PACK_S:-20}
mkdir -p "$OUT"
note() { echo "[run_pair_rows +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( END - PACK_S - ($(date +%s) - T0) )); }

# GiB of GPU 0 (0 where torch sees none).
gpu0_gib() { python3 -c 'import torch; print(int(torch.cuda.get_device_properties(0).total_memory / 2**30))' 2>/dev/null || echo 0; }

need=${DYNSPEC_ROWS_NEED_GPUS:-1}
if [ "$need" -gt 0 ]; then
  n=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$n" -lt "$need" ]; then echo "run_pair_rows.sh: needs $need GPU(s), torch sees $n" >&2; exit 2; fi
  # The servers of a row run side by side on GPU 0. On an H100 (79 GiB) three pair servers with piecewise
  # graphs took 24-28 GiB each and `on` died of OOM mid-run (pair2b-rows34): refuse at once instead.
  if [ "$ROW" = row2 ]; then modes=${DYNSPEC_ROWS_MODES:-off,on@topk4,dynspec:goodput@topk4}
  else modes=${DYNSPEC_ROWS_MODES:-off,on,dynspec:goodput}; fi
  nmodes=$(awk -F, '{ print NF }' <<<"$modes")
  per=${DYNSPEC_ROWS_GIB_PER_SERVER:-27}
  gib=$(gpu0_gib)
  if [ "$gib" -lt $(( nmodes * per )) ]; then
    echo "run_pair_rows.sh: $nmodes servers (DYNSPEC_ROWS_MODES=$modes) need ~$(( nmodes * per )) GiB" \
         "(DYNSPEC_ROWS_GIB_PER_SERVER=$per), GPU 0 has $gib GiB: run fewer modes per call" >&2
    exit 2
  fi
fi

export OUT DYNSPEC_TRACE=${DYNSPEC_TRACE:-1} DYNSPEC_PAIR_SIDE=logs DYNSPEC_PAIR_REUSE=${DYNSPEC_PAIR_REUSE:-1}
export DYNSPEC_PAIR_DIR=${DYNSPEC_PAIR_DIR:-$REPO/.pair/pair}
if [ "$ROW" = row2 ]; then
  # Absolute: run_sweep.sh names its JIT cache after the bundle folder.
  export DYNSPEC_BUNDLE=${DYNSPEC_BUNDLE:-$REPO/.gpu-bundle-0.5.15} DYNSPEC_SITE=${DYNSPEC_SITE:-/tmp/site-0.5.15}
fi

# run_pair.sh with this call's name, port and deadline; its console is kept for the logs tarball.
sweep() {
  local console=/tmp/$NAME.console
  # shellcheck disable=SC2086  # DYNSPEC_ROWS_ARGS is word-split on purpose
  DYNSPEC_PAIR_NAME=$NAME DYNSPEC_PAIR_END_S=$(left) DYNSPEC_PACK_FILES="${DYNSPEC_PACK_FILES:-} $console" \
    bash "$REPO/benchmarks/device/run_pair.sh" --base-port "${DYNSPEC_ROWS_PORT:-30000}" --level-order level \
    "$@" ${DYNSPEC_ROWS_ARGS---piecewise-cuda-graph} 2>&1 | tee "$console"
  return "${PIPESTATUS[0]}"
}

tests_left() { echo $(( ${DYNSPEC_ROWS2_TESTS_END_S:-330} - ($(date +%s) - T0) )); }

# row2's GPU tests through run_sweep.sh pytest (same SGLang + wheel setup; report in its logs tarball),
# bounded by pytest-timeout so that they end by DYNSPEC_ROWS2_TESTS_END_S and the sweep keeps the rest.
gpu_tests() {
  local name=$P-row2-gpu-tests budget args
  budget=$(tests_left)
  [ "$budget" -ge 60 ] || budget=60
  local per_test=$budget
  read -r -a args <<<"${DYNSPEC_ROWS2_PYTEST_ARGS}"
  if [ "${#args[@]}" -gt 0 ] && [ "${args[0]}" = -n ] && ! python3 -c 'import xdist' 2>/dev/null; then
    # --timeout is per test: one after the other, the three GPU tests share the budget.
    per_test=$(( budget / 3 )); args=("${args[@]:2}")
    note "WARNING: no pytest-xdist here: the GPU tests run one after the other, ${per_test}s each at most"
  fi
  if python3 -c 'import pytest_timeout' 2>/dev/null; then
    args+=(--timeout "$per_test")
    # pytest-timeout >= 2.3 also bounds the whole session (per xdist worker).
    # (grep reads it all: with -q it would stop early and pipefail would see pytest's SIGPIPE.)
    python3 -m pytest --help 2>/dev/null | grep -- --session-timeout >/dev/null && args+=(--session-timeout "$budget")
  else
    note "WARNING: no pytest-timeout here: the GPU tests are not bounded by the deadline"
  fi
  note "GPU tests: pytest ${args[*]} (to end within ${budget}s)"
  DYNSPEC_TRACE=0 DYNSPEC_NAME=$name DYNSPEC_PACK_FILES= bash "$REPO/benchmarks/device/run_sweep.sh" pytest \
    "${args[@]}" > "/tmp/$name.console" 2>&1
  local rc=$?
  sed -n '/short test summary info/,$p' "/tmp/dynspec-logs-$name/pytest.txt" > "$OUT/$name.txt" 2>/dev/null
  [ -s "$OUT/$name.txt" ] || tail -30 "/tmp/$name.console" > "$OUT/$name.txt"
  note "GPU tests exit $rc: $(tail -1 "$OUT/$name.txt")"
  return $rc
}

RC=0
case "$ROW" in
  row1)
    DYNSPEC_PAIR_MODES=${DYNSPEC_ROWS_MODES:-off,on,dynspec:goodput} DYNSPEC_PAIR_C=${DYNSPEC_ROWS1_C:-1,2,5,10,30,70,100,250} \
      DYNSPEC_PAIR_MAX_REQ=${DYNSPEC_ROWS1_MAX_REQ:-2000} DYNSPEC_PAIR_ACCEPT_MODES= DYNSPEC_PAIR_ACCEPT_T=${DYNSPEC_ROWS1_ACCEPT_T-0} \
      sweep --min-requests "${DYNSPEC_ROWS1_MIN_REQ:-32}"
    RC=$? ;;
  rows34)
    TRACE=${DYNSPEC_ROWS4_TRACE:-1,40,10,3}
    # The plan refuses a minimum above the phase (the harness would stop before any level): cap it.
    MIN_PHASE=$(awk -v m="${DYNSPEC_ROWS4_MIN_PHASE_S:-6}" -v p="$(cut -d, -f3 <<<"$TRACE")" \
      'BEGIN { print (p != "" && p + 0 < m + 0) ? p : m }')
    TRACE_ARGS=(--add-trace "$TRACE" --add-trace-min-phase-s "$MIN_PHASE"
                --add-trace-temperature "${DYNSPEC_ROWS4_TEMP:-0}" --add-trace-output-len-range "${DYNSPEC_ROWS4_LEN_RANGE:-32,256}")
    [ "$TRACE" = none ] && TRACE_ARGS=()
    DYNSPEC_PAIR_MODES=${DYNSPEC_ROWS_MODES:-off,on,dynspec:goodput} DYNSPEC_PAIR_C=${DYNSPEC_ROWS3_C:-1,10,100} \
      DYNSPEC_PAIR_MAX_REQ=${DYNSPEC_ROWS3_MAX_REQ:-800} DYNSPEC_PAIR_ACCEPT_MODES= DYNSPEC_PAIR_ACCEPT_T= \
      sweep --output-len-range "${DYNSPEC_ROWS3_LEN_RANGE:-32,512}" --temperature "${DYNSPEC_ROWS3_TEMP:-0.7}" \
      --min-requests "${DYNSPEC_ROWS3_MIN_REQ:-8}" "${TRACE_ARGS[@]}"
    RC=$? ;;
  row2)
    TRC=skipped
    if [ "${DYNSPEC_ROWS2_PYTEST_ARGS:-none}" != none ]; then
      # The pair build holds ~41 GiB while it trains the draft: beside it, the tests' first server died
      # of OOM at start on an H100 (pair2h-row2). Below DYNSPEC_ROWS2_TESTS_BESIDE_GIB the tests follow the build.
      gib=$(gpu0_gib) beside=0
      if [ "$gib" -ge "${DYNSPEC_ROWS2_TESTS_BESIDE_GIB:-100}" ]; then beside=1; gpu_tests & TPID=$!
      else note "GPU 0 has $gib GiB: the GPU tests run after the pair is there, not beside its build"; fi
      # Returns at once when the pair is there to reuse; else builds it.
      DYNSPEC_PAIR_BUILD_ONLY=1 DYNSPEC_PAIR_NAME=$NAME bash "$REPO/benchmarks/device/run_pair.sh" 2>&1 | sed -u 's/^/[pair] /'
      BRC=${PIPESTATUS[0]}
      if [ "$beside" = 1 ]; then wait "$TPID"; TRC=$?
      elif [ "$(tests_left)" -ge "${DYNSPEC_ROWS2_TESTS_MIN_S:-150}" ]; then gpu_tests; TRC=$?
      else
        # Three servers one after the other need ~250 s: a run cut short would only report a timeout.
        echo "GPU tests not run: $(tests_left)s left to DYNSPEC_ROWS2_TESTS_END_S after the pair build," \
             "under DYNSPEC_ROWS2_TESTS_MIN_S=${DYNSPEC_ROWS2_TESTS_MIN_S:-150}; run them in a call of their own" \
          | tee "$OUT/$P-row2-gpu-tests.txt"
      fi
      note "pair: exit $BRC; GPU tests: exit $TRC; sweep with $(left)s to its deadline"
    fi
    if [ "${BRC:-0}" -ne 0 ]; then
      RC=3; note "no pair: no sweep (run_pair.sh would only build it again, past the deadline)"
    else
      DYNSPEC_PAIR_MODES=${DYNSPEC_ROWS_MODES:-off,on@topk4,dynspec:goodput@topk4} DYNSPEC_PAIR_C=${DYNSPEC_ROWS2_C:-1,5,30,100,250} \
        DYNSPEC_PAIR_MAX_REQ=${DYNSPEC_ROWS2_MAX_REQ:-2000} DYNSPEC_PAIR_ACCEPT_MODES= DYNSPEC_PAIR_ACCEPT_T=${DYNSPEC_ROWS2_ACCEPT_T-0} \
        sweep --min-requests "${DYNSPEC_ROWS2_MIN_REQ:-32}"
      RC=$?
    fi
    # The sweep's status first; a clean sweep after failed tests still says so (4).
    if [ "$RC" -eq 0 ] && [ "$TRC" != skipped ] && [ "$TRC" -ne 0 ]; then RC=4; fi ;;
esac

{ python3 "$REPO/benchmarks/report.py" --short "$OUT/$NAME.json"
  [ "$ROW" = row2 ] && [ -f "$OUT/$P-row2-gpu-tests.txt" ] && { echo "### GPU tests (SGLang 0.5.15)"; cat "$OUT/$P-row2-gpu-tests.txt"; }
} | tee "$OUT/$NAME-summary.md"
nfiles=$(find "$OUT" -type f | wc -l)
[ "$nfiles" -le 8 ] || note "WARNING: $nfiles files in $OUT; only 8 come back"
ls -la "$OUT"
note "done ($ROW, exit $RC), total $(( $(date +%s) - T0 ))s"
exit "$RC"

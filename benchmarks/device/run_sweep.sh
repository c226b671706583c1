#!/usr/bin/env bash
# Device driver for the GPU machine: unpack the SGLang bundle, install our wheel, run one harness
# command, leave results + compressed server logs in $OUT (≤ 8 files come back), print a table.
#
# Usage, from the repository root, after `python3 benchmarks/device/prepare.py` (wheel in dist/,
# bundle and size checks):
#   bash benchmarks/device/run_sweep.sh [sweep|trace|fuzz|offstep|pytest] [args...]
# With no arguments: `sweep --preset first-h200`.  `pytest` runs the GPU tests (tests/gpu, args go to
# pytest) with the same SGLang + wheel setup; its report and logs come back in <name>-logs.tar.xz.
# Several invocations may run at once on one machine (say, one per GPU with CUDA_VISIBLE_DEVICES and
# distinct --base-port): scratch paths are per DYNSPEC_NAME and the bundle unpacks once, under a lock.
# Env knobs:
#   DYNSPEC_BUNDLE     bundle dir (default .gpu-bundle)
#   DYNSPEC_BUDGET_S   seconds after this script starts when no new wave/level starts (default 510;
#                      the device tool kills at 600 s, and stopping + packing needs ~30 s)
#   DYNSPEC_NAME       result file stem (default: the subcommand)
#   DYNSPEC_GIT_COMMIT commit id for the record (else dist/GIT_COMMIT, else none: no .git there)
#   DYNSPEC_TRACE      1: dynspec servers write the plugin's decision trace (per process) into the
#                      logs, and rank_traces adds the TP ranks' agreement to the result JSON
#   DYNSPEC_SITE       where site.tar.xz is unpacked (default /tmp/site; reused when present, so a
#                      second release on a warm machine needs its own, e.g. /tmp/site-0.5.15)
#   DYNSPEC_PACK_FILES files (space-separated paths) copied into the logs tarball when it is packed,
#                      e.g. a build log and manifest that would otherwise each take one of the 8 files
#   OUT                where results go (the device tool sets it)
set -uo pipefail

T0=$(date +%s.%N)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
BUNDLE=${DYNSPEC_BUNDLE:-$REPO/.gpu-bundle}
OUT=${OUT:-$REPO/benchmarks/results/device-out}
BUDGET=${DYNSPEC_BUDGET_S:-510}
SITE=${DYNSPEC_SITE:-/tmp/site}
CMD=${1:-sweep}
case "$CMD" in
  sweep|trace|fuzz|offstep|pytest) shift || true ;;
  -*) CMD=sweep ;;
  *) echo "run_sweep.sh: first argument must be sweep|trace|fuzz|offstep|pytest, got '$CMD'" >&2; exit 2 ;;
esac
ARGS=("$@")
if [ "$CMD" = sweep ] && [ ${#ARGS[@]} -eq 0 ]; then ARGS=(--preset first-h200); fi
NAME=${DYNSPEC_NAME:-$CMD}
# Per-run scratch (runs may share a machine); a warm machine may hold a previous run's.
LOGS=/tmp/dynspec-logs-$NAME
PHASES=/tmp/dynspec-phases-$NAME.txt
STATS=/tmp/dynspec-stats-$NAME
rm -rf "$LOGS" "$STATS"
mkdir -p "$OUT" "$LOGS"
: > "$PHASES"
if [ "${DYNSPEC_TRACE:-0}" = 1 ]; then export SGLANG_DYNSPEC_TRACE_FILE=$LOGS/trace/dyn.jsonl; fi
# The machine's image turns NVLink multicast off; keep it so for every server we start.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
  NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
note() { echo "[run_sweep +$(elapsed "$T0")s] $*"; }
record_phase() { echo "$1 $2" >> "$PHASES"; }

# ---- 1. SGLang bundle ---------------------------------------------------------------------
if [ ! -f "$BUNDLE/site.tar.xz" ]; then
  echo "run_sweep.sh: no $BUNDLE/site.tar.xz (carry .gpu-bundle with the call)" >&2; exit 2
fi
t=$(now)
# A JIT cache is only valid for the release it was built with: one folder per bundle.
JIT=/tmp/jitcache-$(basename "$BUNDLE")
(
  flock 9
  if [ ! -d "$SITE/sglang" ]; then
    rm -rf "$SITE" && mkdir -p "$SITE" && tar -C "$SITE" -xJf "$BUNDLE/site.tar.xz" || { echo "untar site failed" >&2; exit 2; }
  fi
  if [ -f "$BUNDLE/jitcache.tar.xz" ] && [ ! -d "$JIT/triton" ]; then
    mkdir -p "$JIT" && tar -C "$JIT" -xJf "$BUNDLE/jitcache.tar.xz"
  fi
) 9>"/tmp/.dynspec-unpack.lock" || exit 2
record_phase untar "$(elapsed "$t")"
export PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=$JIT/tvm-ffi TRITON_CACHE_DIR=$JIT/triton
SGLANG_VER=$(ls -d "$SITE"/sglang-*.dist-info 2>/dev/null | head -1 | sed -E 's/.*sglang-([^/]*)\.dist-info/\1/')
note "SGLang in bundle: ${SGLANG_VER:-unknown}"
PYPATH=$SITE
# From 0.5.13 the spec_v2 worker imports cutlass/deep_gemm; the bundle's stand-ins satisfy the imports.
if [ -d "$BUNDLE/import-standins" ] && python3 - "$SGLANG_VER" <<'PY'
import sys, re
v = tuple(int(x) for x in re.findall(r"\d+", sys.argv[1] or "0")[:3])
sys.exit(0 if v >= (0, 5, 13) else 1)
PY
then
  PYPATH=$BUNDLE/import-standins:$PYPATH
  note "import stand-ins first on PYTHONPATH"
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libnuma\.so\.1'; then
  export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "libnuma from the bundle"
fi

# ---- 2. our package ------------------------------------------------------------------------
t=$(now)
shopt -s nullglob
WHEELS=("$REPO"/dist/*.whl)
if [ ${#WHEELS[@]} -gt 0 ]; then
  PKG=/tmp/dynspec-$NAME
  rm -rf "$PKG" && mkdir -p "$PKG"
  if ! python3 -m pip install -q --no-deps --no-index --no-compile --target "$PKG" "${WHEELS[@]}"; then
    # No pip there: a wheel is a zip; unpacked into a path entry it imports and its entry points resolve.
    note "pip failed; unzipping wheels instead"
    for w in "${WHEELS[@]}"; do python3 -m zipfile -e "$w" "$PKG"; done
  fi
  PYPATH=$PKG:$PYPATH
  note "installed: $(cd "$REPO/dist" && ls *.whl | tr '\n' ' ')"
else
  note "WARNING: no dist/*.whl (python3 benchmarks/device/prepare.py builds it): dynspec modes will run without the plugin"
fi
record_phase install_dynspec "$(elapsed "$t")"
export PYTHONPATH=$PYPATH:$REPO
if [ -z "${DYNSPEC_GIT_COMMIT:-}" ] && [ -f "$REPO/dist/GIT_COMMIT" ]; then
  export DYNSPEC_GIT_COMMIT=$(tr -d ' \n' < "$REPO/dist/GIT_COMMIT")
fi
python3 - <<'PY' || true
from importlib.metadata import entry_points
try:
    import sglang_dynspec
    print("[run_sweep] sglang_dynspec", getattr(sglang_dynspec, "__version__", "?"), "from", sglang_dynspec.__file__)
except Exception as exc:  # report, do not stop: off/on modes still run
    print("[run_sweep] WARNING: import sglang_dynspec failed:", repr(exc))
print("[run_sweep] sglang.srt.plugins entry points:", [e.value for e in entry_points(group="sglang.srt.plugins")])
PY
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[run_sweep] gpu: /'

# ---- 3. the harness ------------------------------------------------------------------------
export DYNSPEC_PHASE_TIMES=$PHASES
export DYNSPEC_DEADLINE_EPOCH=$(awk -v a="$T0" -v b="$BUDGET" 'BEGIN { printf "%.3f", a + b }')
export DYNSPEC_COMMAND="bash benchmarks/device/run_sweep.sh $CMD ${ARGS[*]}"
note "harness: $CMD ${ARGS[*]} (deadline in ${BUDGET}s from start)"
t=$(now)
if [ "$CMD" = pytest ]; then
  # GPU tests: their servers' logs and result files go into the logs tarball.
  DYNSPEC_GPU_LOG_DIR=$LOGS DYNSPEC_GPU_OUT_DIR=$LOGS python3 -m pytest tests/gpu -m gpu -p no:cacheprovider \
    -rA --junitxml "$LOGS/junit.xml" "${ARGS[@]}" 2>&1 | tee "$LOGS/pytest.txt"
else
  python3 -m benchmarks.dynspec_bench "$CMD" "${ARGS[@]}" --name "$NAME" --out-dir "$OUT" --log-dir "$LOGS" \
    --stats-root "$STATS" 2>&1 | tee "$LOGS/driver.log"
fi
RC=${PIPESTATUS[0]}
note "harness exit $RC after $(elapsed "$t")s"
if [ -d "$LOGS/trace" ]; then
  python3 -m benchmarks.dynspec_bench.rank_traces "$LOGS/trace" --stats "$STATS" --into "$OUT/$NAME.json" || true
fi

# ---- 4. pack logs (one file: at most 8 come back) and summarise --------------------------------
cp "$PHASES" "$LOGS/phases.txt" 2>/dev/null
for f in ${DYNSPEC_PACK_FILES:-}; do cp "$f" "$LOGS/" 2>/dev/null || note "not packed (missing): $f"; done
cp -r "$STATS" "$LOGS/stats" 2>/dev/null
tar -C /tmp -cJf "$OUT/$NAME-logs.tar.xz" "$(basename "$LOGS")" 2>/dev/null && \
  note "logs: $(du -h "$OUT/$NAME-logs.tar.xz" | cut -f1)"
ls -la "$OUT"
[ -f "$OUT/$NAME.json" ] && { python3 "$REPO/benchmarks/report.py" "$OUT/$NAME.json" || true; }
note "done, total $(elapsed "$T0")s"
exit "$RC"

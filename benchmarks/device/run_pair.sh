#!/usr/bin/env bash
# One 600 s device call: build the realistic pair (trained target + EAGLE-3 draft, no downloads),
# then run the harness sweep `off` vs `on` on it through run_sweep.sh (bundle unpack, wheel
# install, server logs and report are that script's). See benchmarks/models/PAIR.md.
#
# Usage, from the repository root (carry .gpu-bundle and dist):
#   bash benchmarks/device/run_pair.sh [extra harness args, e.g. --temperature 0.7]
# Env knobs:
#   DYNSPEC_PAIR_TARGET   padded (default: 2.68B-parameter step cost, same function) | honest (220M)
#   DYNSPEC_PAIR_TARGET_S target training seconds (default 120)
#   DYNSPEC_PAIR_DRAFT_S  draft training seconds (default 65)
#   DYNSPEC_PAIR_END_S    seconds after start when no new level starts (default 570)
#   DYNSPEC_PAIR_C        concurrency levels (default 1,2,5,10,30,70,100,128,250: the issue's sweep plus 128 for its step-time figure)
#   DYNSPEC_PAIR_MODES    swept modes (default off,on,dynspec:goodput)
#   DYNSPEC_PAIR_ACCEPT_MODES modes started for the accept pass only (default on@topk4; empty: none)
#   DYNSPEC_PAIR_ACCEPT_T accept-pass temperatures of every `on` mode (default 0,0.7; empty: no pass)
#   DYNSPEC_PAIR_MAX_REQ  requests per level at most (default 600)
#   DYNSPEC_PAIR_NAME     result file stem (default pair-sweep); runs sharing a machine need distinct names
#   DYNSPEC_PAIR_SIDE     out (default): pair-build.log and pair-manifest.json go to $OUT as files;
#                         logs: into the logs tarball instead (as pair-build.log and pair.json), so
#                         that two runs stay within the 8 files that come back
#   DYNSPEC_PAIR_DIR      where the pair is written (default /tmp/pair; weights never come back)
#   DYNSPEC_PAIR_REUSE    1: if DYNSPEC_PAIR_DIR already holds a complete pair of this target kind (an
#                         earlier call's on a warm machine: pair.json with "done": true, which build_pair
#                         writes last, the target's and draft's model.safetensors, prompts.json), skip the
#                         build and start the servers at once. The build log then holds the earlier call's
#                         (kept in the pair as build.log) under a line saying so, and the manifest the
#                         result embeds is a copy of pair.json with "reused": {by, at, built_at}.
#                         Unset/0: always build (the folder is emptied first), as before.
#   DYNSPEC_PAIR_BUILD_ONLY 1: build (or, with REUSE, find) the pair and exit with the build's status;
#                         no servers (a caller that must do something else on the GPU before the sweep)
#   DYNSPEC_PAIR_CMD      sweep (default) | offstep: instead of the sweep, the harness's off-step
#                         comparison on the pair (`off` against a never-speculating dynspec server: decode
#                         step times, and with --prefill-c / --prefill-profile-steps the prefill-heavy level
#                         and its profiled windows); the arguments go to it (DYNSPEC_PAIR_C / _MODES /
#                         _ACCEPT_* / _MAX_REQ are the sweep's and do not apply)
#   DYNSPEC_PAIR_BUILD_ARGS extra build_pair arguments, word-split (e.g. toy sizes for a dry run)
#   DYNSPEC_PAIR_BUILDER  python module that builds the pair (default benchmarks.models.build_pair; a
#                         CPU dry run substitutes benchmarks.dynspec_bench.testing.fake_build)
#   DYNSPEC_SITE, DYNSPEC_BUNDLE, OUT as in run_sweep.sh
#
# Planned time (s from start): corpus+tokenizer+encode ≈ 35 (prompts.json written), target 130 +
# padded export ≈ 10 → `off` starts ≈ 175 while the draft trains (70) → the speculative servers
# start ≈ 250, ready ≈ 325 (was ≈ 330 with every server after the whole build; `off` is ready
# ≈ 70 s earlier but the wave waits for its slowest server); greedy/offline checks run meanwhile;
# correctness + levels ≈ 200-250; no new level after 570; stop + pack ≈ 15.
#   DYNSPEC_PAIR_WAIT_S   how long servers wait for their weights (default 420)
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
OUT=${OUT:-$REPO/benchmarks/results/device-out}
BUNDLE=${DYNSPEC_BUNDLE:-$REPO/.gpu-bundle}
SITE=${DYNSPEC_SITE:-/tmp/site}
PAIR=${DYNSPEC_PAIR_DIR:-/tmp/pair}
KIND=${DYNSPEC_PAIR_TARGET:-padded}
END_S=${DYNSPEC_PAIR_END_S:-570}
LEVELS=${DYNSPEC_PAIR_C:-1,2,5,10,30,70,100,128,250}
NAME=${DYNSPEC_PAIR_NAME:-pair-sweep}
ACCEPT_MODES=${DYNSPEC_PAIR_ACCEPT_MODES-on@topk4}
ACCEPT_T=${DYNSPEC_PAIR_ACCEPT_T-0,0.7}
SIDE=${DYNSPEC_PAIR_SIDE:-out}
REUSE=${DYNSPEC_PAIR_REUSE:-0}
BUILD_ONLY=${DYNSPEC_PAIR_BUILD_ONLY:-0}
CMD=${DYNSPEC_PAIR_CMD:-sweep}
case "$CMD" in
  sweep|offstep) ;;
  *) echo "run_pair.sh: DYNSPEC_PAIR_CMD must be sweep or offstep, got '$CMD'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
note() { echo "[run_pair +$(( $(date +%s) - T0 ))s] $*"; }
case "$SIDE" in
  out) BUILD_LOG=$OUT/pair-build.log ;;
  # Beside the pair (not in run_sweep.sh's logs folder: it empties that at its start).
  logs) mkdir -p "$PAIR-side" && BUILD_LOG=$PAIR-side/pair-build.log ;;
  *) echo "run_pair.sh: DYNSPEC_PAIR_SIDE must be out|logs, got '$SIDE'" >&2; exit 2 ;;
esac
if [ -n "$ACCEPT_MODES" ] && [ -z "$ACCEPT_T" ]; then
  echo "run_pair.sh: accept-only modes '$ACCEPT_MODES' need DYNSPEC_PAIR_ACCEPT_T" >&2; exit 2
fi

case "$KIND" in
  padded) PAD=(--pad-layers 48 --pad-intermediate 16384); MODEL=$PAIR/target-padded ;;
  honest) PAD=(); MODEL=$PAIR/target ;;
  *) echo "run_pair.sh: DYNSPEC_PAIR_TARGET must be padded|honest, got '$KIND'" >&2; exit 2 ;;
esac
if [ ! -f "$BUNDLE/site.tar.xz" ]; then
  echo "run_pair.sh: no $BUNDLE/site.tar.xz (carry .gpu-bundle with the call)" >&2; exit 2
fi

# Unpack SGLang while the pair trains (CPU only); into a side folder first, because
# run_sweep.sh skips its own unpack when $SITE/sglang exists and must never see half a tree.
# Under run_sweep.sh's lock: runs started together (one per GPU) unpack it once.
( flock 9
  if [ ! -d "$SITE/sglang" ]; then
    rm -rf "$SITE.partial" && mkdir -p "$SITE.partial" && tar -C "$SITE.partial" -xJf "$BUNDLE/site.tar.xz" \
      && rm -rf "$SITE" && mv "$SITE.partial" "$SITE"
  fi ) 9>"/tmp/.dynspec-unpack.lock" &
UNTAR_PID=$!

# The builder needs torch, tokenizers and safetensors: the image has them; else use the bundle's.
BUILD_PYPATH=$REPO
if ! python3 -c "import torch, tokenizers, safetensors" 2>/dev/null; then
  note "image python lacks tokenizers/safetensors: building with the bundle's site on the path"
  [ -n "$UNTAR_PID" ] && wait "$UNTAR_PID"; UNTAR_PID=
  BUILD_PYPATH=$REPO:$SITE
fi

FAILED=$PAIR/BUILD_FAILED
MANIFEST=$PAIR/pair.json
BUILD_PID=
# Complete = what the sweep needs exists, and build_pair's last write (pair.json "done": true) happened.
pair_complete() {
  [ -f "$MODEL/model.safetensors" ] && [ -f "$PAIR/draft/model.safetensors" ] && [ -f "$PAIR/prompts.json" ] \
    && [ ! -e "$FAILED" ] && python3 -c \
    'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("done") is True else 1)' "$MANIFEST" 2>/dev/null
}
if [ "$REUSE" = 1 ] && pair_complete; then
  BUILT_AT=$(date -u -r "$MANIFEST" +%Y-%m-%dT%H:%M:%SZ)
  note "DYNSPEC_PAIR_REUSE: the complete pair ($KIND target) in $PAIR, built $BUILT_AT, is reused: no build"
  { echo "[run_pair] $NAME: reused the complete pair in $PAIR (pair.json written $BUILT_AT) instead of building;" \
         "the log of the call that built it follows"
    cat "$PAIR/build.log" 2>/dev/null || echo "[run_pair] (that call kept no build.log)"; } > "$BUILD_LOG"
  # The result embeds a copy that says so; the pair's own pair.json stays as built.
  mkdir -p "$PAIR-side"
  python3 - "$MANIFEST" "$PAIR-side/pair.json" "$NAME" "$BUILT_AT" <<'PY' && MANIFEST=$PAIR-side/pair.json
import json, sys, time
man = json.load(open(sys.argv[1]))
man["reused"] = {"by": sys.argv[3], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "built_at": sys.argv[4]}
open(sys.argv[2], "w").write(json.dumps(man, indent=2) + "\n")
PY
else
  [ "$REUSE" = 1 ] && note "DYNSPEC_PAIR_REUSE: no complete pair in $PAIR; building it"
  note "building the pair ($KIND target) into $PAIR"
  rm -rf "$PAIR"; mkdir -p "$PAIR"
  # The build runs in the background; the harness starts each server as soon as the weights it
  # needs exist (--wait-for-weights: `off` once the target is exported, while the draft trains).
  (
    PYTHONPATH=$BUILD_PYPATH PYTHONUNBUFFERED=1 python3 -m "${DYNSPEC_PAIR_BUILDER:-benchmarks.models.build_pair}" \
      --out "$PAIR" --target-seconds "${DYNSPEC_PAIR_TARGET_S:-120}" --draft-seconds "${DYNSPEC_PAIR_DRAFT_S:-65}" \
      "${PAD[@]}" ${DYNSPEC_PAIR_BUILD_ARGS:-} > "$BUILD_LOG" 2>&1
    rc=$?
    # Kept with the pair, for the log of a later call that reuses it.
    if [ $rc -eq 0 ]; then cp "$BUILD_LOG" "$PAIR/build.log"; else echo "build_pair exit $rc" > "$FAILED"; fi
    exit $rc
  ) &
  BUILD_PID=$!
fi
# run_sweep.sh must not start before SGLang is unpacked (it would unpack a second copy).
[ -n "$UNTAR_PID" ] && { wait "$UNTAR_PID" || note "background unpack failed; run_sweep.sh unpacks again"; }
if [ "$BUILD_ONLY" = 1 ]; then
  BUILD_RC=0
  [ -n "$BUILD_PID" ] && { wait "$BUILD_PID"; BUILD_RC=$?; tail -3 "$BUILD_LOG"; }
  note "DYNSPEC_PAIR_BUILD_ONLY: pair in $PAIR $([ -n "$BUILD_PID" ] && echo "built, exit $BUILD_RC" || echo reused); no sweep"
  exit "$BUILD_RC"
fi

# C=250 needs a 256 graph and running-request cap; real weights, so no --load-format dummy.
FLAGS="--skip-tokenizer-init --attention-backend triton --sampling-backend pytorch \
--cuda-graph-bs 1 2 4 8 16 32 64 128 256 --max-running-requests 256"
MODES=${DYNSPEC_PAIR_MODES:-off,on,dynspec:goodput}${ACCEPT_MODES:+,$ACCEPT_MODES}
ACCEPT=()
[ -n "$ACCEPT_T" ] && ACCEPT+=(--accept-temperatures "$ACCEPT_T")
[ -n "$ACCEPT_MODES" ] && ACCEPT+=(--accept-only "$ACCEPT_MODES")
PACK=
[ "$SIDE" = logs ] && PACK="$BUILD_LOG $MANIFEST"
LEFT=$(( END_S - ($(date +%s) - T0) ))
SERVERS=(--wait-for-weights "${DYNSPEC_PAIR_WAIT_S:-420}" --wait-abort-file "$FAILED"
         --model "$MODEL" --draft "$PAIR/draft" --common-flags "$FLAGS")
if [ "$CMD" = offstep ]; then
  note "servers wait for their weights; off-step comparison, $LEFT s until the deadline"
  HARNESS=(offstep "${SERVERS[@]}" "$@")
else
  note "servers wait for their weights; accept pass + sweep, $LEFT s until the deadline"
  HARNESS=(sweep "${SERVERS[@]}" --prompts-file "$PAIR/prompts.json" --kind pair
           --modes "$MODES" "${ACCEPT[@]}" --pair-manifest "$MANIFEST"
           -C "$LEVELS" --input-len 256 --output-len 128 --max-requests "${DYNSPEC_PAIR_MAX_REQ:-600}" "$@")
fi
DYNSPEC_NAME=$NAME DYNSPEC_BUDGET_S=$LEFT DYNSPEC_SITE=$SITE DYNSPEC_BUNDLE=$BUNDLE OUT=$OUT \
  DYNSPEC_PACK_FILES="${DYNSPEC_PACK_FILES:-} $PACK" \
  bash "$REPO/benchmarks/device/run_sweep.sh" "${HARNESS[@]}"
RC=$?
BUILD_RC=0
[ -n "$BUILD_PID" ] && { wait "$BUILD_PID"; BUILD_RC=$?; }
[ "$SIDE" = out ] && cp "$MANIFEST" "$OUT/pair-manifest.json" 2>/dev/null
tail -5 "$BUILD_LOG"
note "done ($([ -n "$BUILD_PID" ] && echo "build exit $BUILD_RC" || echo "pair reused"), $CMD exit $RC); $KIND target; build log and manifest: $([ "$SIDE" = out ] && echo "$OUT" || echo "$OUT/$NAME-logs.tar.xz")"
[ "$BUILD_RC" -eq 0 ] || exit 3
exit "$RC"

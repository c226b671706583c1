#!/usr/bin/env bash
# Sample every SGLang scheduler process that appears within a time window with py-spy: Python
# stacks, no pause of the target (--nonblocking), idle samples dropped, raw collapsed output (one
# "frame;frame;... count" line per stack).  Which scheduler serves which mode: map.txt holds each
# scheduler's pid and its launcher's command line (its --port; the harness's driver.log names the
# mode of each port).  Summarised on the CPU by benchmarks/pyspy_summary.py.
#
# Usage (on the GPU machine, beside a harness run):
#   bash benchmarks/device/pyspy_watch.sh <py-spy wheel or binary> <out dir> <seconds to watch> &
# A wheel (py_spy-*.whl, e.g. from `pip download py-spy --no-deps`) is unpacked to /tmp first.
# New schedulers are looked for until <seconds> pass or <out dir>/STOP exists; each recorder ends when
# its scheduler exits (the harness stops the servers) and then writes its file: touch STOP and wait
# for this script before packing <out dir>.
set -uo pipefail
SPY=${1:?py-spy wheel or binary}
DIR=${2:?out dir}
WATCH_S=${3:?seconds}
RATE=${DYNSPEC_PYSPY_RATE:-200}
mkdir -p "$DIR"
if [[ "$SPY" == *.whl ]]; then
  rm -rf /tmp/pyspy-wheel && python3 -m zipfile -e "$SPY" /tmp/pyspy-wheel || exit 2
  SPY=$(find /tmp/pyspy-wheel -name py-spy -type f | head -1)
  chmod +x "$SPY"
fi
"$SPY" --version > "$DIR/version.txt" 2>&1 || { echo "py-spy does not run here" >> "$DIR/errors.txt"; exit 2; }
declare -A seen=()
pids=()
end=$(( $(date +%s) + WATCH_S ))
while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$DIR/STOP" ]; do
  for pid in $(pgrep -f "${DYNSPEC_PYSPY_PATTERN:-^sglang::scheduler}" || true); do
    [ -n "${seen[$pid]:-}" ] && continue
    seen[$pid]=1
    ppid=$(ps -o ppid= -p "$pid" | tr -d ' ')
    echo "$pid $(date +%s) $(ps -o args= -p "$ppid" 2>/dev/null)" >> "$DIR/map.txt"
    "$SPY" record --pid "$pid" --rate "$RATE" --nonblocking --format raw -o "$DIR/sched-$pid.txt" \
      > "$DIR/spy-$pid.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
done
[ "${#pids[@]}" -gt 0 ] && wait "${pids[@]}"
exit 0

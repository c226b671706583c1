#!/usr/bin/env bash
# Re-resolve the CPU-matrix locks (keeps existing pins unless an .in file changed; add --upgrade to move).
# The torch stack (torch, torchvision, triton, nvidia-*, cuda-*) goes to constraints/torch-<ver>.txt only,
# so tox can give a release its own torch or a shared one (DYNSPEC_CI_TORCH, see .ci/run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=(--python-version 3.11)
# torch lock <- the release whose lock it was split from (same versions for the shared packages)
declare -A torch_of=([2.9.1]=0.5.9 [2.11.0]=0.5.12 [2.14.1]=0.5.23)
for t in "${!torch_of[@]}"; do
    uv pip compile -q "${py[@]}" "constraints/torch-$t.in" -c "constraints/sglang-${torch_of[$t]}.txt" \
        -o "constraints/torch-$t.txt" "$@"
done
stack=$(grep -hE '^(nvidia-|cuda-|torch|triton)' constraints/torch-*.txt | cut -d= -f1 | sort -u)
no_emit=()
for p in $stack; do no_emit+=(--no-emit-package "$p"); done
for in_file in constraints/sglang-*.in; do
    uv pip compile -q "${py[@]}" "$in_file" -o "${in_file%.in}.txt" "${no_emit[@]}" "$@"
done
# base: the py env (any Python from 3.10), so universal
uv pip compile -q --universal --python-version 3.10 constraints/base.in -o constraints/base.txt "$@"

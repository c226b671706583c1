"""Shared by the GPU end-to-end tests: serve one mode through the harness and collect outputs."""

from __future__ import annotations

import re

import pytest

# The Triton kernels adapters/kernel_warmup.py compiles at start (compat.SPEC_STEP_KERNELS, the
# Triton attention backend's kv-splits kernel and the draft backend's KV-index kernel).
SPEC_STEP_TRITON_KERNELS = {"assign_req_to_token_pool", "assign_extend_cache_locs", "fill_accept_out_cache_loc",
                            "copy_all_layer_kv_cache_tiled", "get_num_kv_splits_triton",
                            "generate_draft_decode_kv_indices"}


@pytest.fixture
def serve_and_collect():
    """(correctness, server) modules, spec, prompts, ... -> (outputs, problems, notes) of one mode."""

    def run(correctness, server, mode, spec, log_dir, prompts, max_new_tokens, concurrency):
        problems, notes = [], []
        # The adapter's INFO lines (first off-step, graph capture) show up at INFO.
        spec.env.setdefault("SGLANG_DYNSPEC_LOG_LEVEL", "INFO")
        with server.ServerProcess(spec, log_dir) as srv:
            srv.start(timeout_s=900)
            outputs = correctness.collect_outputs(srv.base_url, prompts, max_new_tokens=max_new_tokens,
                                                  concurrency=concurrency)
            counts = srv.log_counts()
            text = srv.log_text()
        if counts["tracebacks"] or counts["leak_reports"]:
            problems.append(f"{mode.name}: {counts} (log {srv.log_path})")
        if mode.kind == "dynspec":
            if "off-steps disabled" in text:
                problems.append(f"{mode.name}: adapter refused this worker (log {srv.log_path})")
            notes.append(f"{mode.name}: first-off-step log line {'seen' if 'first off-step' in text else 'NOT seen'}")
            recorded = "recorded the light draft write" in text
            notes.append(f"{mode.name}: light draft write {'recorded as CUDA graphs' if recorded else 'eager'}")
            stalls = re.findall(r"Triton compiled (\w+)\(.*while serving", text)
            notes.append(f"{mode.name}: Triton compiles while serving: {sorted(set(stalls)) or 'none'}")
            warmed = sorted(set(stalls) & SPEC_STEP_TRITON_KERNELS)
            if warmed:
                problems.append(f"{mode.name}: a warmed speculative kernel compiled while serving: {warmed} "
                                f"(log {srv.log_path})")
            if "the recorded light draft write differs" in text or "recording the light draft write failed" in text:
                problems.append(f"{mode.name}: the recorded draft write failed its check (log {srv.log_path})")
        return outputs, problems, notes, text

    return run

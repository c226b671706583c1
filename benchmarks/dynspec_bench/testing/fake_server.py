"""A stand-in for `python -m sglang.launch_server` that speaks the endpoints the harness uses.

Behaviour is set by flags (the harness passes SGLang's, unknown ones are ignored) and env vars:
  FAKE_SGLANG_TOKEN_DELAY_S   seconds per generated token (default 0.002)
  FAKE_SGLANG_STARTUP_S       seconds before /health_generate answers 200 (default 0.3)
  FAKE_SGLANG_DIE_IF_FLAG     exit(3) at start when this flag is on the command line
  FAKE_SGLANG_FAIL_EVERY      answer HTTP 500 to every Nth /generate (0 = never)
  FAKE_SGLANG_FLIP_AT         "idx": change output token idx of every request (simulated drift)
  FAKE_SGLANG_LEAK_LINES      print this many leak-report lines at start
  FAKE_SGLANG_ACCEPT          accept length reported when speculating (default 2.0)
  FAKE_SGLANG_REQUEST_LOG     append each /generate's sampling_params to this file (one JSON line per
                              request, in arrival order), for tests of what the harness sends
Like SGLang's /generate it honours sampling_params.max_new_tokens, stop_token_ids (unless ignore_eos;
the matched token is the last output id, finish_reason {"type": "stop"}), a request `rid` with
POST /abort_request (finish_reason {"type": "abort"}), and a client that closes the stream (the
request stops and counts as aborted). sampling_params.custom_params {"dynspec": "off"} forces the
simulated plugin off for that request's steps (counted in steps_forced_off). meta_info carries
cached_tokens: the longest 16-token-block prefix seen in an earlier prompt (a radix-cache stand-in).
/metrics serves sglang:num_requests_total, sglang:num_aborted_requests_total and, with the plugin
enabled, sglang_dynspec_* counters.
It also starts a sleeping child process, like SGLang's scheduler, to test process-group cleanup.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web


def token_for(input_ids: list[int], i: int) -> int:
    return (sum(input_ids) * 31 + i * 7919) % 29000 + 1000


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    args, _unknown = p.parse_known_args(argv)
    return args


class State:
    def __init__(self, argv):
        self.argv = argv
        self.args = parse(argv)
        self.t_start = time.monotonic()
        self.delay = float(os.environ.get("FAKE_SGLANG_TOKEN_DELAY_S", "0.002"))
        self.startup = float(os.environ.get("FAKE_SGLANG_STARTUP_S", "0.3"))
        self.fail_every = int(os.environ.get("FAKE_SGLANG_FAIL_EVERY", "0") or 0)
        flip = os.environ.get("FAKE_SGLANG_FLIP_AT", "")
        self.flip_at = int(flip) if flip else None
        self.accept = float(os.environ.get("FAKE_SGLANG_ACCEPT", "2.0"))
        self.spec = self.args.speculative_algorithm is not None
        self.n_requests = 0
        self.stats_dir = os.environ.get("SGLANG_DYNSPEC_STATS_DIR") if os.environ.get("SGLANG_DYNSPEC_ENABLED") else None
        self.policy = os.environ.get("SGLANG_DYNSPEC_POLICY")
        self.counters = {"decode_steps": 0, "steps_on": 0, "steps_off": 0, "switches": 0, "policy_errors": 0,
                         "steps_forced_off": 0}
        self.n_aborted = 0
        self.abort_rids: set = set()
        self.prefix_blocks: set = set()
        self.rng = random.Random(0)
        self.last_on = None
        self.spec_tokens = 0
        self.spec_verify = 0
        self.request_log = os.environ.get("FAKE_SGLANG_REQUEST_LOG") or None

    def step(self, forced_off: bool = False):
        """One simulated decode step of the dynspec plugin (policy 'random' flips a coin)."""
        on = self.rng.random() < 0.5 if self.policy == "random" else self.policy not in ("never", None)
        if forced_off:
            on = False
            self.counters["steps_forced_off"] += 1
        self.counters["decode_steps"] += 1
        self.counters["steps_on" if on else "steps_off"] += 1
        if self.last_on is not None and on != self.last_on:
            self.counters["switches"] += 1
        self.last_on = on

    def write_stats(self):
        if not self.stats_dir:
            return
        d = Path(self.stats_dir)
        d.mkdir(parents=True, exist_ok=True)
        data = {"pid": os.getpid(), "tp_rank": 0, "policy": self.policy, "worker_path": "spec_v2", **self.counters}
        tmp = d / f".stats-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, d / f"stats-{os.getpid()}.json")


async def health(request):
    st: State = request.app["state"]
    ready = time.monotonic() - st.t_start >= st.startup
    return web.Response(status=200 if ready else 503)


async def server_info(request):
    st: State = request.app["state"]
    internal = {}
    if st.spec and st.spec_verify:
        internal["avg_spec_accept_length"] = st.spec_tokens / st.spec_verify
    return web.json_response({"internal_states": [internal], "version": "0.0.fake", "port": st.args.port})


async def metrics(request):
    st: State = request.app["state"]
    lab = 'model_name="x"'
    lines = ["# HELP fake", f"sglang:num_requests_total{{{lab}}} {st.n_requests}",
             f"sglang:num_aborted_requests_total{{{lab}}} {st.n_aborted}"]
    if os.environ.get("SGLANG_DYNSPEC_ENABLED"):
        c = st.counters
        lines += ["# HELP sglang_dynspec_decode_steps_total Decode steps by mode",
                  "# TYPE sglang_dynspec_decode_steps_total counter",
                  f'sglang_dynspec_decode_steps_total{{mode="on",tp_rank="0"}} {float(c["steps_on"])}',
                  f'sglang_dynspec_decode_steps_total{{mode="off",tp_rank="0"}} {float(c["steps_off"])}',
                  f'sglang_dynspec_switches_total{{tp_rank="0"}} {float(c["switches"])}',
                  f'sglang_dynspec_mode{{tp_rank="0"}} {1.0 if st.last_on else 0.0}']
    return web.Response(text="\n".join(lines) + "\n")


async def start_profile(request):
    """Writes a chrome trace like SGLang's /start_profile would after num_steps steps: per step one
    0.5 ms kernel inside a 1 ms step, one graph launch and a ``step[DECODE ...]`` range, and on every
    third step (1, 4, ...) a ``step[EXTEND ...]`` range after it; dynspec servers add the adapter's ranges."""
    st: State = request.app["state"]
    body = await request.json()
    n = int(body.get("num_steps") or 10)
    out = Path(body.get("output_dir") or "/tmp")
    out.mkdir(parents=True, exist_ok=True)
    evs = []
    for i in range(n):
        t = 1000.0 * i
        evs.append({"ph": "X", "cat": "kernel", "name": "fake_gemm", "ts": t, "dur": 500.0})
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5.0})
        evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": t + 1, "dur": 20.0})
        evs.append({"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=2]", "ts": t, "dur": 300.0, "tid": 1})
        if i % 3 == 1:
            evs.append({"ph": "X", "cat": "user_annotation", "name": "step[EXTEND bs=1 toks=8]", "ts": t + 400,
                        "dur": 200.0, "tid": 1})
        if st.stats_dir:
            evs.append({"ph": "X", "cat": "user_annotation", "name": "dynspec.offstep.target", "ts": t, "dur": 100.0})
            evs.append({"ph": "X", "cat": "gpu_user_annotation", "name": "dynspec.offstep.target",
                        "ts": t, "dur": 400.0})
    await asyncio.sleep(0.05 * n * st.delay / 0.001)
    name = f"{body.get('profile_prefix') or ''}-{time.time()}-TP-0.trace.json.gz"
    with gzip.open(out / name, "wt") as fh:
        json.dump({"traceEvents": evs}, fh)
    return web.json_response({"success": True, "message": "Succeeded"})


async def abort_request(request):
    st: State = request.app["state"]
    body = await request.json()
    rid = body.get("rid")
    if rid:
        st.abort_rids.add(str(rid))
    return web.Response(status=200)


def _cached_tokens(st: State, ids: list[int], block: int = 16) -> int:
    """Longest block-aligned prefix an earlier prompt shared (at most len-1, as a radix cache)."""
    hit = 0
    keys = []
    for end in range(block, len(ids) + 1, block):
        key = hash(tuple(ids[:end]))
        keys.append(key)
        if key in st.prefix_blocks and hit == end - block:
            hit = end
    st.prefix_blocks.update(keys)
    return min(hit, len(ids) - 1)


async def generate(request):
    st: State = request.app["state"]
    body = await request.json()
    st.n_requests += 1
    if st.fail_every and st.n_requests % st.fail_every == 0:
        return web.json_response({"error": {"message": "injected failure"}}, status=500)
    ids = body.get("input_ids")
    sp = body.get("sampling_params") or {}
    if st.request_log:
        with open(st.request_log, "a") as f:
            f.write(json.dumps(sp) + "\n")
    n = int(sp.get("max_new_tokens", 16))
    if not isinstance(ids, list) or not ids:
        return web.json_response({"error": {"message": "input_ids required"}}, status=400)
    rid = body.get("rid")
    stop_ids = set() if sp.get("ignore_eos") else {int(t) for t in (sp.get("stop_token_ids") or [])}
    custom = sp.get("custom_params")
    optout = isinstance(custom, dict) and custom.get("dynspec") in ("off", False)
    cached = _cached_tokens(st, ids)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    out: list[int] = []
    try:
        await asyncio.sleep(st.delay)  # prefill
        for i in range(n):
            if rid is not None and rid in st.abort_rids:
                st.abort_rids.discard(rid)
                st.n_aborted += 1
                meta = {"completion_tokens": len(out), "prompt_tokens": len(ids), "cached_tokens": cached,
                        "finish_reason": {"type": "abort", "message": "Abort by request"}}
                await resp.write(b"data: " + json.dumps({"output_ids": list(out), "meta_info": meta}).encode()
                                 + b"\n\n")
                break
            tok = token_for(ids, i)
            if st.flip_at is not None and i == st.flip_at:
                tok += 1
            out.append(tok)
            st.step(forced_off=optout)  # one simulated step per token (the harness tests count on it)
            meta = {"completion_tokens": len(out), "prompt_tokens": len(ids), "cached_tokens": cached,
                    "finish_reason": None}
            last = i == n - 1
            if tok in stop_ids:
                meta["finish_reason"] = {"type": "stop", "matched": tok}
                last = True
            elif last:
                meta["finish_reason"] = {"type": "length", "length": n}
            if last and st.spec:
                k = len(out)
                vct = max(1, math.ceil(k / st.accept))
                meta["spec_verify_ct"] = vct
                meta["spec_num_correct_drafts"] = k - vct
                meta["spec_accept_length"] = k / vct
                st.spec_tokens += k
                st.spec_verify += vct
            await resp.write(b"data: " + json.dumps({"output_ids": list(out), "meta_info": meta}).encode()
                             + b"\n\n")
            if last:
                break
            await asyncio.sleep(st.delay)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        st.n_aborted += 1  # the client went away mid-stream: SGLang aborts such a request
    except asyncio.CancelledError:
        st.n_aborted += 1
        raise
    return resp


async def stats_writer(app):
    st: State = app["state"]

    async def loop():
        while True:
            st.write_stats()
            await asyncio.sleep(0.2)

    task = asyncio.create_task(loop())
    yield
    task.cancel()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    die_flag = os.environ.get("FAKE_SGLANG_DIE_IF_FLAG")
    if die_flag and die_flag in argv:
        print(f"error: unrecognized arguments: {die_flag}", flush=True)
        raise SystemExit(3)
    for _ in range(int(os.environ.get("FAKE_SGLANG_LEAK_LINES", "0") or 0)):
        print("ValueError: token_to_kv_pool_allocator memory leak detected! available_size=1", flush=True)
    # A child in our process group, standing in for the scheduler process.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    pidfile = os.environ.get("FAKE_SGLANG_CHILD_PIDFILE")
    if pidfile:
        Path(pidfile).write_text(str(child.pid))
    st = State(argv)
    app = web.Application()
    app["state"] = st
    app.router.add_get("/health_generate", health)
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/start_profile", start_profile)
    app.cleanup_ctx.append(stats_writer)
    print(f"fake sglang on {st.args.host}:{st.args.port} spec={st.spec} policy={st.policy}", flush=True)
    web.run_app(app, host=st.args.host, port=st.args.port, print=None)


if __name__ == "__main__":
    main()

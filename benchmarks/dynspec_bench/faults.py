"""Fault workload of the fuzz kind (`fuzz --workload faults`).

One run drives the dynspec server (policy `random`, seeded: it flips every step) and the `off`
reference at client concurrency C with a seeded mix of request shapes that stress the switch:

* mixed output lengths (``max_new_tokens`` from {1, 2, 7, 33, 128, 300}; 1 means prefill only),
* stop conditions: ``sampling_params.stop_token_ids`` with ``ignore_eos: false``. The servers run
  with ``--skip-tokenizer-init``, so string stops (``stop``) cannot be used; SGLang 0.5.12's
  ``SamplingParams`` keeps ``stop_token_ids`` as a set of ints and ``Req._check_token_based_finish``
  matches every newly accepted token against it (also the several tokens one speculative step
  accepts: the output is cut at the first match, which is what this exercises). ``ignore_eos: true``
  would skip that check entirely, so stop requests set it to false. The stop id is the token at a
  drawn position j of the `off` server's own greedy output for that prompt (a short probe request
  first), so the stop really fires, at position <= j,
* client aborts mid-generation: after k streamed chunks the client either closes the connection
  (SGLang aborts a disconnected stream, about 2 s later in 0.5.12) or POSTs ``/abort_request``
  with the request's rid; aborted requests are counted and excluded from the comparison,
* long prompts (1500 tokens) above the servers' ``--chunked-prefill-size`` (512 for this run), so
  prefill chunks run between decode steps (SGLang turns ``--enable-mixed-chunk`` off for EAGLE, so
  chunks interleave with decode batches rather than share them),
* radix-cache hits: a few shared prefixes repeated with short unique suffixes (some exact repeats),
* the per-request opt-out ``custom_params = {"dynspec": "off"}`` on a few short requests (the plugin
  forces off every decode batch holding one: the stats counter ``steps_forced_off``).

Every non-abort request is sent to both servers at the same moment with the same prompt and
sampling params (greedy); completed pairs are compared token by token. The level ends when the
plugin's stats file reports >= min_decode_steps decode steps since the level began, at its time
budget, at the run deadline, or when the dynspec server dies; requests still in flight then get
`drain_s` to finish and are cut (cancelled: counted as ``cut_at_stop``, not compared) after that.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import correctness as corr
from .loadgen import RequestResult, _session, send_one
from .loadgen import sampling_params as make_params
from .prompts import ID_HIGH, ID_LOW
from .server import http_get
from .stats import read_stats

OUTPUT_LENS = (1, 2, 7, 33, 128, 300)
# Counters the plugin writes that stats.read_stats does not sum; read here from the same files.
EXTRA_COUNTERS = ("steps_forced_off", "optout_not_honoured")


@dataclass
class FaultMix:
    """Probabilities and sizes of the request shapes (drawn per request index, seeded)."""

    output_lens: tuple = OUTPUT_LENS
    input_len: int = 256          # plain prompts
    p_long: float = 0.10          # prompt of long_prompt_len tokens (> --chunked-prefill-size)
    long_prompt_len: int = 1500
    p_prefix: float = 0.30        # shared prefix + unique suffix (radix-cache hit)
    n_prefixes: int = 4
    prefix_len: int = 384
    suffix_len: int = 32
    p_exact_repeat: float = 0.10  # of the prefix requests: the bare shared prefix (full-prompt hit)
    p_stop: float = 0.15
    stop_lens: tuple = (33, 128, 300)
    stop_probe_max: int = 24      # the stop id is the reference's token at a position in [1, this]
    p_abort: float = 0.10
    abort_len: int = 300          # long, so the abort lands mid-generation
    abort_after_max: int = 12     # abort after k in [1, this] streamed chunks
    p_abort_endpoint: float = 0.30  # of the aborts: POST /abort_request (else: close the connection)
    # Opt-outs force whole batches off, so they are rare and short; at C=256 a 10 % share would
    # leave no batch without one and the random switching would never run.
    p_optout: float = 0.01
    optout_lens: tuple = (2, 7, 33)

    def __post_init__(self) -> None:
        for name in ("p_long", "p_prefix", "p_exact_repeat", "p_stop", "p_abort", "p_abort_endpoint", "p_optout"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"FaultMix.{name} must be in [0, 1], got {v}")
        if self.p_long + self.p_prefix > 1.0:
            raise ValueError(f"FaultMix.p_long + p_prefix must be <= 1, got {self.p_long + self.p_prefix}")
        for name in ("output_lens", "stop_lens", "optout_lens"):
            vals = getattr(self, name)
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"FaultMix.{name} must be positive integers, got {vals}")
        if min(self.stop_lens) < 2 or self.stop_probe_max < 1:
            raise ValueError("FaultMix.stop_lens must be >= 2 and stop_probe_max >= 1")
        if self.abort_len < 2 or self.abort_after_max < 1:
            raise ValueError("FaultMix.abort_len must be >= 2 and abort_after_max >= 1")
        for name in ("input_len", "long_prompt_len", "prefix_len", "n_prefixes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"FaultMix.{name} must be >= 1, got {getattr(self, name)}")

    def settings(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def kv_tokens_needed(max_c: int, mix: FaultMix | None = None) -> int:
    """A --max-total-tokens that holds max_c requests of the mix without retraction (>= 32768)."""
    mix = mix or FaultMix()
    p_plain = 1.0 - mix.p_long - mix.p_prefix
    mean_in = (mix.p_long * mix.long_prompt_len + mix.p_prefix * (mix.prefix_len + mix.suffix_len)
               + p_plain * mix.input_len)
    per_req = mean_in + max(max(mix.output_lens), mix.abort_len, max(mix.stop_lens)) + 64
    need = int(max_c * per_req)
    return max(32768, -(-need // 4096) * 4096)


@dataclass
class Case:
    index: int
    prompt: list[int]
    max_new_tokens: int
    tags: list[str] = field(default_factory=list)
    abort_after: int | None = None
    abort_via: str | None = None
    stop_at: int | None = None  # position in the reference output whose token becomes the stop id

    @property
    def abort(self) -> bool:
        return self.abort_after is not None

    def params(self, stop_ids: list[int] | None = None) -> dict:
        extra: dict = {}
        if stop_ids:
            extra["stop_token_ids"] = list(stop_ids)
            extra["ignore_eos"] = False  # with ignore_eos SGLang skips the stop-token check
        if "optout" in self.tags:
            extra["custom_params"] = {"dynspec": "off"}
        return make_params(self.max_new_tokens, **extra)


class CaseSource:
    """Request shapes by index: the same index always gives the same case (prompt, params, fault)."""

    def __init__(self, mix: FaultMix, seed: int = 0):
        self.mix = mix
        self.seed = int(seed)
        rng = random.Random(self.seed * 7_000_003 + 17)
        self.prefixes = [[rng.randrange(ID_LOW, ID_HIGH) for _ in range(mix.prefix_len)]
                         for _ in range(mix.n_prefixes)]

    def case(self, index: int) -> Case:
        m = self.mix
        rng = random.Random(self.seed * 1_000_003 + 7919 * index + 1)
        tags: list[str] = []
        u = rng.random()
        if u < m.p_long:
            tags.append("long")
            prompt = [rng.randrange(ID_LOW, ID_HIGH) for _ in range(m.long_prompt_len)]
        elif u < m.p_long + m.p_prefix:
            tags.append("prefix")
            prompt = list(self.prefixes[rng.randrange(len(self.prefixes))])
            if rng.random() < m.p_exact_repeat:
                tags.append("repeat")
            else:
                prompt += [rng.randrange(ID_LOW, ID_HIGH) for _ in range(m.suffix_len)]
        else:
            prompt = [rng.randrange(ID_LOW, ID_HIGH) for _ in range(m.input_len)]
        case = Case(index, prompt, int(rng.choice(m.output_lens)), tags)
        if rng.random() < m.p_optout:
            tags.append("optout")
            case.max_new_tokens = int(rng.choice(m.optout_lens))
        r = rng.random()
        if r < m.p_abort:
            tags.append("abort")
            case.max_new_tokens = max(case.max_new_tokens, m.abort_len)
            case.abort_after = rng.randint(1, m.abort_after_max)
            case.abort_via = "endpoint" if rng.random() < m.p_abort_endpoint else "disconnect"
            tags.append(f"abort_{case.abort_via}")
        elif r < m.p_abort + m.p_stop:
            tags.append("stop")
            if "optout" not in tags:
                case.max_new_tokens = int(rng.choice(m.stop_lens))
            case.max_new_tokens = max(case.max_new_tokens, 2)
            case.stop_at = rng.randint(1, min(m.stop_probe_max, case.max_new_tokens - 1))
        if case.max_new_tokens == 1:
            tags.append("len1")
        return case


@dataclass
class Outcome:
    case: Case
    dyn: RequestResult
    ref: RequestResult | None = None
    probe_error: str | None = None
    stop_ids: list[int] | None = None


def stats_with_extras(stats_dir) -> dict | None:
    """read_stats plus the plugin counters it does not sum (rank-0 files, summed over processes)."""
    base = read_stats(stats_dir)
    if base is None:
        return None
    extra = {k: 0 for k in EXTRA_COUNTERS}
    for f in sorted(Path(stats_dir).glob("stats-*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or int(data.get("tp_rank", 0) or 0) != 0:
            continue
        for k in EXTRA_COUNTERS:
            extra[k] += int(data.get(k, 0) or 0)
    base.update(extra)
    return base


def _delta(before: dict | None, now: dict | None, key: str) -> int | None:
    if now is None or key not in now:
        return None
    return int(now.get(key) or 0) - int((before or {}).get(key, 0) or 0)


async def _run_case(case: Case, dyn_url: str, off_url: str, dyn_sess, off_sess, t0: float) -> Outcome:
    stop_ids = None
    if case.stop_at is not None:
        probe = await send_one(off_sess, off_url, case.index, case.prompt, make_params(case.stop_at + 1), t0)
        if not probe.ok or len(probe.output_ids) <= case.stop_at:
            return Outcome(case, RequestResult(index=case.index, error="not sent: stop probe failed"),
                           probe_error=probe.error or f"probe returned {len(probe.output_ids)} ids")
        stop_ids = [int(probe.output_ids[case.stop_at])]
    params = case.params(stop_ids)
    if case.abort:
        rid = f"dynspec-fault-{case.index}-{uuid.uuid4().hex[:12]}" if case.abort_via == "endpoint" else None
        dyn = await send_one(dyn_sess, dyn_url, case.index, case.prompt, params, t0,
                             abort_after_chunks=case.abort_after, abort_via=case.abort_via, rid=rid)
        return Outcome(case, dyn, None, stop_ids=stop_ids)
    dyn, ref = await asyncio.gather(send_one(dyn_sess, dyn_url, case.index, case.prompt, params, t0),
                                    send_one(off_sess, off_url, case.index, case.prompt, params, t0))
    return Outcome(case, dyn, ref, stop_ids=stop_ids)


async def drive(dyn_url: str, off_url: str, concurrency: int, source: CaseSource, first_index: int, *,
                stats_dir, min_decode_steps: int, stop_at: float, drain_s: float, alive=lambda: True,
                poll_s: float = 1.0, no_stats_after_s: float = 45.0, timeout_s: float = 600.0) -> dict:
    """Closed loop at `concurrency` until a stop condition; returns outcomes and why it stopped."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    why: list[str] = []
    counter = [first_index]
    started = [0]
    before = stats_with_extras(stats_dir)
    t_begin = time.monotonic()

    async def worker(dyn_sess, off_sess, t0):
        while not stop.is_set():
            idx = counter[0]
            counter[0] += 1
            started[0] += 1
            case = source.case(idx)
            try:
                out = await _run_case(case, dyn_url, off_url, dyn_sess, off_sess, t0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a harness bug must not end the level silently
                out = Outcome(case, RequestResult(index=idx, error=f"harness: {exc!r}"[:300]))
            outcomes.append(out)

    async def monitor():
        while not stop.is_set():
            await asyncio.sleep(poll_s)
            now = stats_with_extras(stats_dir)
            steps = _delta(before, now, "decode_steps")
            if steps is not None and steps >= min_decode_steps:
                why.append("decode_steps")
            elif not alive():
                why.append("server_died")
            elif time.monotonic() >= stop_at:
                why.append("time")
            elif now is None and time.monotonic() - t_begin > no_stats_after_s:
                why.append("no_stats")  # the plugin is not reporting: do not run the budget out blindly
            if why:
                stop.set()

    async with _session(0, timeout_s) as dyn_sess, _session(0, timeout_s) as off_sess:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker(dyn_sess, off_sess, t0)) for _ in range(concurrency)]
        mon = asyncio.create_task(monitor())
        await stop.wait()
        t_stop = time.monotonic()
        _done, pending = await asyncio.wait(tasks, timeout=max(0.0, drain_s))
        for t in pending:
            t.cancel()  # closes their connections: the servers abort those requests
        await asyncio.gather(*tasks, return_exceptions=True)
        mon.cancel()
        await asyncio.gather(mon, return_exceptions=True)
    return {"outcomes": outcomes, "stop_reason": why[0] if why else "unknown", "started": started[0],
            "cut_at_stop": started[0] - len(outcomes), "drain_s": round(time.monotonic() - t_stop, 3),
            "wall_s": round(time.monotonic() - t_begin, 3), "next_index": counter[0]}


def summarize_level(run: dict, before: dict | None, after: dict | None) -> dict:
    outs: list[Outcome] = run["outcomes"]
    tag_counts: Counter = Counter()
    mismatched_by_tag: Counter = Counter()
    finish: Counter = Counter()
    errors: list[str] = []
    ref_errors: list[str] = []
    mismatch_samples: list[dict] = []
    aborted = landed = compared = mismatched = stopped = probe_failed = 0
    cache_hits = cached_tokens = completion = 0
    for o in outs:
        c = o.case
        tag_counts.update(c.tags or ["plain"])
        if o.probe_error is not None:
            probe_failed += 1
            ref_errors.append(f"#{c.index} stop probe: {o.probe_error}")
            continue
        d = o.dyn
        if c.abort:
            aborted += 1
            landed += bool(d.abort_landed)
            if d.error:
                errors.append(f"#{c.index} ({'+'.join(c.tags)}): {d.error}")
            continue
        if d.error:
            errors.append(f"#{c.index} ({'+'.join(c.tags)}): {d.error}")
        if o.ref is not None and o.ref.error:
            ref_errors.append(f"#{c.index}: {o.ref.error}")
        if d.ok:
            finish[d.finish_reason or "none"] += 1
            completion += d.completion_tokens
            if d.finish_reason == "stop" and "stop" in c.tags:
                stopped += 1
            if d.cached_tokens:
                cache_hits += 1
                cached_tokens += d.cached_tokens
        if d.ok and o.ref is not None and o.ref.ok:
            compared += 1
            first = corr.first_mismatch(o.ref.output_ids, d.output_ids)
            if first is not None:
                mismatched += 1
                mismatched_by_tag.update(c.tags or ["plain"])
                if len(mismatch_samples) < 10:
                    mismatch_samples.append({"index": c.index, "first_mismatch": first, "tags": c.tags,
                                             "max_new_tokens": c.max_new_tokens, "ref_len": len(o.ref.output_ids),
                                             "got_len": len(d.output_ids), "stop_ids": o.stop_ids,
                                             "finish": [o.ref.finish_reason, d.finish_reason]})
    n_err = sum(1 for o in outs if o.probe_error is None and o.dyn.error)
    return {
        "decode_steps": _delta(before, after, "decode_steps"),
        "switches": _delta(before, after, "switches"),
        "steps_forced_off": _delta(before, after, "steps_forced_off"),
        "steps_off": _delta(before, after, "steps_off"),
        "optout_not_honoured": _delta(before, after, "optout_not_honoured"),
        "requests": sum(1 for o in outs if o.probe_error is None),
        "aborted": aborted,
        "abort_landed": landed,
        "cut_at_stop": run["cut_at_stop"],
        "compared": compared,
        "mismatched": mismatched,
        "mismatched_by_tag": dict(mismatched_by_tag),
        "mismatch_samples": mismatch_samples,
        "errors": n_err,
        "error_samples": errors[:5],
        "reference_errors": len(ref_errors),
        "reference_error_samples": ref_errors[:5],
        "stop_probe_failed": probe_failed,
        "requests_by_tag": dict(tag_counts),
        "stopped": stopped,
        "finish_reasons": dict(finish),
        "cache_hit_requests": cache_hits,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion,
        "stop_reason": run["stop_reason"],
        "drain_s": run["drain_s"],
        "wall_s": run["wall_s"],
    }


def health_ok(base_url: str) -> bool:
    status, _ = http_get(base_url + "/health_generate", timeout=15.0)
    return status == 200


def scrape_metrics(base_url: str) -> dict:
    """One GET /metrics: the sglang_dynspec_* sample lines, and SGLang's aborted-request counter."""
    status, body = http_get(base_url + "/metrics", timeout=15.0)
    text = body.decode(errors="replace") if status == 200 else ""
    lines = [ln for ln in text.splitlines() if ln.startswith("sglang_dynspec_")]
    aborted = None
    for ln in text.splitlines():
        if ln.startswith("sglang:num_aborted_requests_total"):
            try:
                aborted = (aborted or 0.0) + float(ln.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                pass
    return {"status": status, "lines": lines, "server_aborted_requests": aborted}

"""Async load generator for SGLang's native /generate endpoint (token ids in, token ids out)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

try:
    from tqdm import tqdm
except ImportError:  # progress bars are a nicety, not a requirement
    tqdm = None


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str | None = None
    start_s: float = 0.0  # relative to the run start
    ttft_s: float | None = None
    latency_s: float | None = None
    completion_tokens: int = 0
    spec_verify_ct: int | None = None
    spec_correct_drafts: int | None = None  # drafts its speculative verifies accepted, where reported
    finish_reason: str | None = None
    output_ids: list[int] = field(default_factory=list)
    phase: str | None = None
    cached_tokens: int | None = None  # meta_info.cached_tokens (radix-cache hit length), when reported
    # Intended client aborts (send_one's abort_after_chunks): such a request is neither ok nor an error.
    aborted: bool = False
    abort_landed: bool | None = None  # cut before its end (disconnect) / the server answered "abort" (endpoint)

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.latency_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


def sampling_params(max_new_tokens: int, temperature: float = 0.0, **extra) -> dict:
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if float(temperature) < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return {"max_new_tokens": int(max_new_tokens), "ignore_eos": True, "temperature": float(temperature), **extra}


def output_lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """``n`` max_new_tokens drawn uniformly from the integers lo..hi (both included).

    Seeded, so every mode given the same seed serves the same lengths (with ``ignore_eos`` they
    are the exact output lengths)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= int(lo) <= int(hi):
        raise ValueError(f"output length range must satisfy 1 <= lo <= hi, got {lo},{hi}")
    rng = random.Random(seed)
    return [rng.randint(int(lo), int(hi)) for _ in range(n)]


def _params_for(params: dict | list[dict], n: int) -> list[dict]:
    """One sampling-params dict per request: ``params`` is shared, or already one per request."""
    if isinstance(params, dict):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} per-request sampling params for {n} requests")
    return list(params)


def _parse_finish(meta: dict) -> str | None:
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        return fr.get("type")
    return fr


def _finished(meta: dict) -> bool:
    return meta.get("finish_reason") is not None


async def _post_abort(session: aiohttp.ClientSession, base_url: str, rid: str) -> str | None:
    """POST /abort_request {"rid": rid}; returns an error text, or None when the server took it."""
    try:
        async with session.post(base_url + "/abort_request", json={"rid": rid}) as resp:
            body = await resp.text()
            return None if resp.status == 200 else f"abort_request HTTP {resp.status}: {body[:200]}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return f"abort_request {type(exc).__name__}: {exc}"[:300]


async def send_one(
    session: aiohttp.ClientSession, base_url: str, index: int, input_ids: list[int], params: dict, t0: float,
    *, abort_after_chunks: int | None = None, abort_via: str = "disconnect", rid: str | None = None,
) -> RequestResult:
    """One streaming /generate request.

    abort_after_chunks=k: abort the request on purpose once k chunks with tokens arrived (and it has
    not finished): ``abort_via="disconnect"`` closes the connection (SGLang aborts a disconnected
    stream), ``"endpoint"`` POSTs /abort_request with ``rid`` (sent as the request's rid) and reads on
    until the server ends the stream. Such a result has ``aborted=True`` and is neither ok nor an error
    (unless the abort POST itself failed).
    """
    if abort_after_chunks is not None:
        if int(abort_after_chunks) < 1:
            raise ValueError(f"abort_after_chunks must be >= 1, got {abort_after_chunks}")
        if abort_via not in ("disconnect", "endpoint"):
            raise ValueError(f"abort_via must be 'disconnect' or 'endpoint', got {abort_via!r}")
        if abort_via == "endpoint" and not rid:
            raise ValueError("abort_via='endpoint' needs a rid")
    res = RequestResult(index=index)
    start = time.perf_counter()
    res.start_s = start - t0
    payload = {"input_ids": input_ids, "sampling_params": params, "stream": True}
    if rid is not None:
        payload["rid"] = rid
    last_ids: list[int] = []
    concat: list[int] = []
    meta: dict = {}
    chunks = 0
    abort_sent = False
    try:
        async with session.post(base_url + "/generate", json=payload) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    if abort_sent:  # the server reports the abort we asked for as an error chunk
                        res.aborted, res.abort_landed = True, True
                        res.latency_s = time.perf_counter() - start
                        res.output_ids, res.completion_tokens = last_ids, len(last_ids)
                        return res
                    res.error = f"server error: {str(chunk['error'])[:300]}"
                    return res
                ids = chunk.get("output_ids") or []
                if ids and res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - start
                if ids:
                    chunks += 1
                last_ids = list(ids)
                concat.extend(ids)
                meta = chunk.get("meta_info") or meta
                if (abort_after_chunks is not None and not abort_sent and chunks >= abort_after_chunks
                        and not _finished(meta)):
                    if abort_via == "disconnect":
                        resp.close()  # drop the connection mid-stream: the server must abort the request
                        res.aborted, res.abort_landed = True, True
                        res.latency_s = time.perf_counter() - start
                        res.output_ids, res.completion_tokens = last_ids, len(last_ids)
                        return res
                    abort_sent = True
                    err = await _post_abort(session, base_url, rid)
                    if err:
                        res.error = err  # an HTTP failure of its own; the stream is still read to its end
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        if abort_sent:
            res.aborted, res.abort_landed = True, True
            return res
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        return res
    res.latency_s = time.perf_counter() - start
    n = int(meta.get("completion_tokens", len(last_ids)))
    # SGLang streams cumulative ids by default and deltas with --incremental-streaming-output.
    res.output_ids = last_ids if len(last_ids) == n or len(concat) != n else concat
    res.completion_tokens = n
    res.finish_reason = _parse_finish(meta)
    vct = meta.get("spec_verify_ct")
    res.spec_verify_ct = int(vct) if vct is not None else None
    correct = next((meta[k] for k in CORRECT_DRAFTS_KEYS if meta.get(k) is not None), None)
    res.spec_correct_drafts = int(correct) if correct is not None else None
    ct = meta.get("cached_tokens")
    res.cached_tokens = int(ct) if isinstance(ct, (int, float)) else None
    if abort_after_chunks is not None:
        # Intended abort: it finished before k chunks (not landed) or the server ended it with "abort".
        res.aborted = True
        res.abort_landed = res.finish_reason == "abort"
        return res
    if res.finish_reason == "abort":
        res.error = f"aborted: {meta.get('finish_reason')}"
    elif n == 0:
        res.error = "no tokens returned"
    else:
        res.ok = True
    return res


# Idle pooled connections are dropped after this many seconds, before the server's keep-alive
# timeout (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s) closes them: a request sent on a connection the server is
# closing fails with "Server disconnected" (aiohttp keeps them 15 s; pair1q-rows34 lost the first
# request of a low phase, sent on a connection idle since the high phase before it).
KEEPALIVE_S = 2.0


def _session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S),  # limit 0 = unlimited
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s),
    )


def _progress(total: int, desc: str):
    if tqdm is None or os.environ.get("DYNSPEC_BENCH_NO_PROGRESS"):
        return None
    # disable=None: bars only on a terminal, so captured logs stay readable.
    return tqdm(total=total, desc=desc, mininterval=5.0, leave=False, disable=None)


async def closed_loop(
    base_url: str, prompts: list[list[int]], concurrency: int, params: dict | list[dict],
    desc: str = "", timeout_s: float = 600.0,
) -> tuple[list[RequestResult], float]:
    """Keep exactly `concurrency` requests in flight until all prompts are served.

    ``params``: one sampling-params dict for every request, or a list with one per prompt."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    per_req = _params_for(params, len(prompts))
    results: list[RequestResult | None] = [None] * len(prompts)
    next_index = 0
    bar = _progress(len(prompts), desc)

    async def worker(session: aiohttp.ClientSession, t0: float) -> None:
        nonlocal next_index
        while next_index < len(prompts):
            i = next_index
            next_index += 1
            results[i] = await send_one(session, base_url, i, prompts[i], per_req[i], t0)
            if bar is not None:
                bar.update(1)

    async with _session(concurrency, timeout_s) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, t0) for _ in range(min(concurrency, len(prompts)))))
        wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return [r for r in results if r is not None], wall


async def open_loop(
    base_url: str, prompts: list[list[int]], arrivals_s: list[float], params: dict | list[dict],
    phases: list[str] | None = None, desc: str = "", timeout_s: float = 600.0,
) -> tuple[list[RequestResult], float]:
    """Send prompt i at arrivals_s[i] seconds after the start, whatever is still in flight.

    ``params``: one sampling-params dict for every request, or a list with one per arrival."""
    if len(arrivals_s) > len(prompts):
        raise ValueError(f"trace has {len(arrivals_s)} arrivals but only {len(prompts)} prompts")
    per_req = _params_for(params, len(arrivals_s))
    bar = _progress(len(arrivals_s), desc)

    async def one(session, i, t0):
        delay = t0 + arrivals_s[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        r = await send_one(session, base_url, i, prompts[i], per_req[i], t0)
        r.phase = phases[i] if phases else None
        if bar is not None:
            bar.update(1)
        return r

    async with _session(0, timeout_s) as session:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(session, i, t0) for i in range(len(arrivals_s))))
        wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return list(results), wall


# ---- traces ------------------------------------------------------------------------------
def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int = 0, start_s: float = 0.0) -> list[float]:
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError(f"rate_per_s and duration_s must be > 0, got {rate_per_s}, {duration_s}")
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return out
        out.append(start_s + t)


def phase_trace(phases: list[tuple[str, float, float]], seed: int = 0) -> tuple[list[float], list[str]]:
    """phases = [(label, duration_s, rate_per_s), ...] -> (arrival times, phase label per arrival)."""
    arrivals: list[float] = []
    labels: list[str] = []
    start = 0.0
    for k, (label, dur, rate) in enumerate(phases):
        part = poisson_arrivals(rate, dur, seed=seed * 1000 + k, start_s=start)
        arrivals += part
        labels += [label] * len(part)
        start += dur
    return arrivals, labels


def alternating_trace(low_rate: float, high_rate: float, phase_s: float, cycles: int, seed: int = 0):
    phases = []
    for c in range(cycles):
        phases.append((f"low{c}", phase_s, low_rate))
        phases.append((f"high{c}", phase_s, high_rate))
    return phase_trace(phases, seed)


def load_trace(path: str | Path) -> tuple[list[float], list[str] | None]:
    """JSON: a list of arrival seconds, or {"arrivals_s": [...], "phases": [...]} (phases optional)."""
    data = json.loads(Path(path).read_text())
    phases = None
    if isinstance(data, dict):
        phases = data.get("phases")
        data = data.get("arrivals_s")
    if not isinstance(data, list) or not all(isinstance(t, (int, float)) and t >= 0 for t in data):
        raise ValueError(f"{path}: 'arrivals_s' must be a list of non-negative numbers")
    if phases is not None and (not isinstance(phases, list) or len(phases) != len(data)):
        raise ValueError(f"{path}: 'phases' must be a list as long as 'arrivals_s'")
    order = sorted(range(len(data)), key=lambda i: data[i])
    return [float(data[i]) for i in order], ([str(phases[i]) for i in order] if phases else None)


# ---- summary -----------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no data."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    cuts = statistics.quantiles(vals, n=100, method="inclusive")
    if q <= 0:
        return vals[0]
    if q >= 100:
        return vals[-1]
    lo = int(q)
    if lo == q:
        return cuts[lo - 1]
    a = cuts[lo - 1] if lo >= 1 else vals[0]
    return a + (q - lo) * (cuts[lo] - a)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


# meta_info's accepted drafts of a request: SGLang 0.5.12+ (0.5.12-0.5.15 also under the second
# name), then 0.5.9-0.5.11.
CORRECT_DRAFTS_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")


def accept_length(r: RequestResult) -> float | None:
    """Tokens per speculative verify of one request: 1 + accepted drafts / verifies where the server
    reports its accepted drafts, else its own completion tokens / verifies.  The first counts
    speculative steps only; the second also counts the tokens of dynspec's plain batches, which
    SGLang does not count as verifies (6-14 on the H200 pair, pair1t-row1)."""
    if not r.spec_verify_ct:
        return None
    if r.spec_correct_drafts is not None:
        return 1.0 + r.spec_correct_drafts / r.spec_verify_ct
    return r.completion_tokens / r.spec_verify_ct


def mean_accept_length(results) -> float | None:
    """``accept_length`` averaged over the requests that ran speculative verifies (None: none did)."""
    vals = [a for a in (accept_length(r) for r in results if r.ok) if a is not None]
    return round(statistics.fmean(vals), 4) if vals else None


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    accept = mean_accept_length(ok)
    return {
        "output_tok_per_s": round(tokens / wall_s, 3) if wall_s > 0 else None,
        "tpot_p50_ms": _ms(percentile(tpots, 50)),
        "tpot_p99_ms": _ms(percentile(tpots, 99)),
        "ttft_p50_ms": _ms(percentile([r.ttft_s for r in ok], 50)),
        "accept_length": accept,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "completion_tokens": tokens,
        "wall_s": round(wall_s, 3),
    }


def summarize_by_phase(results: list[RequestResult], wall_s: float) -> dict:
    out = {}
    for label in dict.fromkeys(r.phase for r in results if r.phase is not None):
        part = [r for r in results if r.phase == label]
        span = max((r.start_s + (r.latency_s or 0)) for r in part) - min(r.start_s for r in part)
        out[label] = summarize(part, span if span > 0 else wall_s)
    return out


def first_errors(results: list[RequestResult], n: int = 3) -> list[str]:
    return [f"#{r.index}: {r.error}" for r in results if r.error][:n]


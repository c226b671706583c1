"""What a decode step and a prefill cost, per mode, as the controller measured them.

Two measurements, because they behave differently:

* **Decode steps** (``CostTable``): the wall time from one decode forward to the next batch,
  per mode and batch-size bucket.  Steady, so a fast average per bucket is right.
* **Prefills** (``PrefillMeter``): the prefill batches that run between decode steps, as seconds
  per admitted request, charged to the mode of the decode step before them, plus the workload's
  admitted requests per output token.  Prefill time comes in bursts (a whole batch of requests
  finishing at once), so it is tracked per request, not per step.

Why per request: how much prefill a user's traffic needs per output token is the workload's
(requests ÷ tokens), but how well those prefills batch depends on the mode.  Plain decode keeps
requests that started together finishing together (one big, cheap-per-request prefill), while
speculation accepts a different number of tokens per request and scatters finishing times into
many small prefills (measured on an H200 pair: ~22 ms per request alone vs ~5 ms in a batch of
ten).  A mode's cost per output token is then ``decode(bs)/(bs*accept) + prefill_per_request *
requests_per_token``.

Each rank measures locally (wall time, no GPU sync).  Policies only ever see a ``CostView``
built from values agreed across tensor-parallel ranks, so that every rank decides the same.
"""

from __future__ import annotations

import math
from typing import Sequence

EXACT_UP_TO = 16  # batch sizes up to this get a bucket each
PER_OCTAVE = 4  # above it, four buckets per doubling
MAX_BS = 8192
MIN_SAMPLES = 3  # a bucket is trusted after this many samples
PREFILL_MEMORY = 64.0  # requests: the prefill history of a mode fades over about this many
RATE_MEMORY = 256.0  # requests: requests-per-token fades over about this many
STRETCH_MIN_REQUESTS = 4.0  # a stretch's own prefill figure is trusted after this many requests


def bucket(bs: int) -> int:
    if bs <= EXACT_UP_TO:
        return bs
    return EXACT_UP_TO + math.ceil(PER_OCTAVE * math.log2(bs / EXACT_UP_TO))


NUM_BUCKETS = bucket(MAX_BS) + 1


class CostTable:
    """Decode-step time per mode and bucket: a mean that turns into an EMA once a bucket has history."""

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha
        n = NUM_BUCKETS
        # index 0 = off, 1 = on
        self.time = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]

    def observe(self, on: bool, bs: int, seconds: float) -> None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        c = self.count[m][b] + 1
        w = max(1.0 / c, self.alpha)
        self.time[m][b] += w * (seconds - self.time[m][b])
        self.mean_bs[m][b] += w * (bs - self.mean_bs[m][b])
        self.count[m][b] = c

    def estimate_local(self, on: bool, bs: int) -> float | None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        return self.time[m][b] if self.count[m][b] else None

    def to_vector(self) -> list[float]:
        """Flat vector for a SUM all-reduce: (time*has, bs*has, has, count) per mode and bucket."""
        out: list[float] = []
        for m in (0, 1):
            for b in range(NUM_BUCKETS):
                has = 1.0 if self.count[m][b] else 0.0
                out += (self.time[m][b] * has, self.mean_bs[m][b] * has, has, float(self.count[m][b]))
        return out


def _fade(memory: float, n: float) -> float:
    return (1.0 - 1.0 / memory) ** n


class PrefillMeter:
    """Prefill seconds per admitted request by mode, and admitted requests per output token.

    Per mode two figures: its fading history, and the current *stretch* (since the mode was
    last entered or a new load arrived).  The stretch matters for plain decode: it keeps the
    batching it inherits, so what it costs now says more than what it cost last time.
    """

    def __init__(self):
        self.hist_s = [0.0, 0.0]
        self.hist_n = [0.0, 0.0]
        self.stretch_s = [0.0, 0.0]
        self.stretch_n = [0.0, 0.0]
        self.rate_req = 0.0
        self.rate_tok = 0.0
        self._tokens_pending = 0.0

    def add_tokens(self, n: float) -> None:
        self._tokens_pending += n

    def observe(self, on: bool | None, seconds: float, requests: int) -> None:
        """A prefill of ``requests`` new requests took ``seconds``; ``on``: the mode before it
        (None: after an idle gap, a new load nobody's mode caused)."""
        if requests <= 0:
            return
        f = _fade(RATE_MEMORY, requests)
        self.rate_req = self.rate_req * f + requests
        self.rate_tok = self.rate_tok * f + self._tokens_pending
        self._tokens_pending = 0.0
        if on is None:
            return
        m = 1 if on else 0
        f = _fade(PREFILL_MEMORY, requests)
        self.hist_s[m] = self.hist_s[m] * f + seconds
        self.hist_n[m] = self.hist_n[m] * f + requests
        self.stretch_s[m] += seconds
        self.stretch_n[m] += requests

    def new_stretch(self, on: bool | None = None) -> None:
        """Forget the stretch figures of one mode (None: both)."""
        for m in ((0, 1) if on is None else (1 if on else 0,)):
            self.stretch_s[m] = 0.0
            self.stretch_n[m] = 0.0

    def to_vector(self) -> list[float]:
        return [*self.hist_s, *self.hist_n, *self.stretch_s, *self.stretch_n, self.rate_req, self.rate_tok]


PREFILL_VECTOR_LEN = 10


class CostView:
    """Agreed, read-only costs, with a per-mode linear fit (time = a + c*bs) for empty buckets."""

    __slots__ = ("time", "count", "mean_bs", "fit", "version", "prefill")

    def __init__(self, summed: Sequence[float] | None, version: int = 0, ranks: int = 1):
        n = NUM_BUCKETS
        self.time = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]
        self.version = version
        self.prefill = [0.0] * PREFILL_VECTOR_LEN
        if summed is None:  # filled by from_table
            return
        i = 0
        for m in (0, 1):
            for b in range(n):
                t, s, has, cnt = summed[i : i + 4]
                i += 4
                if has > 0:
                    self.time[m][b] = t / has
                    self.mean_bs[m][b] = s / has
                    self.count[m][b] = int(cnt / has)
        self.prefill = [x / ranks for x in summed[i : i + PREFILL_VECTOR_LEN]]
        self.fit = [self._fit(0), self._fit(1)]

    @classmethod
    def from_table(cls, table: CostTable, meter: PrefillMeter | None = None, version: int = 0) -> "CostView":
        """A single rank's view: copies of its own lists (no vector round trip)."""
        v = cls(None, version)
        v.time = [list(table.time[0]), list(table.time[1])]
        v.count = [list(table.count[0]), list(table.count[1])]
        v.mean_bs = [list(table.mean_bs[0]), list(table.mean_bs[1])]
        if meter is not None:
            v.prefill = meter.to_vector()
        v.fit = [v._fit(0), v._fit(1)]
        return v

    def _fit(self, m: int) -> tuple[float, float] | None:
        cnt, bs, tm = self.count[m], self.mean_bs[m], self.time[m]
        pts = [(bs[b], tm[b]) for b in range(NUM_BUCKETS) if cnt[b] >= MIN_SAMPLES]
        if len(pts) < 2:
            return None
        n = len(pts)
        sx = sum(p[0] for p in pts)
        sy = sum(p[1] for p in pts)
        sxx = sum(p[0] * p[0] for p in pts)
        sxy = sum(p[0] * p[1] for p in pts)
        den = n * sxx - sx * sx
        if den <= 0:
            return None
        c = (n * sxy - sx * sy) / den
        a = (sy - c * sx) / n
        # Step time never shrinks with more rows; a negative slope is noise.
        if c < 0:
            c, a = 0.0, sy / n
        return a, c

    def estimate(self, on: bool, bs: int) -> float | None:
        """Seconds per decode step (prefills excluded) in that mode at ``bs``; None when unknown."""
        m = 1 if on else 0
        b = bucket(min(bs, MAX_BS))
        if self.count[m][b] >= MIN_SAMPLES:
            return self.time[m][b]
        f = self.fit[m]
        if f is None:
            return None
        est = f[0] + f[1] * bs
        return est if est > 0 else None

    def samples(self, on: bool, bs: int) -> int:
        return self.count[1 if on else 0][bucket(min(bs, MAX_BS))]

    # --- prefills ----------------------------------------------------------------------
    def requests_per_token(self) -> float:
        """Admitted requests per output token (0.0 before any prefill was seen)."""
        req, tok = self.prefill[8], self.prefill[9]
        return req / tok if tok > 0 else 0.0

    def prefill_history(self, on: bool) -> float | None:
        m = 1 if on else 0
        s, n = self.prefill[m], self.prefill[2 + m]
        return s / n if n > 0 else None

    def stretch_requests(self, on: bool) -> float:
        return self.prefill[6 + (1 if on else 0)]

    def prefill_stretch(self, on: bool) -> float | None:
        m = 1 if on else 0
        s, n = self.prefill[4 + m], self.prefill[6 + m]
        return s / n if n >= STRETCH_MIN_REQUESTS else None

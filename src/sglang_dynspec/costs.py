"""Step-cost table: how long a decode step takes, per mode and batch-size bucket.

Each rank measures locally (wall time between consecutive decode steps, no GPU sync).
Policies only ever see a CostView built from values agreed across tensor-parallel ranks,
so that every rank decides the same.
"""

from __future__ import annotations

import math
from typing import Sequence

EXACT_UP_TO = 16  # batch sizes up to this get a bucket each
PER_OCTAVE = 4  # above it, four buckets per doubling
MAX_BS = 8192
MIN_SAMPLES = 3  # a bucket is trusted after this many samples


def bucket(bs: int) -> int:
    if bs <= EXACT_UP_TO:
        return bs
    return EXACT_UP_TO + math.ceil(PER_OCTAVE * math.log2(bs / EXACT_UP_TO))


NUM_BUCKETS = bucket(MAX_BS) + 1


class CostTable:
    """Local measurements: an average that turns into an EMA once a bucket has history.

    A step's cost has two parts: the decode interval itself (steady, tracked with ``alpha``)
    and the prefill time that ran before the next decode step (bursty: one large prefill every
    few hundred steps when a batch's requests finish together), tracked per step with the much
    slower ``extend_alpha`` so that one burst does not swing the estimate for the next steps.
    """

    def __init__(self, alpha: float = 0.1, extend_alpha: float = 0.005):
        self.alpha = alpha
        self.extend_alpha = extend_alpha
        n = NUM_BUCKETS
        # index 0 = off, 1 = on
        self.time = [[0.0] * n, [0.0] * n]
        self.extend = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]

    def observe(self, on: bool, bs: int, seconds: float, extend_seconds: float = 0.0) -> None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        c = self.count[m][b] + 1
        w = max(1.0 / c, self.alpha)
        self.time[m][b] += w * (seconds - self.time[m][b])
        we = max(1.0 / c, self.extend_alpha)
        self.extend[m][b] += we * (extend_seconds - self.extend[m][b])
        self.mean_bs[m][b] += w * (bs - self.mean_bs[m][b])
        self.count[m][b] = c

    def totals(self, m: int) -> list[float]:
        """Per-bucket step cost of mode index ``m``: decode interval + prefill share."""
        return [t + e for t, e in zip(self.time[m], self.extend[m])]

    def estimate_local(self, on: bool, bs: int) -> float | None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        return self.time[m][b] + self.extend[m][b] if self.count[m][b] else None

    def decode_local(self, on: bool, bs: int) -> float | None:
        """The decode-interval part alone (what a stall or idle gap is judged against)."""
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        return self.time[m][b] if self.count[m][b] else None

    def to_vector(self) -> list[float]:
        """Flat vector for a SUM all-reduce: (time*has, bs*has, has, count) per mode and bucket."""
        out: list[float] = []
        for m in (0, 1):
            total = self.totals(m)
            for b in range(NUM_BUCKETS):
                has = 1.0 if self.count[m][b] else 0.0
                out += (total[b] * has, self.mean_bs[m][b] * has, has, float(self.count[m][b]))
        return out


class CostView:
    """Agreed, read-only costs, with a per-mode linear fit (time = a + c*bs) for empty buckets."""

    __slots__ = ("time", "count", "mean_bs", "fit", "version")

    def __init__(self, summed: Sequence[float] | None, version: int = 0):
        n = NUM_BUCKETS
        self.time = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]
        self.version = version
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
        self.fit = [self._fit(0), self._fit(1)]

    @classmethod
    def from_table(cls, table: CostTable, version: int = 0) -> "CostView":
        """A single rank's view: copies of its own lists (no vector round trip)."""
        v = cls(None, version)
        v.time = [table.totals(0), table.totals(1)]
        v.count = [list(table.count[0]), list(table.count[1])]
        v.mean_bs = [list(table.mean_bs[0]), list(table.mean_bs[1])]
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
        """Seconds per decode step in that mode at batch size ``bs``; None when unknown."""
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

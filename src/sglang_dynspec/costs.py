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
from statistics import fmean, linear_regression, median
from typing import Sequence

EXACT_UP_TO = 16  # batch sizes up to this get a bucket each
PER_OCTAVE = 4  # above it, four buckets per doubling
MAX_BS = 8192
MIN_SAMPLES = 3  # a bucket is trusted after this many samples
RATE_MEMORY = 256.0  # requests: requests-per-token fades over about this many
STRETCH_MIN_REQUESTS = 4.0  # a stretch's own prefill figure is trusted after this many requests
ARRIVAL_TAU_S = 1.0  # seconds: the admission rate is a moving average over about this long
FAR_BEYOND = 4.0  # a batch this many times the largest timed one is beyond what a fit can say
SHARED_ROWS = 4  # speculation's floor charges a request's verify rows as at most this many plain rows
#                  up to FAR_BEYOND x its largest timed batch (see CostView._verify_floor)


def bucket(bs: int) -> int:
    if bs <= EXACT_UP_TO:
        return bs
    return EXACT_UP_TO + math.ceil(PER_OCTAVE * math.log2(bs / EXACT_UP_TO))


NUM_BUCKETS = bucket(MAX_BS) + 1


FIRST_SAMPLES = 5  # a bucket's first samples: their median, not their mean
WARMUP_FACTOR = 5.0  # a first sample this many times the bucket's fastest is a warm-up, not a step


def first_estimate(samples: Sequence[float]) -> float:
    """A bucket's time from its first samples: the median of those within WARMUP_FACTOR x the fastest.

    Warm-ups (kernel compilation, a first graph replay) only ever make a step slower, so the fastest
    sample anchors the estimate.  A plain median was not enough: a server's first two speculative
    steps took 676 and 117 ms, the next two 6.7 and 6.2 ms, and the median of four, 62 ms, stayed the
    bs-1 estimate for the rest of the run (the policy saw speculation at 28 tokens/s where it
    delivers ~300 and never tried it in row 4's low phases; H200, pair1r-rows34).
    """
    timed = [s for s in samples if s > 0.0] or list(samples)  # a zero is a clock's rounding, no step
    fastest = min(timed)
    return median([s for s in timed if s <= WARMUP_FACTOR * fastest])


class CostTable:
    """Decode-step time per mode and bucket: a robust median of its first few samples, then an EMA.

    The first samples are where warm-ups land: the first step at a new batch size can compile
    kernels (a 419 ms step among 7 ms ones was seen on the H200), and a mean would keep that mode
    looking slow at that batch size for as long as the policy avoids it there (``first_estimate``).
    """

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha
        n = NUM_BUCKETS
        # index 0 = off, 1 = on
        self.time = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]
        self._first: list[list[list[float]]] = [[[] for _ in range(n)], [[] for _ in range(n)]]

    def observe(self, on: bool, bs: int, seconds: float) -> None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        c = self.count[m][b] + 1
        w = max(1.0 / c, self.alpha)
        if c <= FIRST_SAMPLES:
            first = self._first[m][b]
            first.append(seconds)
            self.time[m][b] = first_estimate(first)
            if c == FIRST_SAMPLES:
                self._first[m][b] = []
        else:
            self.time[m][b] += w * (seconds - self.time[m][b])
        self.mean_bs[m][b] += w * (bs - self.mean_bs[m][b])
        self.count[m][b] = c

    def estimate_local(self, on: bool, bs: int) -> float | None:
        b = bucket(min(bs, MAX_BS))
        m = 1 if on else 0
        return self.time[m][b] if self.count[m][b] else None

    def samples(self, on: bool, bs: int) -> int:
        return self.count[1 if on else 0][bucket(min(bs, MAX_BS))]

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


BATCH_MEMORY = 32.0  # prefill batches: a mode's batching history fades over about this many
BATCH_SAMPLES = 5  # a batch size's time is the median of its last this many batches
MATCHED_SAMPLES = 3  # a size's batches of both modes enter their ratio once each mode had this many


class PrefillMeter:
    """How long a prefill batch of n requests takes, how many requests each mode's prefill batches
    hold, and admitted requests per output token.

    The time of a batch depends on n, not on the mode (the same forward runs), so it is learnt
    from every batch: per batch-size bucket, the median of the last few (the first batch of a new
    shape compiles kernels and took 10x longer on the H200).  What the mode changes is n: after plain decode a
    whole batch of requests may finish at once, after speculation they finish one by one.  Per
    mode, the mean batch size has a fading history and a current *stretch* (since the mode was
    entered or a new load arrived); plain decode keeps the batching it inherits, so its stretch
    says more than its history.  Counts are rank-identical; only the times are local.
    """

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        n = NUM_BUCKETS
        self.time = [0.0] * n
        self.mean_n = [0.0] * n
        self.count = [0] * n
        self._recent: list[list[float]] = [[] for _ in range(n)]
        self.hist_req = [0.0, 0.0]
        self.hist_batches = [0.0, 0.0]
        self.stretch_req = [0.0, 0.0]
        self.stretch_batches = [0.0, 0.0]
        self.rate_req = 0.0
        self.rate_tok = 0.0
        self._tokens_pending = 0.0
        self._recent_on: list[list[bool]] = [[] for _ in range(n)]  # the mode behind each of _recent
        # the same batch times per mode of the decode step before them (CostView.mode_factor)
        self.mode_time = [[0.0] * n, [0.0] * n]
        self.mode_count = [[0] * n, [0] * n]
        self._mode_recent: list[list[list[float]]] = [[[] for _ in range(n)], [[] for _ in range(n)]]
        # admitted requests per wall second, idle time included (see admit)
        self._arrivals = 0.0
        self._arrivals_t: float | None = None
        self._arrivals_since: float | None = None

    def admit(self, requests: int, now: float) -> None:
        """``requests`` were admitted at clock ``now``: the load's arrival rate, measured over
        wall time with the server's idle gaps in it (a decode batch size cannot say how often
        requests come when the server is idle between them)."""
        if self._arrivals_t is None:
            self._arrivals_t = self._arrivals_since = now
        self._arrivals = self._arrivals * math.exp(-(now - self._arrivals_t) / ARRIVAL_TAU_S) + requests
        self._arrivals_t = now

    def arrival_rate(self, now: float) -> float | None:
        """Admitted requests per second at ``now`` (None before any were)."""
        if self._arrivals_t is None:
            return None
        # corrected for a start of the average less than ARRIVAL_TAU_S ago (an average from zero)
        seen = 1.0 - math.exp(-max(now - self._arrivals_since, 1e-3) / ARRIVAL_TAU_S)
        return self._arrivals * math.exp(-max(now - self._arrivals_t, 0.0) / ARRIVAL_TAU_S) / (ARRIVAL_TAU_S * seen)

    def add_tokens(self, n: float) -> None:
        self._tokens_pending += n

    def observe(self, on: bool | None, seconds: float | None, requests: int, stretch: bool = True) -> None:
        """Prefill batches admitting ``requests`` took ``seconds`` (None: unknown) after a decode
        step of mode ``on`` (None: after an idle gap, a new load no mode caused); ``stretch``:
        they belong to that mode's current stretch (not to one a switch has ended since)."""
        if requests <= 0:
            return
        f = _fade(RATE_MEMORY, requests)
        self.rate_req = self.rate_req * f + requests
        self.rate_tok = self.rate_tok * f + self._tokens_pending
        self._tokens_pending = 0.0
        if seconds is not None and seconds > 0:
            b = bucket(min(requests, MAX_BS))
            c = self.count[b] + 1
            recent, modes = self._recent[b], self._recent_on[b]
            recent.append(seconds)
            modes.append(bool(on))
            if len(recent) > BATCH_SAMPLES:
                del recent[0], modes[0]
            self.time[b] = median(recent)
            self.mean_n[b] += max(1.0 / c, self.alpha) * (requests - self.mean_n[b])
            self.count[b] = c
        if on is None:
            return
        m = 1 if on else 0
        if seconds is not None and seconds > 0:
            recent = self._mode_recent[m][b]
            recent.append(seconds)
            if len(recent) > BATCH_SAMPLES:
                del recent[0]
            self.mode_time[m][b] = median(recent)
            self.mode_count[m][b] += 1
        f = _fade(BATCH_MEMORY, 1)
        self.hist_req[m] = self.hist_req[m] * f + requests
        self.hist_batches[m] = self.hist_batches[m] * f + 1.0
        if stretch:
            self.stretch_req[m] += requests
            self.stretch_batches[m] += 1.0

    def new_stretch(self, on: bool | None = None) -> None:
        """Forget the stretch figures of one mode (None: both)."""
        for m in ((0, 1) if on is None else (1 if on else 0,)):
            self.stretch_req[m] = 0.0
            self.stretch_batches[m] = 0.0

    def to_vector(self, now: float | None = None) -> list[float]:
        """Flat vector for a SUM all-reduce; ``now``: the clock the arrival rate is read at."""
        out: list[float] = []
        for b in range(NUM_BUCKETS):
            has = 1.0 if self.count[b] else 0.0
            out += (self.time[b] * has, self.mean_n[b] * has, has)
        for b in range(NUM_BUCKETS):
            modes = self._recent_on[b]
            out.append(sum(modes) / len(modes) if modes else 0.0)  # rank-identical
            for m in (0, 1):
                has = 1.0 if self.mode_count[m][b] else 0.0
                out += (self.mode_time[m][b] * has, has, float(min(self.mode_count[m][b], BATCH_SAMPLES)))
        rate = self.arrival_rate(now) if now is not None else None
        return out + [*self.hist_req, *self.hist_batches, *self.stretch_req, *self.stretch_batches,
                      self.rate_req, self.rate_tok, -1.0 if rate is None else rate]


PREFILL_COUNTS = 11  # hist_req, hist_batches, stretch_req, stretch_batches (x2 modes), rate_req, rate_tok, arrivals/s
PREFILL_VECTOR_LEN = 10 * NUM_BUCKETS + PREFILL_COUNTS


class CostView:
    """Agreed, read-only costs: decode steps with a per-mode linear fit (time = a + c*bs) for
    empty buckets; prefill batches interpolated between the measured sizes.

    ``verify_rows``: target rows a speculative step verifies per request (the server's
    ``speculative_num_draft_tokens``; None when unknown).  It bounds how cheaply speculation may be
    extrapolated to batches larger than any it ran at (see ``estimate``)."""

    __slots__ = ("time", "count", "mean_bs", "fit", "version", "prefill", "batch_points", "batch_fit", "per_request",
                 "verify_rows", "timed_span", "mode_factor", "arrivals_per_s")

    def __init__(self, summed: Sequence[float] | None, version: int = 0, ranks: int = 1,
                 verify_rows: int | None = None):
        self.verify_rows = verify_rows
        n = NUM_BUCKETS
        self.time = [[0.0] * n, [0.0] * n]
        self.count = [[0] * n, [0] * n]
        self.mean_bs = [[0.0] * n, [0.0] * n]
        self.version = version
        self.prefill = [0.0] * PREFILL_COUNTS
        self.batch_points: list[tuple[float, float]] = []
        self.batch_fit = None
        self.per_request: tuple[float, float | None] = (0.0, None)
        self.mode_factor = [1.0, 1.0]
        self.arrivals_per_s: float | None = None
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
        self._set_prefill(summed[i : i + PREFILL_VECTOR_LEN], ranks)
        self._derive()

    @classmethod
    def from_table(cls, table: CostTable, meter: PrefillMeter | None = None, version: int = 0,
                   verify_rows: int | None = None, now: float | None = None) -> "CostView":
        """A single rank's view: copies of its own lists (no vector round trip); ``now``: the
        clock the meter's arrival rate is read at (None: no rate)."""
        v = cls(None, version, verify_rows=verify_rows)
        v.time = [list(table.time[0]), list(table.time[1])]
        v.count = [list(table.count[0]), list(table.count[1])]
        v.mean_bs = [list(table.mean_bs[0]), list(table.mean_bs[1])]
        v._set_prefill(meter.to_vector(now) if meter is not None else None, 1)
        v._derive()
        return v

    def _set_prefill(self, vec: Sequence[float] | None, ranks: int) -> None:
        """Measured batch times per bucket (each averaged over the ranks that have it), a line
        a + c*n through them for sizes beyond the measured ones, and the rank-averaged counts."""
        self.batch_fit = None
        self.batch_points = []
        if vec is None:
            self.prefill = [0.0] * PREFILL_COUNTS
            self.per_request = (0.0, None)
            return
        pts = []
        for b in range(NUM_BUCKETS):
            t, n, has = vec[3 * b : 3 * b + 3]
            if has > 0:
                pts.append((n / has, t / has))
        i = 3 * NUM_BUCKETS
        self.mode_factor = _mode_factors(vec[i : i + 7 * NUM_BUCKETS], ranks)
        self.prefill = [x / ranks for x in vec[i + 7 * NUM_BUCKETS :]]
        rate = self.prefill[10]
        self.arrivals_per_s = rate if rate >= 0 else None
        self.batch_points = sorted(pts)
        if len(pts) == 1:
            self.batch_fit = (pts[0][1], 0.0)  # one size seen: a fixed cost per batch
        elif pts:
            self.batch_fit = _line(pts)
        self.per_request = self._choose_per_request()

    def _choose_per_request(self) -> tuple[float, float | None]:
        """(off, on) prefill seconds per admitted request from the batching each mode had: plain
        decode its current stretch, else its history, else speculation's; speculation its history
        (None without one: see ``prefill_per_request``); 0.0 before any prefill was timed."""
        p_on = self.prefill_history(True)
        p_off = self.prefill_stretch(False)
        if p_off is None:
            p_off = self.prefill_history(False)
        if p_off is not None:
            p_off *= self.mode_factor[0]
        elif p_on is not None:
            p_off = p_on * self.mode_factor[0]  # both from the shared table
        else:
            p_off = 0.0
        if p_on is not None:
            p_on *= self.mode_factor[1]
        return p_off, p_on

    def prefill_per_request(self, on: bool, bs: int = 1, accept: float = 1.0) -> float:
        """Prefill seconds per admitted request to expect in that mode at decode batch ``bs`` (and,
        speculating, acceptance ``accept``): the figure a policy should use.

        Speculation without a batching history of its own gets its steady state, not plain
        decode's figure: it scatters finishing times, so each of its steps admits about the
        requests that finished in it (``refill_per_request``).  Plain decode's history holds the
        waves it keeps in step; lent to speculation it priced its prefills at ~4 ms per request
        where they took ~16 (H200 pair, pair1t-row1, C=30: speculation chosen at 0.81x).

        Speculation's figure is never below plain decode's: the same forward plus the draft's
        extend, and finishing times it scatters; a lower measurement is noise (single batches
        vary by 2x)."""
        p_off = self.per_request[0]
        if not on:
            return p_off
        p_on = self.per_request[1]
        if p_on is None:
            refill = self.refill_per_request(max(bs, 1) * max(accept, 1.0) * self.requests_per_token())
            p_on = p_off / self.mode_factor[0] * self.mode_factor[1] if refill is None else refill * self.mode_factor[1]
        return max(p_on, p_off)

    def wave_per_request(self, bs: int) -> float:
        """Plain decode's prefill seconds per request at its best batching at decode batch ``bs``:
        the whole batch finishing together and refilled in one prefill batch (0.0 before any
        prefill was timed).  A closed loop of ``bs`` requests cannot batch its refills better.

        A bound for exploring, so beyond the largest batch timed the extra requests are free: the
        line through small batches (~20 ms per request through sizes 1-3 in the H200 traces) put a
        batch of ten at 200 ms where it took ~50 (``batch_seconds``' slope), and ruled out trials
        that plain decode won."""
        if not self.batch_points:
            return 0.0
        bs = max(bs, 1)
        return self.batch_seconds(min(bs, self.batch_points[-1][0])) / bs * self.mode_factor[0]

    def refill_per_request(self, finished_per_step: float) -> float | None:
        """Seconds per request of the prefill batches that replace requests finishing at random,
        ``finished_per_step`` per decode step on average (None before any prefill was timed).  A
        step with any finished holds lam / (1 - exp(-lam)) of them on average (Poisson), at
        least one."""
        lam = finished_per_step
        n = lam / -math.expm1(-lam) if lam > 1e-9 else 1.0
        return self._per_request(n)

    def _derive(self) -> None:
        """What every estimate reads, once per view: the fits, and each mode's smallest and largest
        timed bucket (None: none timed)."""
        self.fit = [self._fit(0), self._fit(1)]
        self.timed_span = [self._span(0), self._span(1)]

    def _span(self, m: int) -> tuple[int, int] | None:
        timed = [b for b in range(NUM_BUCKETS) if self.count[m][b] >= MIN_SAMPLES]
        return (timed[0], timed[-1]) if timed else None

    def _fit(self, m: int) -> tuple[float, float] | None:
        cnt, bs, tm = self.count[m], self.mean_bs[m], self.time[m]
        pts = [(bs[b], tm[b]) for b in range(NUM_BUCKETS) if cnt[b] >= MIN_SAMPLES]
        if len(pts) < 2 or len({p[0] for p in pts}) < 2:
            return None
        return _line(pts)

    def estimate(self, on: bool, bs: int) -> float | None:
        """Seconds per decode step (prefills excluded) in that mode at ``bs``; None when unknown.

        Speculation above the largest batch it was timed at costs at least its time there plus,
        per extra request, what ``verify_rows`` extra rows cost plain decode (``_verify_floor``):
        its verify runs that many target rows per request.  Its own fit cannot say so: small batches are
        CPU-bound and nearly flat (on the H200 pair the fit through bs 1-8 was 6.5 ms + 0.0 ms per
        row, and put a bs-250 step at 6.5 ms where it took ~30 ms; the policy then speculated at
        C=250, scattered the finishing times and stayed there at 0.64x of plain decode)."""
        m = 1 if on else 0
        b = bucket(min(bs, MAX_BS))
        if self.count[m][b] >= MIN_SAMPLES:
            return self.time[m][b]
        f = self.fit[m]
        est = f[0] + f[1] * bs if f is not None else None
        if on:
            floor = self._verify_floor(bs)
            if floor is not None and (est is None or floor > est):
                est = floor
        return est if est is not None and est > 0 else None

    def timed_around(self, on: bool, bs: int) -> bool:
        """Whether that mode's estimate at ``bs`` rests on measurement: its bucket was timed, or
        buckets below and above it were (the fit then interpolates between sizes it saw)."""
        span = self.timed_span[1 if on else 0]
        return span is not None and span[0] <= bucket(min(bs, MAX_BS)) <= span[1]

    def speculation_extrapolated(self, bs: int) -> bool:
        """Whether ``bs`` lies far above the largest batch speculation was timed at (more than
        FAR_BEYOND times it), where its estimate is a fit or floor carried well past what was
        measured.  A little past it the fit holds (the shared traces' C=5 after bs 1-2)."""
        top = self._on_top_bs()
        return top is None or bs > FAR_BEYOND * top

    def _verify_floor(self, bs: int) -> float | None:
        """Speculation's least plausible step time at ``bs`` above its largest timed batch (None
        below it, or without ``verify_rows`` or a plain-decode slope).

        Up to FAR_BEYOND x that batch, a request's verify rows cost at most SHARED_ROWS plain
        rows: they share the request's KV reads, most of what a plain row adds.  Charged in full,
        a 16-row tree on the H100 (pair2h-row2, topk 4) put a bs-30 step at 20.5 ms from bs 8's
        6.4 ms where it took 11.4 (pair2i-row2's median), and kept C=30 plain at 0.88x of `on`.
        Farther up every row is charged, leaning towards plain decode where speculation's cost is
        least known (the rows' compute grows there too: bs 100 x 16 rows is a prefill-sized
        forward)."""
        if not self.verify_rows or self.fit[0] is None:
            return None
        top = self._on_top_bs()
        if top is None or bs <= top:
            return None
        plain_row_s = self.fit[0][1]  # plain decode's slope: seconds per extra row
        edge = FAR_BEYOND * top
        near, far = min(bs, edge) - top, max(bs - edge, 0.0)
        rows = self.verify_rows
        return self.time[1][self.timed_span[1][1]] + plain_row_s * (min(rows, SHARED_ROWS) * near + rows * far)

    def _on_top_bs(self) -> float | None:
        """The mean batch size of speculation's largest timed bucket (None: never timed)."""
        span = self.timed_span[1]
        return None if span is None else self.mean_bs[1][span[1]]

    def samples(self, on: bool, bs: int) -> int:
        return self.count[1 if on else 0][bucket(min(bs, MAX_BS))]

    # --- prefills ----------------------------------------------------------------------
    def requests_per_token(self) -> float:
        """Admitted requests per output token (0.0 before any prefill was seen)."""
        req, tok = self.prefill[8], self.prefill[9]
        return req / tok if tok > 0 else 0.0

    def batch_seconds(self, batch_size: float) -> float | None:
        """Seconds of a prefill batch of ``batch_size`` requests: interpolated between the measured
        sizes around it; beyond them, the nearest measured size plus the line's slope.

        Not the line alone: batch time is far from linear in n (on the H200 pair one request took
        ~30 ms, ten ~50 ms, seventy ~150 ms), and a line through all of them put one request at
        ~60 ms, which made speculation (whose prefills come one at a time) look 25 % slower at
        C=5-10 than it was."""
        pts = self.batch_points
        if not pts or batch_size <= 0:
            return None
        slope = self.batch_fit[1] if self.batch_fit is not None else 0.0
        if batch_size <= pts[0][0]:
            n0, t0 = pts[0]
            return max(t0 - slope * (n0 - batch_size), 0.0)
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if batch_size <= n1:
                w = (batch_size - n0) / (n1 - n0) if n1 > n0 else 1.0
                return t0 + w * (t1 - t0)
        n1, t1 = pts[-1]
        return t1 + slope * (batch_size - n1)

    def _per_request(self, batch_size: float) -> float | None:
        t = self.batch_seconds(batch_size)
        return None if t is None else t / batch_size

    def batch_size_history(self, on: bool) -> float | None:
        m = 1 if on else 0
        req, batches = self.prefill[m], self.prefill[2 + m]
        return req / batches if batches > 0 else None

    def batch_size_stretch(self, on: bool) -> float | None:
        """Requests per prefill batch in this mode's current stretch, once it has seen a few."""
        m = 1 if on else 0
        req, batches = self.prefill[4 + m], self.prefill[6 + m]
        return req / batches if req >= STRETCH_MIN_REQUESTS and batches > 0 else None

    def stretch_requests(self, on: bool) -> float:
        return self.prefill[4 + (1 if on else 0)]

    def prefill_history(self, on: bool) -> float | None:
        """Prefill seconds per admitted request at the batching this mode had lately."""
        n = self.batch_size_history(on)
        return None if n is None else self._per_request(n)

    def prefill_stretch(self, on: bool) -> float | None:
        """The same at the batching of its current stretch, once that has seen a few requests."""
        n = self.batch_size_stretch(on)
        return None if n is None else self._per_request(n)


def _mode_factors(vec: Sequence[float], ranks: int) -> list[float]:
    """(off, on) multipliers of the shared batch-time table: speculation's prefill batches over
    plain decode's of the same size, R (the count-weighted geometric mean over the sizes both modes
    ran MATCHED_SAMPLES times or more, at least 1.0), shared between them by how much of the
    table each mode's batches make: a table of plain batches only is plain decode's (1, R).

    The forward is the same, the work around it is not: speculation also extends the draft model
    and drafts the first tokens, where plain decode writes the draft's KV in one light pass.  On the
    H200 pair after 97b757f (pair1z-rows34) a speculating server's batches of one and two requests
    took 1.5x a plain one's (25 vs 16, 48 vs 31 ms medians), and a table shared by both modes
    priced plain decode's prefills at speculation's in the high phases, where the policy then
    speculated at 0.6-0.7x.  Earlier builds measured 1.0-1.4x.  Medians, because single batches
    vary by 2x; sizes both modes ran, because the table's sizes are one mode's or the other's.
    At least 1.0: the same forward plus more work is never cheaper, so a lower median is noise.
    Not restarted with each load: a high phase's first decision after its plain trial has no
    speculative batch of that load, and pricing speculation's at plain decode's there speculated
    into 18 ms per request against 10 (H100, pair2d-rows34, 1.8x `off`'s TPOT).  The cost is that a
    ratio from one-request batches of a low phase can overprice them (pair2c-rows34's first high phase)."""
    num = den = share = weight = 0.0
    for b in range(NUM_BUCKETS):
        on_share, t0, has0, c0, t1, has1, c1 = vec[7 * b : 7 * b + 7]
        c0 = c0 / has0 if has0 > 0 else 0.0
        c1 = c1 / has1 if has1 > 0 else 0.0
        n_table = max(c0, c1)  # the shared table keeps as many recent batches as the fuller mode
        share += (on_share / ranks) * n_table
        weight += n_table
        if c0 >= MATCHED_SAMPLES and c1 >= MATCHED_SAMPLES and t0 > 0 and t1 > 0:
            w = min(c0, c1)
            num += w * math.log((t1 / has1) / (t0 / has0))
            den += w
    if den == 0.0:
        return [1.0, 1.0]
    ratio = max(math.exp(num / den), 1.0)
    on_share = share / weight if weight > 0 else 0.0
    return [ratio ** -on_share, ratio ** (1.0 - on_share)]


def _line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares a + c*x, slope kept >= 0 (more rows never cost less)."""
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    if len(set(xs)) < 2:
        return fmean(ys), 0.0
    c, a = linear_regression(xs, ys)
    return (a, c) if c >= 0 else (fmean(ys), 0.0)

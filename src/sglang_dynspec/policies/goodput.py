"""Pick the mode that delivers more output tokens per wall-second, prefills included.

Seconds per output token of each mode at this decode batch size ``bs``::

    on:  decode_on(bs)  / (bs * accept_length) + prefill_on  * requests_per_token
    off: decode_off(bs) / bs                   + prefill_off * requests_per_token

``decode_*`` are the agreed decode-step times, ``prefill_*`` the seconds a prefill costs per
admitted request after steps of that mode (speculation's at least plain decode's),
``requests_per_token`` the workload's (costs.py).  That admits as many requests as finish; an open
load below capacity admits fewer, as many as arrive per second (``per_token``), and then a mode is
charged what its step stretches by, not its own prefills.  An open load above what the running mode
makes at this batch (its batch grows) judges both modes by the TPOT each would settle at under the
arriving demand (``_behind``).
Plain decode keeps requests that started together finishing together, so its prefills batch
well only if it has been running since they started: its prefill figure is the one of its
current stretch once that has seen a few requests.  Speculation scatters finishing times, so
its figure is its history, and without one its steady state, never plain decode's waves
(``CostView.prefill_per_request``).

Exploration is bounded: speculation first until acceptance is known, then one short stretch of
plain decode; a *plain trial* of about one request lifetime when a burst of new requests
arrives and plain decode could win if it batches their successors well (the only way to learn
that), or, where plain decode was never timed at that batch size, until it is; after
``reprobe_near`` plain steps a short speculative probe if the modes are within two margins
(acceptance is not measured while off; the dip that decided it may be gone); after ``reprobe_every``
plain steps one if speculation could win with 1.5x today's acceptance (after 4x as long in any
case, in case its costs are stale), and the same hopeful probe after a quarter of ``reprobe_near``
plain steps when the batch drained and a new one began; none but the stale one while plain decode refills in
waves (a probe would scatter them for good in a closed loop).  A probe speculates for at least
``PROBE_ROWS`` request-steps before it is judged (its acceptance is measured, not guessed), then
stays only if speculation leads by the margin.  Hysteresis (``margin``), a lead averaged over ``persist``
decisions and ``min_dwell`` stop flapping; where the modes tie, switches that reverse recent ones
and probes the model turns back make the next one wait longer.  The end of a trial is judged
without the margin, so a toss-up speculates, where speculation was timed at that batch size or
larger (else its estimate is an extrapolation, and a toss-up stays plain).
"""

from __future__ import annotations

import math

from pydantic import Field

from ..costs import STRETCH_MIN_REQUESTS
from .base import PolicyArgs, StepInputs, parse_args

REPROBE_ACCEPT_FACTOR = 1.5  # a probe is worth it only if this much more acceptance would win
STALE_PROBE_FACTOR = 4  # ... or after this many reprobe intervals, whatever the estimates say
BATCH_MOVED = 2.0  # a batch this many times larger or smaller than at the last switch ends the dwell
FLIP_WINDOW = 512  # decode steps: a switch this soon after the previous one reverses it ...
MAX_FLIPS = 3  # ... and doubles the decisions the next switch must wait for, up to 2**3 times
PROBES = ("probe", "recheck", "fresh")  # the reasons that start a speculative probe from plain decode
PROBE_ROWS = 64  # request-steps a probe speculates at least before the model may end it (see _decide)
PROBE_DECISIONS = 4  # ... and model decisions (no dwell): at bs 70 in a high phase of pair1z-rows34 a
#                      probe's dwell and average took 23 steps of 52 ms where plain steps took 8
FRESH_SHARE = 4  # a fresh batch's probe waits reprobe_near / FRESH_SHARE plain steps: its requests are all new,
#                 so the acceptance learnt on earlier ones says little (pair2a-rows34, low0: 3 s of plain
#                 decode on 1.93 learnt from other prompts, where the phase's greedy acceptance was 2.4)
# The demand rule (seconds_per_token): it applies while the running mode makes less than the arrivals
# ask for by more than DEMAND_SLACK, the batch is over DEMAND_GROWING x its average over about
# DEMAND_SLOW_STEPS steps (it grows), and no burst came within those steps.  Each mode is then judged
# at that demand plus DEMAND_BURST_SD standard deviations of a second's arrivals, at the batch sizes
# DEMAND_GROWTH apart up to DEMAND_MAX_BS (a mode short of it there cannot keep up).
DEMAND_SLACK = 0.05
DEMAND_GROWING = 1.25
DEMAND_SLOW_STEPS = 64
DEMAND_BURST_SD = 1.5
DEMAND_GROWTH = 2 ** 0.25
DEMAND_MAX_BS = 1024
DEMAND_TPOT_CAP_S = 10.0  # a mode that makes no tokens at all is charged this TPOT (a finite lead)
REFILL_WAVE = 4.0  # plain decode's prefill batches admit this many requests on average, or more: its
#                   refills come in waves, which a probe would scatter (see _probe_scatters)


def open_load_capacity(step_s: float, tokens_per_step: float, prefill_s: float, lam: float) -> float:
    """Output tokens per wall-second a mode makes while ``lam`` requests per second arrive, each
    costing ``prefill_s`` between steps: the steps get what the prefills leave of each second."""
    return max(0.0, 1.0 - lam * prefill_s) * tokens_per_step / step_s


def per_token(step_s: float, tokens_per_step: float, prefill_s: float, rho: float, lam: float | None) -> float:
    """Seconds per output token of a mode whose decode step takes ``step_s`` and yields
    ``tokens_per_step``, with ``prefill_s`` per admitted request between steps.

    Requests are admitted either as fast as they finish (a closed loop, or a queue: the
    requests per token ``rho`` of every token made) or as fast as they arrive, ``lam`` per
    wall second, whichever is fewer per step.  The second is what an open load below the
    server's capacity does: at one request per second on the H200 pair, a lone speculating
    request admits another about once in 140 steps, where refilling every finished one would
    charge it its own prefill (~26 ms) over its ~60 tokens, 17 % of its TPOT, and made plain
    decode look as fast at 2-3 requests as speculation, which was 1.3x faster there (pair1z-rows34).
    With ``lam`` the step stretches to ``step_s / (1 - lam * prefill_s)``."""
    refill = step_s / tokens_per_step + prefill_s * rho
    capacity = open_load_capacity(step_s, tokens_per_step, prefill_s, lam) if lam is not None else 0.0
    return min(refill, 1.0 / capacity) if capacity > 0.0 else refill


class GoodputArgs(PolicyArgs):
    margin: float = Field(0.05, ge=0.0, lt=1.0, description="relative gain needed to switch mode")
    min_dwell: int = Field(16, ge=0, description="decode steps to stay in a mode before switching")
    min_accept_samples: int = Field(8, ge=1, description="speculative steps before acceptance is trusted")
    reprobe_every: int = Field(2000, ge=1, description="plain steps after which speculation may be probed again")
    trial_lifetimes: float = Field(1.25, gt=0.0, le=10.0,
                                   description="length of a plain trial after a burst, in request lifetimes")
    trial_max_steps: int = Field(4096, ge=1, description="upper bound of a plain trial, in decode steps")
    persist: int = Field(8, ge=1, description="model decisions over which the other mode's lead is averaged "
                                              "before a switch (and the fewest it takes)")
    reprobe_near: int = Field(256, ge=1, description="plain steps after which speculation is probed again "
                                                       "when the estimates are within 2 margins")


class Goodput:
    name = "goodput"

    def __init__(self, args: dict):
        a = parse_args(GoodputArgs, args, self.name)
        self.margin = a.margin
        self.min_dwell = a.min_dwell
        self.min_accept = a.min_accept_samples
        self.reprobe = a.reprobe_every
        self.trial_lifetimes = a.trial_lifetimes
        self.trial_max = a.trial_max_steps
        self.reprobe_near = a.reprobe_near
        self.persist = a.persist
        # Policy state depends only on rank-identical inputs, so every TP rank holds the same.
        self.trial_left = 0
        self.trial_steps = 0
        self._trial_cap = 0  # the most steps the current trial may run
        self._trial_timing = False  # the current trial runs only for want of a plain step time here
        self.after_trial = False
        self._entry_bs = 0  # decode batch size when the current mode was entered
        self._lead = 0.0  # average over recent model decisions of ln(off cost / on cost): > 0 favours on
        self._lead_n = 0  # model decisions behind it since it was reset
        self._flips = 0  # switches in a row that came within FLIP_WINDOW steps of the one before
        self._last_switch: int | None = None  # step of the last switch the model decided
        self._probe_at: int | None = None  # step of the last near-tie probe
        # Near-tie probes in a row that the model soon turned back (they back the next one off), per
        # sampling regime (StepInputs.greedy): a probe refuted on sampled requests' acceptance says
        # nothing about greedy ones' (pair2g-rows34: row 3's refuted probes at temperature 0.7 held
        # the first greedy low phase plain for 3 s, 1.34x `on`'s TPOT).
        self._misses: dict[bool | None, int] = {}
        self._regime: bool | None = None  # the regime of the step being decided
        self._probe_rows_left = 0  # request-steps the current probe still speculates before it is judged
        self._why = "start"
        # Lowest step time per batch size in the current stretch of each mode, and the step of a
        # look at the other mode owed after a switch that a rise of that time decided (_note_switch).
        self._on_floor: dict[int, float] = {}
        self._off_floor: dict[int, float] = {}
        self._recheck_at: int | None = None  # a speculative probe, owed from plain decode
        self._recheck_off_at: int | None = None  # a plain stretch, owed from speculation
        self._d_on: float | None = None  # this step's speculative step-time estimate (_decide reads it)
        self._d_off: float | None = None  # ... and plain decode's
        self._c_on: float | None = None
        self._c_off: float | None = None
        self._probe_judged = False  # a probe runs whose end the model has not judged yet
        self._demand: float | None = None  # output tokens per second the arrivals ask for (seconds_per_token)
        self._bs_slow = 0.0  # the decode batch averaged over about DEMAND_SLOW_STEPS steps
        self._burst_at = -DEMAND_SLOW_STEPS - 1  # the step of the last burst of new requests (new_load)
        self._settled: dict[bool, tuple] = {}  # per mode: (inputs, TPOT) of the last _settle search

    # --- the model -------------------------------------------------------------------
    def seconds_per_token(self, x: StepInputs, accept: float | None = None,
                          open_load: bool = True) -> tuple[float, float, float] | None:
        """(on, off, off with free prefills) seconds per output token at this step; None if unknown.
        ``open_load=False``: every finished request refilled, whatever the arrival rate says."""
        v = x.costs
        if v is None:
            return None
        bs = max(x.decode_bs, 1)
        d_on = v.estimate(True, bs)
        d_off = v.estimate(False, bs)
        if d_on is None or d_off is None:
            return None
        rho = v.requests_per_token()
        acc = max(accept if accept is not None else x.accept_length, 1.0)
        p_off, p_on = v.prefill_per_request(False), v.prefill_per_request(True, bs, acc)
        lam = v.arrivals_per_s if open_load else None
        free = d_off / bs
        c_on, c_off = per_token(d_on, bs * acc, p_on, rho, lam), per_token(d_off, bs, p_off, rho, lam)
        demand = lam / rho if lam and rho > 0 else None
        if accept is None:
            self._demand = demand  # the figure explain() shows beside this step's estimates
        if demand is not None and x.previous is not None and bs > DEMAND_GROWING * self._bs_slow \
                and x.step - self._burst_at > DEMAND_SLOW_STEPS:
            # The running mode falls behind the arrivals and the batch grows: an open load it does
            # not keep up with.  Both modes are then judged at the batch each would grow to.  In a
            # closed loop arrivals follow what the running mode makes, and a burst's rate does not
            # last (a wave of 200 refills at C=250 read as 240 requests per second, pair1i-hi):
            # none is judged so for DEMAND_SLOW_STEPS steps after one.
            running = self._capacity(v, x.previous, bs, acc)
            if self._short(running, demand):
                now = {x.previous: running, not x.previous: self._capacity(v, not x.previous, bs, acc)}
                # Arrivals come at random: over a second 40 requests vary by ~6, and the batch must
                # absorb such bursts; a mode judged at the mean demand alone looks as good near its
                # saturation as one with room to spare (pair2k-rows34, high2: a tie by the mean,
                # `on` 2x `off`'s TPOT).
                burst = demand * (1.0 + DEMAND_BURST_SD / math.sqrt(max(v.arrivals_per_s, 1.0)))
                c_on = self._behind(v, True, bs, acc, burst, c_on, now[True])
                c_off = self._behind(v, False, bs, 1.0, burst, c_off, now[False])
        return c_on, c_off, free

    @staticmethod
    def _capacity(v, on: bool, b: float, acc: float) -> float | None:
        """Output tokens per second of that mode at batch ``b`` while the measured arrivals come."""
        d = v.estimate(on, int(round(b)))
        if d is None:
            return None
        p = v.prefill_per_request(True, int(round(b)), acc) if on else v.prefill_per_request(False)
        return open_load_capacity(d, b * (acc if on else 1.0), p, v.arrivals_per_s)

    @staticmethod
    def _short(capacity: float | None, demand: float) -> bool:
        """Whether a mode making ``capacity`` makes less than ``demand``, by more than DEMAND_SLACK."""
        return capacity is not None and capacity * (1.0 + DEMAND_SLACK) < demand

    def _behind(self, v, on: bool, bs: int, acc: float, demand: float, c_now: float,
                capacity_now: float | None) -> float:
        """Seconds per output token at ``bs`` of a mode, judged by the TPOT its requests would see
        under the arriving ``demand`` (output tokens per second).

        A mode that makes the demand at this batch size (``capacity_now``) keeps its figure
        ``c_now``.  One that falls short of it by more than DEMAND_SLACK lets the batch grow until
        it makes it, at ``b*`` requests, so its requests get a token every ``b* / demand`` seconds
        (Little's law), more than its step at ``bs`` says; one that makes it at no batch up to
        DEMAND_MAX_BS gets the TPOT of its largest while the queue grows.  Compared at today's batch
        alone the modes tied in the H200 high phases (40 requests/s, ~5,800 tokens/s wanted; both
        ~4,600 tokens/s at bs 45), so speculation stayed, where plain decode makes the demand at bs
        ~60, speculation at no batch, and `on`'s TPOT was 2.5-3x `off`'s (pair2k-rows34, high1 and
        high2).  Returns a figure comparable with the current-batch ones: that TPOT per request of
        this batch."""
        if not self._short(capacity_now, demand):
            return c_now
        settled = self._settle(v, on, acc, demand)
        if settled is None:
            return c_now  # no estimate up there: nothing to say beyond today's batch
        return max(settled / bs, c_now)

    def _settle(self, v, on: bool, acc: float, demand: float) -> float | None:
        """The TPOT that mode settles at under ``demand``: ``b* / demand`` at the least batch ``b*``
        making it (linear between the sizes tried), else its largest batch's; None without an estimate.
        Searched once per cost view, acceptance step of 0.05 and demand: a search costs ~30 us, more
        than a decode step's budget (20 us), and its inputs change about every 16 steps."""
        acc = round(acc * 20.0) / 20.0
        key = (id(v), v.version, acc, round(demand))
        memo = self._settled.get(on)
        if memo is not None and memo[0] == key:
            return memo[1]
        b0, c0 = 0.0, 0.0
        b, tpot = 1.0, None
        while True:
            c = self._capacity(v, on, b, acc)
            if c is None:
                break
            if c >= demand:
                b_star = b0 + (demand - c0) / (c - c0) * (b - b0) if c > c0 else b
                tpot = b_star / demand
                break
            b0, c0 = b, c
            if b >= DEMAND_MAX_BS:
                tpot = min(b0 / c0, DEMAND_TPOT_CAP_S) if c0 > 0 else DEMAND_TPOT_CAP_S
                break
            b = min(max(b * DEMAND_GROWTH, b + 1.0), DEMAND_MAX_BS)
        self._settled[on] = (key, tpot)
        return tpot

    # --- the decision ----------------------------------------------------------------
    @property
    def _probe_misses(self) -> int:
        return self._misses.get(self._regime, 0)

    @_probe_misses.setter
    def _probe_misses(self, n: int) -> None:
        self._misses[self._regime] = n

    def decide(self, x: StepInputs) -> bool:
        self._regime = x.greedy
        if x.new_load:
            self._burst_at = x.step
        d = self._decide(x)
        self._bs_slow += (x.decode_bs - self._bs_slow) / DEMAND_SLOW_STEPS
        if d and not x.previous and self._why in PROBES:
            self._probe_rows_left = PROBE_ROWS
            self._probe_judged = True
        elif not d:
            self._probe_rows_left = 0
            self._probe_judged = False
        if d != x.previous:
            self._entry_bs = x.decode_bs
            self._reset_lead()  # a lead measured in the other mode is no evidence for this one
            if self._why == "model" and x.previous is not None:
                self._note_switch(x, d)
            if d:
                self._on_floor = {}
            else:
                self._off_floor = {}
        t = self._d_on if d else self._d_off
        if d == x.previous and x.steps_in_mode >= self.min_dwell and t is not None:
            # after the dwell: a floor taken earlier would be the estimate the stretch began with
            floor = self._on_floor if d else self._off_floor
            if t < floor.get(x.decode_bs, math.inf):
                floor[x.decode_bs] = t
        return d

    def _note_switch(self, x: StepInputs, d: bool) -> None:
        """A switch the model chose: one that reverses a recent one doubles the wait of the next
        (``_flips``); one back to plain soon after a near-tie probe backs the next probe off.
        One because the step of the mode left itself got slower (not acceptance or batch size)
        owes a look back at it after ``reprobe_near`` steps: the slowdown may have hit any step (a
        burst of 2x steps for 0.4 s at C=1 on the H200, pair1k), and the left mode's estimate is
        not measured again until it runs.  Both ways: in pair1w-rows34 a slow burst of plain
        steps at C=1 (3.5 -> 5-9 ms) switched to speculation, and the bs-1 plain estimate stayed
        at half its speed through every later low phase (no new load at bs 1 to trial it)."""
        step = x.step
        soon = self._last_switch is not None and step - self._last_switch < FLIP_WINDOW
        self._flips = min(self._flips + 1, MAX_FLIPS) if soon else 0
        self._last_switch = step
        if not d and self._probe_at is not None:
            refuted = step - self._probe_at < FLIP_WINDOW
            self._probe_misses = min(self._probe_misses + 1, MAX_FLIPS) if refuted else 0
            self._probe_at = None
        floor, now = (self._off_floor, self._d_off) if d else (self._on_floor, self._d_on)
        floor = floor.get(x.decode_bs)
        rose = floor is not None and now is not None and now > (1.0 + 2.0 * self.margin) * floor
        # (refuted speculative probes back off the next probe, not a look at plain decode)
        wait = self.reprobe_near if d else self.reprobe_near << self._probe_misses
        due = step + wait if rose else None
        if d:
            self._recheck_off_at, self._recheck_at = due, None
        else:
            self._recheck_at, self._recheck_off_at = due, None

    def _decide(self, x: StepInputs) -> bool:
        prev = x.previous
        v = x.costs
        self._d_on = v.estimate(True, x.decode_bs) if v is not None else None
        self._d_off = v.estimate(False, x.decode_bs) if v is not None else None
        if v is None or x.accept_samples < self.min_accept or self._d_on is None:
            return self._say(True, "learn on", None)
        c = self.seconds_per_token(x)
        if c is None:
            return self._say(False, "learn off", None)
        c_on, c_off, c_free = c
        rho = v.requests_per_token()
        if x.new_load:
            self._flips = self._probe_misses = 0  # earlier flip-flops say nothing about a new load
        burst_seen = x.new_load and prev is not False and rho > 0
        could_win = burst_seen and self._plain_could_win(x, c_free)
        if burst_seen and (could_win or not v.timed_around(False, x.decode_bs)):
            # Plain decode could win if it batches the successors of this burst: only a stretch
            # of it from now on shows whether it does (speculation charged as a refilled load: the
            # arrival rate's ~1 s average trails a burst).  Also when plain decode was never timed at
            # this batch size or around it: an estimate extrapolated from small batches (4.7 ms for a
            # 3.6 ms step at bs 10 in the H200 traces) must not rule it out.  Between timed sizes it
            # interpolates (pair2e-row2, C=5: a trial for bs 5 after bs 1 and 8, 2.2 s of 4.5, where
            # speculation led by 1.37x).
            self._trial_timing = not could_win
            self.trial_left = min(self.trial_max, int(self.trial_lifetimes / rho) + 1)
            self.trial_steps = 0
            # Waiting for its successors' prefills takes at most as long again: a closed loop whose
            # plain waves drain the batch refills after an idle gap, which no mode's prefill figure
            # counts, and such trials ran 293-679 steps where 47-154 were planned, into the next
            # load (H100, pair3c-r2-row2 at C=30, where speculation led; pair3c-r1-row1 at C=100).
            self._trial_cap = min(self.trial_max, 2 * self.trial_left)
        if self.trial_left > 0 and self._trial_timing and v.timed_around(False, x.decode_bs):
            # A trial only for want of a plain step time here ends once one is timed, unless plain
            # decode could then win: its batching needs the whole trial, its step time a few steps
            # (H100, pair3d-row2, C=5: 176 plain steps and 0.6 s of a 3.7 s level where speculation
            # led by 1.65x, for a bucket timed after 16).
            self._trial_timing = False
            if not self._plain_could_win(x, c_free):
                self.trial_left = self._trial_cap = 1
        if self.trial_left > 0:
            self.trial_left -= 1
            self.trial_steps += 1
            seen = v.stretch_requests(False) >= min(STRETCH_MIN_REQUESTS, x.decode_bs)
            if self.trial_left == 0 and not seen and self.trial_steps < self._trial_cap:
                self.trial_left = 1  # its successors have not been prefilled yet (or not agreed)
            if self.trial_left == 0:
                self.after_trial = True
            return self._say(False, "trial", c)
        if prev and self._probe_rows_left > 0:
            # A probe is judged on the acceptance it measures, and at one request per step a few
            # steps are a few noisy samples: on the H200 pair (pair1s-row1, C=1) a near-tie probe was
            # turned back after 23 steps on an acceptance of 1.8-2.0 where the level's was 2.4, and
            # the level ran plain for 4 more seconds (0.968x).  At 8 requests or more the dwell is longer.
            self._probe_rows_left -= x.decode_bs
            if self._probe_rows_left > 0:
                return self._say(True, "probing", c)
        if prev is not None and x.steps_in_mode < self.min_dwell and not self._batch_moved(x.decode_bs) \
                and not (prev and self._probe_judged):
            return self._say(prev, "dwell", c)
        g = c_off / c_on
        after_trial, self.after_trial = self.after_trial, False
        if prev is None or after_trial:
            # A trial ran plain decode to measure it, not because it was chosen: its end is judged
            # as from speculation, so that a toss-up speculates (plain decode carries the draft
            # sync and draft prefill; the incumbent's margin would keep it for no gain).  Unless
            # speculation was never timed this large: its estimate is then carried beyond what was
            # measured, and a toss-up on it is no evidence (H200, row 4's high phases: trials at
            # bs 150-160 ended in 2-3 s of speculation on estimates from bs <= 8 where `off` was
            # 1.3-2x faster; pair1w-rows34, pair1x-rows34).  Plain decode keeps it then,
            # unless speculation leads by the margin; the near-tie probe times it later.
            self._reset_lead()
            if after_trial and v.speculation_extrapolated(x.decode_bs):
                return self._say(g > 1.0 + self.margin, "model", c)
            return self._say(g >= 1.0 - self.margin, "model", c)
        if prev:
            if self._recheck_off_at is not None and x.step >= self._recheck_off_at:
                # plain decode for a dwell, timed afresh; the model decides after it as usual
                self._recheck_off_at = None
                return self._say(False, "recheck off", c)
            return self._contest(True, g, c)
        if self._contest(False, g, c):
            return True
        why = self._why
        if self._recheck_at is not None and x.step >= self._recheck_at:
            self._recheck_at = None
            self._probe_at = x.step
            return self._say(True, "recheck", c)
        scatters = self._probe_scatters(v, x.decode_bs)
        near_every = self.reprobe_near << self._probe_misses
        fresh_every = max(self.min_dwell, near_every // FRESH_SHARE)
        if x.fresh_batch and not scatters and x.steps_in_mode >= fresh_every and self._hopeful(x):
            # The batch drained and a new one began: the workload may have changed with it (greedy after
            # sampled requests: pair1q-rows34 stayed plain through a low phase on an acceptance of 1.79
            # where greedy had 2.4).  A probe there costs a few small steps; backed off like the others.
            self._probe_at = x.step
            return self._say(True, "fresh", c)
        if not scatters and x.steps_in_mode >= near_every and g > 1.0 - 2.0 * self.margin \
                and x.steps_in_mode % near_every == 0:
            # A near tie decided off: the acceptance behind it may have been a dip (it is not
            # measured while off), so look again soon; a probe costs little where the modes are close.
            # Each probe the model soon turns back doubles the wait for the next one.
            self._probe_at = x.step
            return self._say(True, "probe", c)
        if x.steps_in_mode >= self.reprobe:
            # Acceptance may have changed, or the speculative costs be stale: probe if more
            # acceptance could win, and in any case after STALE_PROBE_FACTOR x as long.
            if (not scatters and self._hopeful(x)) or x.steps_in_mode % (STALE_PROBE_FACTOR * self.reprobe) == 0:
                return self._say(True, "probe", c)  # dwell holds it min_dwell steps
        return self._say(False, why, c)

    def _plain_could_win(self, x: StepInputs, c_free: float) -> bool:
        """Whether plain decode refilling its whole batch at once (the best batching it can keep;
        ``c_free`` is its figure with free prefills) beats speculation refilling every finished
        request.  Free prefills alone were too loose a bound: at C=5 on the H100 pair (topk 4,
        pair3f-r2-row2) they started a 166-step trial where a batch of five requests takes 11 ms
        each to prefill and speculation led by 1.4x (0.771x `on@topk4`)."""
        v = x.costs
        best = c_free + v.wave_per_request(x.decode_bs) * v.requests_per_token()
        return best < self.seconds_per_token(x, open_load=False)[0]

    def _hopeful(self, x: StepInputs) -> bool:
        """Whether speculation would win with REPROBE_ACCEPT_FACTOR x today's acceptance."""
        hopeful = self.seconds_per_token(x, x.accept_length * REPROBE_ACCEPT_FACTOR)
        return hopeful is not None and hopeful[1] > hopeful[0]

    def _contest(self, prev: bool, g: float, c) -> bool:
        """Switch once the other mode leads by more than the margin on average over recent model
        decisions (at least ``persist`` of them): at C=5 the batch alternates 4/5 as requests are
        replaced, and the ranking with it (bs 5 runs bs 8's graphs); deciding on each step's batch,
        or on a few in a row, flapped between the modes (row 1 of the H200 runs: 5 switches in 6 s,
        0.84x of either static mode), while the load as a whole favoured neither.  A switch that
        reverses a recent one doubles the wait for the next (up to 2**MAX_FLIPS x ``persist``) while
        the lead stays within two margins: where the modes tie, each switch costs both their
        batching and a resume step, and the estimates cross back and forth."""
        need = self.persist << self._flips
        self._lead_n += 1
        self._lead += max(1.0 / self._lead_n, 1.0 / need) * (math.log(g) - self._lead)
        threshold = math.log(1.0 - self.margin) if prev else math.log(1.0 + self.margin)
        judging = prev and self._probe_judged
        if judging:
            # A probe stays only if speculation leads by the margin: in a tie the incumbent's margin
            # would keep a probe the model never asked for.  pair1z-rows34 (H200 pair): a near-tie
            # probe at bs 40 in a high phase stayed in the tie for the rest of it, at 0.7x of plain.
            threshold = math.log(1.0 + self.margin)
        toward = -1.0 if prev else 1.0  # the sign of ln(g) that favours the other mode
        other_leads = toward * (self._lead - threshold) > 0
        clear = judging or abs(self._lead) > 2.0 * abs(threshold)  # not a tie: a wrong mode is left at once
        enough = PROBE_DECISIONS if judging else self.persist if clear else need
        if judging and self._lead_n >= enough:
            self._probe_judged = False  # judged: kept, or left just below
        if other_leads and self._lead_n >= enough:
            return self._say(not prev, "model", c)
        # "persist": the average, or this decision alone, would switch; waiting for the average
        leaning = other_leads or toward * (math.log(g) - threshold) > 0
        return self._say(prev, "persist" if leaning else "model", c)

    @staticmethod
    def _probe_scatters(v, bs: int) -> bool:
        """Whether a probe would cost plain decode its refill waves: its prefill batches (this
        stretch's, else its history's) admit REFILL_WAVE requests or more, because requests that
        started together finish together.  A speculative stretch, however short, staggers their
        finishes, and in a closed loop the staggering stays: on the H200 (pair1o-hi-row1, C=70)
        23 probe steps turned 10 refill waves into 60 small prefill batches, and the plain steps
        after them into 0.775x of a plain server.  Near-tie and hopeful probes are not worth
        that; the stale probe remains.  A batch of fewer than REFILL_WAVE requests holds no wave
        (after a burst's waves the batching history still says waves: pair1q-rows34's low phases)."""
        if bs < REFILL_WAVE:
            return False
        n = v.batch_size_stretch(False)
        if n is None:
            n = v.batch_size_history(False)
        return n is not None and n >= REFILL_WAVE

    def _reset_lead(self) -> None:
        self._lead, self._lead_n = 0.0, 0

    def _batch_moved(self, bs: int) -> bool:
        # The dwell holds a decision made for one batch size; a load that doubled or halved since
        # (a ramp at a new load) is a new question.
        e = self._entry_bs
        return e > 0 and (bs >= BATCH_MOVED * e or bs * BATCH_MOVED <= e)

    def _say(self, decision: bool, why: str, c) -> bool:
        self._why = why
        if c is not None:
            self._c_on, self._c_off = c[0], c[1]
        return decision

    def explain(self) -> dict:
        """Estimated output tokens per second of each mode at the last step (prefills included)."""
        on, off = self._c_on, self._c_off
        return {
            "on_tok_s": round(1.0 / on, 1) if on else None,
            "off_tok_s": round(1.0 / off, 1) if off else None,
            "demand_tok_s": round(self._demand, 1) if self._demand is not None else None,
            "why": self._why,
        }

"""The per-process controller: asks the policy each decode step and keeps it safe.

No SGLang imports here.  The runtime calls :meth:`Controller.step_mode` once per decode
batch (before the forward; :meth:`Controller.on_decode` where only on/off matters),
:meth:`Controller.on_other` for extend/idle batches and :meth:`Controller.on_result` once the
scheduler has the accepted-draft count.

Step costs are wall-clock intervals between decode forwards, split in two: the decode part
(up to the first prefill batch) goes to the decode-step table, the prefill batches after it go
to the prefill meter as seconds per admitted request, charged to the mode of the decode step
before them.  Speculation changes how prefills batch (requests of one batch finish at different
steps, so their replacements arrive one or two at a time instead of together), and a cost that
left prefills out favoured speculation by up to 2x on a trained pair (costs.py says more).
Idle time is not a cost: a decode part far longer than the estimate (a gap before new requests
arrived) is dropped, and the prefill after it is charged to no mode.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from .costs import MIN_SAMPLES, CostTable, CostView, PrefillMeter
from .policies.base import StepInputs

logger = logging.getLogger("sglang_dynspec")

# Agreement callback: takes a flat list of floats, returns the element-wise SUM over ranks.
AgreeFn = Callable[[list], list]


class StepMode(enum.Enum):
    """How one decode step runs, decided once by :meth:`Controller.step_mode`."""

    ON = "on"  # speculative: SGLang's own forward
    OFF = "off"  # an off-step (light draft sync where the adapter has it)
    # The policy said "on" but the last off-step left the draft nothing to draft from: an
    # off-step with a full draft sync, charged as one.
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    decode_bs: int
    running: int
    waiting: int
    speculate: bool
    switched: bool
    safe_mode: bool
    accept_length: float
    # the policy's own figures for this step, if it offers them (Policy.explain): e.g.
    # {"on_tok_s": .., "off_tok_s": .., "why": ..}
    estimates: dict | None = None
    admitted: int = 0  # requests prefilled since the previous decode step
    prefill_s: float = 0.0  # wall time from the first of those prefill batches to this step
    t: float = 0.0  # the controller's clock when the step was decided
    # speculative results the controller received since the previous decode step (on_result):
    # rows and accepted drafts, so that a trace replays the acceptance the policy saw
    result_rows: int = 0
    result_accepted: int = 0
    verify_rows: int | None = None  # the controller's (a trace records it once, for its re-drive)
    # each result's (rows, accepted drafts) when more than one arrived since the previous decode
    # step: acceptance is averaged per result, so their sum alone does not replay it
    results: tuple[tuple[int, int], ...] | None = None
    greedy: bool | None = None  # the batch samples greedily (its acceptance is kept apart); None: unknown


@dataclass(slots=True)
class Acceptance:
    """Tokens per request per speculative step (bonus included) of one sampling regime,
    averaged by rows (Controller.accept_weight)."""

    length: float = 0.0
    samples: int = 0
    recent: int = 0  # samples since the average last restarted, prior included (its weights)


# A single decide() this many times over its deadline is a hang, not a hiccup.
HANG_FACTOR = 25.0
# With TP, ranks ask each other for a pending policy failure this often (a one-float
# agreement), not only at the cost agreements: a slow policy's stalls are then bounded by
# about (strikes + this) calls, e.g. 0.8 s at 50 ms per call, instead of up to sync_interval
# calls (9.5 s).  Step-count based, so every rank calls the collective at the same steps.
FAILURE_CHECK_STEPS = 16
# A new load: since the last decode step the batch grew by at least this many admitted requests,
# and by at least this share of the decode batch (a burst of arrivals, e.g. a client's whole batch).
# Growth, not admissions: requests that finished together and were replaced together (a refill, as
# after plain decode) are the same load, and counting them started a plain trial every request
# lifetime on the H200 (row 2, C=5).
NEW_LOAD_MIN_ROWS = 4
NEW_LOAD_SHARE = 0.5
# Speculation resuming after this many plain steps restarts the acceptance average (see step_mode).
ACCEPT_STALE_STEPS = 256
# A restarted average keeps the old one as this many samples' worth: a probe cut short after one
# step must not leave its single sample as the average (H100, pair3f-r1-row1: one bs-1 step that
# accepted nothing set 2.46 to 1.0, and plain decode, never measuring acceptance, kept it there).
# From bs 52 on, a step's row weight (bs / accept_memory_rows) exceeds the prior's 1/5 and rules.
ACCEPT_RESTART_PRIOR = 4


MIN_PREFILL_SHARE = 0.5  # a prefill's time after the next step's refund: at least this share of what it measured


class Controller:
    def __init__(
        self,
        policy: Any,
        *,
        safe_mode_on: bool = True,
        deadline_s: float = 0.002,
        deadline_strikes: int = 3,
        sync_interval: int = 200,
        tp_rank: int = 0,
        tp_size: int = 1,
        agree: AgreeFn | None = None,
        hook: Any = None,
        clock: Callable[[], float] = time.perf_counter,
        accept_memory_rows: float = 256.0,
        verify_rows: int | None = None,
    ):
        self.policy = policy
        self.policy_name = getattr(policy, "name", type(policy).__name__)
        self.safe_value = safe_mode_on
        self.deadline_s = deadline_s
        # One late decide() is usually the process, not the policy (a GC pause, the OS): the policy
        # fails after this many late calls in a row, or one call past HANG_FACTOR x the deadline.
        self.deadline_strikes = deadline_strikes
        self._late_in_row = 0
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # A single rank refreshes its view often (cheap); several ranks agree less often.
        self.sync_interval = sync_interval if tp_size > 1 else min(16, sync_interval)
        self.failure_check = min(FAILURE_CHECK_STEPS, self.sync_interval)
        self.agree = agree
        self.hook = hook  # pluggy hook relay, or None
        self.clock = clock
        self.accept_memory_rows = accept_memory_rows  # acceptance averages over about this many request-steps
        self.verify_rows = verify_rows  # target rows a speculative step verifies per request (CostView)

        self.costs = CostTable()
        self.prefill = PrefillMeter()
        self.view: CostView | None = None
        self.failed: str | None = None  # reason the policy was replaced by the safe mode
        self._pending_failure: str | None = None  # slow decide(): applied at the next agreement

        self.step = 0
        self.prev: bool | None = None
        self.steps_in_mode = 0
        # Acceptance per sampling regime of the batch (greedy or not; None where the release does
        # not say): a draft agrees with greedy decoding far more often than with sampling (2.4 vs
        # 1.8 on the H200 pair), so one average mixed the two and, while off, never learnt that
        # the requests had changed.  The policy sees the current batch's regime.
        self._accept: dict[bool | None, Acceptance] = {}  # made on first use (acceptance)
        self._greedy: bool | None = None  # the regime of the last decode step
        # timing chain: the previous decode step's (start time, mode, bs)
        self._t_prev: float | None = None
        self._t_other: float | None = None  # start of the first non-decode batch since _t_prev
        self._mode_prev = True
        self._bs_prev = 0
        self._rows_admitted = 0  # requests prefilled since the previous decode step (rank-identical)
        # a prefill seen at the last decode step, recorded at the next (charged mode, seconds, rows)
        self._held: tuple[bool | None, float | None, int] | None = None
        # (rows, accepted drafts) of each speculative result since the previous decode step (trace only)
        self._results: list[tuple[int, int]] = []
        self._explain = getattr(policy, "explain", None)

        self.stats = {
            "decode_steps": 0,
            "steps_on": 0,
            "steps_off": 0,
            "switches": 0,
            "policy_errors": 0,
            "accepted_drafts": 0,
            "spec_rows": 0,
            "agreements": 0,
            "failure_checks": 0,
            "steps_forced_off": 0,
            "steps_resume": 0,
        }

    # --- per step -------------------------------------------------------------------
    def on_decode(self, decode_bs: int, running: int = 0, waiting: int = 0, force_off: bool = False) -> bool:
        """Decide one decode step; returns True to speculate (no resume steps: see step_mode)."""
        return self.step_mode(decode_bs, running, waiting, force_off=force_off) is StepMode.ON

    def step_mode(self, decode_bs: int, running: int = 0, waiting: int = 0, force_off: bool = False,
                  resume_pending: bool = False, greedy: bool | None = None) -> StepMode:
        """Decide one decode step.

        ``force_off``: a request in the batch opted out of speculation; the policy is not asked.
        ``resume_pending``: the worker's last off-step used the light draft sync, so a step the
        policy wants speculative runs as a RESUME step (an off-step cost, counted in
        ``steps_resume``; ``steps_on`` and the observers still see the policy's "on").
        ``greedy``: the batch samples greedily (True), not (False), unknown (None): the policy is
        given that regime's acceptance.
        """
        now = self.clock()
        self._greedy = greedy
        rows = self._rows_admitted
        # A burst of new requests (rank-identical: the scheduler's batches are): the batching that
        # plain decode preserves starts afresh, so both modes' prefill stretches restart.
        grew = min(rows, decode_bs - self._bs_prev)
        new_load = grew >= NEW_LOAD_MIN_ROWS and grew >= NEW_LOAD_SHARE * decode_bs
        if new_load:
            self.prefill.new_stretch(None)
        if rows:
            self.prefill.admit(rows, now)
        charged_to: bool | None = None
        cut = self._t_other if self._t_other is not None else now
        extend = now - cut  # the prefill batches since the previous decode step, 0.0 if none
        held, self._held = self._held, None
        if self._t_prev is not None:
            # The decode part (up to the first extend, if any) must look like a step: a gap
            # before new requests arrived or a stall is not a cost.  Prefill time after it is.
            dt = cut - self._t_prev
            est = self.costs.estimate_local(self._mode_prev, self._bs_prev)
            spill = 0.0
            if dt < 1.0 and (est is None or dt < 5.0 * est) and extend < 1.0:
                charged_to = self._mode_prev
                disturbed = extend > 0.0 or held is not None
                if disturbed and est is not None and self.costs.samples(self._mode_prev, self._bs_prev) >= MIN_SAMPLES:
                    # signed: with the overlap scheduler a plain step right after a prefill took
                    # 2-3 ms where steps took 6 (H200 pair, pair1z-rows34): part of it ran during
                    # the prefill, whose time then holds it; a speculative step there took its usual
                    # time.  Clipped at 0, plain prefills were charged ~3 ms each of decode time.
                    spill = dt - est
                else:
                    self.costs.observe(self._mode_prev, self._bs_prev, dt)
            if held is not None:
                self._observe_prefill(held, spill)
                spill = 0.0
            if rows:
                # Held for one step: the decode step after it is disturbed too (see _observe_prefill).
                self._held = (charged_to, extend + spill if extend < 1.0 else None, rows)
        else:
            if held is not None:
                self._observe_prefill(held, 0.0)
            if rows:
                self.prefill.observe(None, 0.0, rows)
        self._t_other = None
        self._rows_admitted = 0
        if self.step > 0:
            if self.step % self.sync_interval == 0:
                self._refresh_view()
            elif self.step % self.failure_check == 0 and self.tp_size > 1 and self.agree is not None:
                self._check_failure()

        fresh = 0 < decode_bs <= rows  # every request in the batch was admitted since the last step
        if force_off:
            decision = False
            self.stats["steps_forced_off"] += 1
        else:
            decision = self._ask(decode_bs, running, waiting, new_load, fresh=fresh)

        switched = self.prev is not None and decision != self.prev
        if switched:
            if decision and (self.steps_in_mode >= ACCEPT_STALE_STEPS or fresh):
                # Acceptance is not measured while off: after a long plain stretch the average may be
                # another workload's (temperature 0.7 before greedy on the H200 pair, pair1q-rows34),
                # and at small batches its row weighting would take hundreds of steps to forget it.
                # A batch of requests all admitted since the last step is new to it in any case: at
                # bs 1 a probe's 64 samples weighed about a fifth of the average it was judged on
                # (H100, pair3c-r4-rows34, low0: 1.89 where its requests gave 2.05; the probe was
                # turned back, and the phase ran plain for 3 s more at 1.24x `on`'s TPOT).  The new
                # samples outweigh it (accept_weight) once there are more than a few; the policy
                # still counts it as known.
                a = self.acceptance(greedy)
                a.recent = min(a.recent, ACCEPT_RESTART_PRIOR)
            self.stats["switches"] += 1
            self.steps_in_mode = 1
            # Both: the mode left keeps no stretch, its history stands for it.  A plain dwell of 15
            # steps that admitted 4 requests in 3 batches otherwise priced plain prefills at 1.33 per
            # batch through a whole speculative high phase (H200 pair, pair1z-rows34).
            self.prefill.new_stretch(None)
        else:
            self.steps_in_mode += 1
        self.prev = decision
        self.step += 1
        st = self.stats
        st["decode_steps"] += 1
        st["steps_on" if decision else "steps_off"] += 1
        if not decision:
            self.prefill.add_tokens(decode_bs)  # speculative steps count theirs in on_result

        hook = self.hook
        if hook is not None:
            res = self._results
            rec = StepRecord(self.step - 1, decode_bs, running, waiting, decision, switched,
                             self.failed is not None, self.accept_length, self.estimates(), rows, extend,
                             now, sum(r for r, _ in res), sum(a for _, a in res), self.verify_rows,
                             tuple(res) if len(res) > 1 else None, greedy)
            hook.dynspec_decision(record=rec)
            if switched:
                hook.dynspec_switch(record=rec)
        self._results.clear()
        if not decision:
            mode = StepMode.OFF
        elif resume_pending:
            mode = StepMode.RESUME
        else:
            mode = StepMode.ON
        # The interval that starts now is charged to the mode the step runs in.
        self._t_prev, self._mode_prev, self._bs_prev = now, mode is StepMode.ON, decode_bs
        if mode is StepMode.RESUME:
            st["steps_resume"] += 1
            self.prefill.add_tokens(decode_bs)  # an off-step's tokens: no on_result follows
        return mode

    @property
    def last_decode_bs(self) -> int:
        return self._bs_prev

    def on_other(self, new_rows: int = 0) -> None:
        """An extend / mixed / declined batch starts: its time is a prefill charged to the mode of
        the previous decode step; ``new_rows``: requests it admits (0 for a declined decode)."""
        if self._t_other is None:
            self._t_other = self.clock()
        self._rows_admitted += new_rows

    def on_idle(self) -> None:
        """The server was idle (or this is a new run): no interval spans this point."""
        self._t_prev = None
        self._t_other = None
        if self._held is not None:
            self._observe_prefill(self._held, 0.0)
            self._held = None

    def _observe_prefill(self, held: tuple[bool | None, float | None, int], spill: float) -> None:
        """Record a prefill held since the step it was seen at, with ``spill``: what the decode
        step after it took beyond that mode's estimate.

        Admitting requests slows the decode steps around the prefill batches: the one it
        interrupts (its scheduling of the new requests) and the next (the overlap pipeline
        restarts).  On the H200 pair a plain bs-5 step took 9.9 and 5.9 ms there, 3.4 ms
        elsewhere; as decode samples those two raised the estimate by ~20 % right after each
        refill, which is when a plain trial ends and is judged.  They are the prefill's cost."""
        on, seconds, rows = held
        if seconds is not None:
            seconds = max(seconds + spill, MIN_PREFILL_SHARE * seconds)  # (a noisy step is no refund)
        # held over a switch: its mode's stretch has ended
        self.prefill.observe(on, seconds, rows, stretch=on is None or on == self.prev)

    def on_result(self, decode_bs: int, accepted_drafts: int, greedy: bool | None = None) -> None:
        """Accepted drafts of one speculative step (from the scheduler; rank-identical), of a batch
        in sampling regime ``greedy`` (as in step_mode; None: the last decision's, so that a result
        whose batch does not say still teaches the regime the policy is asking about)."""
        if decode_bs <= 0:
            return
        self.stats["accepted_drafts"] += accepted_drafts
        self.stats["spec_rows"] += decode_bs
        self._results.append((decode_bs, accepted_drafts))
        self.prefill.add_tokens(decode_bs + accepted_drafts)
        a = self.acceptance(self._greedy if greedy is None else greedy)
        sample = 1.0 + accepted_drafts / decode_bs
        a.length += self._weight(a, decode_bs) * (sample - a.length)
        a.samples += 1
        a.recent += 1

    def acceptance(self, greedy: bool | None) -> Acceptance:
        """The acceptance of sampling regime ``greedy``."""
        a = self._accept.get(greedy)
        if a is None:
            a = self._accept[greedy] = Acceptance()
        return a

    @property
    def accept_length(self) -> float:
        """The acceptance of the last decode step's regime (0.0 while unknown)."""
        return self.acceptance(self._greedy).length

    @property
    def accept_samples(self) -> int:
        return self.acceptance(self._greedy).samples

    def accept_weight(self, decode_bs: int) -> float:
        """Weight of the next speculative step's sample in the acceptance average of the last
        decode step's regime: by rows, since a step of one request is one noisy sample (a hard
        prompt dips it for a few steps, and a dip that decides "off" is not corrected while off)
        and a step of 100 is many."""
        return self._weight(self.acceptance(self._greedy), decode_bs)

    def _weight(self, a: Acceptance, decode_bs: int) -> float:
        return max(1.0 / (a.recent + 1), min(1.0, decode_bs / self.accept_memory_rows))

    # --- internals ------------------------------------------------------------------
    def _ask(self, decode_bs: int, running: int, waiting: int, new_load: bool = False, fresh: bool = False) -> bool:
        if self.failed is not None:
            return self.safe_value
        a = self.acceptance(self._greedy)
        x = StepInputs(self.step, decode_bs, running, waiting, a.length,
                       a.samples, self.prev, self.steps_in_mode, self.view, new_load, fresh, self._greedy)
        t0 = self.clock()
        try:
            d = self.policy.decide(x)
        except Exception as e:  # a policy must never take the server down
            self._fail(f"decide() raised {type(e).__name__}: {e}")
            return self.safe_value
        if type(d) is not bool:
            # numpy/torch bools are fine; anything else is junk
            if getattr(d, "dtype", None) is not None and str(getattr(d, "dtype", "")) in ("bool", "torch.bool") and getattr(d, "ndim", 0) == 0:
                d = bool(d)
            else:
                self._fail(f"decide() returned {d!r} ({type(d).__name__}), not a bool")
                return self.safe_value
        took = self.clock() - t0
        if took <= self.deadline_s:
            self._late_in_row = 0
            return d
        self._late_in_row += 1
        if self._pending_failure is None and (
            self._late_in_row >= self.deadline_strikes or took > HANG_FACTOR * self.deadline_s
        ):
            # Wall time differs between ranks: acting now could split them, so the failure
            # is applied at the next failure check or agreement, where all ranks see it.
            self._pending_failure = (f"decide() took {took * 1e3:.2f} ms (deadline {self.deadline_s * 1e3:g} ms, "
                                     f"{self._late_in_row} late in a row)")
            if self.tp_size == 1:
                self._fail(self._pending_failure)
                return self.safe_value
        return d

    def _fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        self.stats["policy_errors"] += 1
        logger.error(
            "sglang-dynspec: policy %r disabled for the rest of the run, safe mode %s: %s",
            self.policy_name, "on" if self.safe_value else "off", reason,
        )
        if self.hook is not None:
            try:
                self.hook.dynspec_policy_failed(policy_name=self.policy_name, reason=reason)
            except Exception:
                logger.exception("sglang-dynspec: an observer of policy failures raised")

    def _refresh_view(self) -> None:
        version = self.stats["agreements"]
        self.stats["agreements"] += 1
        if self.tp_size == 1 or self.agree is None:
            self.view = CostView.from_table(self.costs, self.prefill, version, self.verify_rows, now=self.clock())
            return
        vec = self.costs.to_vector() + self.prefill.to_vector(self.clock())
        vec.append(1.0 if self._pending_failure else 0.0)
        vec = self.agree(vec)
        failed_somewhere = vec.pop() > 0
        self.view = CostView(vec, version=version, ranks=self.tp_size, verify_rows=self.verify_rows)
        if failed_somewhere:
            self._fail_agreed()

    def _check_failure(self) -> None:
        """Apply a failure pending on any rank, at the same step on all of them."""
        self.stats["failure_checks"] += 1
        if self.agree([1.0 if self._pending_failure else 0.0])[0] > 0:
            self._fail_agreed()

    def _fail_agreed(self) -> None:
        self._fail(self._pending_failure or "a policy deadline was missed on another rank")

    def snapshot(self) -> dict:
        s = dict(self.stats)
        s.update(
            policy=self.policy_name,
            tp_rank=self.tp_rank,
            tp_size=self.tp_size,
            mode="on" if (self.prev is None or self.prev) else "off",
            safe_mode=self.failed is not None,
            failure=self.failed,
            accept_length=None if self.accept_samples == 0 else round(self.accept_length, 4),
            accept_samples=self.accept_samples,
            accept_by_sampling={
                ("greedy" if k else "sampled"): {"accept_length": round(a.length, 4), "samples": a.samples}
                for k, a in self._accept.items() if k is not None and a.samples
            },
            estimates=self.estimates(),
        )
        return s

    def estimates(self) -> dict | None:
        """The policy's figures behind its last decision (None in safe mode or if it has none).
        Asked only when someone reads them (trace, stats, metrics), not on every step."""
        if self.failed is not None or self._explain is None:
            return None
        try:
            return self._explain()
        except Exception:  # figures for people only: never worth a failure
            self._explain = None
            return None


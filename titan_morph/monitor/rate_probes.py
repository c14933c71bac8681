"""When to probe a link's rate, and the probe results the monitor holds between probes.

On a real link the pipeline's own messages reveal the rate only when one queues behind another
(:mod:`.bandwidth`): a message that finds the wire idle costs latency + transmit time, and the two
cannot be told apart from its timing. On a limited link in a schedule that spaces its sends (the
common case: a forward every few compute times) no message queues, so the monitor saw the limit as
latency and planned for it as one. A **probe train** settles it: a few messages of the link's usual
size sent back to back between steps (:func:`titan_morph.comm.recorded.probe_train`), each arriving one transmit
time after the one before on a rate-limited wire and at once on a latency-only one. Its timings go
through the same estimator as the pipeline's (path ``"rate-probe"``), every rank sees them in the next
exchange, so every rank holds the same result.

The book asks for a probe of a link that is slow, congested, or whose slowest tenth of messages take
longer than the detector's floor (a rate limit shows first in the messages that queue behind each
other, before it moves the median or congests the plan), at most once every
:data:`PROBE_EVERY_STEPS` steps, or sooner when the held rate is contradicted (a message cost less
than the held transmit time: the link got faster). Also where the pipeline's own messages queued:
their gaps are the wire loaded by the other direction's traffic and the protocol's own round
trips (0.90 x TCP's rate at 12 Mbit/s with 160 KiB messages on the lab), the train's are the
wire's, and the estimator reads theirs against it (:func:`~.bandwidth.estimate_wire`).
A probe that measured no rate (a latency-only link, or a train a busy host spoiled) is tried again
after 2, 4, 8, ... steps, up to :data:`PROBE_EVERY_STEPS`: one spoiled train does not leave a rate
limit unread for 20 steps, and a latency-only link is probed ever more rarely.
It holds a link's last probe that measured a rate until the link no longer needs one.
"""

from __future__ import annotations

from collections.abc import Sequence

from titan_morph.monitor.bandwidth import WireEstimate
from titan_morph.monitor.delays import LinkEstimate, quantile
from titan_morph.monitor.detect import LinkState
from titan_morph.monitor.profile import PROBE_PATH

__all__ = ["PROBE_EVERY_STEPS", "RateProbes"]

PROBE_EVERY_STEPS = 20
"""Steps between two probes of a link that stays congested (each costs a few message times)."""

CONTRADICTED = 0.9  # a pipeline message under this share of the held transmit time re-probes
WANTED_QUANTILE = 0.9  # a link whose delays at this quantile pass the detector's floor wants its rate


class RateProbes:
    """Per link: the last probe that measured a rate, and the step it ran in."""

    def __init__(self, num_links: int, every_steps: int = PROBE_EVERY_STEPS) -> None:
        if every_steps < 1:
            raise ValueError(f"probes need at least 1 step between them, got {every_steps}")
        self.every_steps = every_steps
        self.held: list[WireEstimate | None] = [None] * num_links
        self.probed_at: list[int | None] = [None] * num_links
        self.misses = [0] * num_links  # probes in a row that measured no rate

    def take(self, step: int, estimates: Sequence[LinkEstimate]) -> None:
        """Hold this step's probe results (the slower direction's, where both measured a rate) and
        attach every held one to its link's estimate (:attr:`LinkEstimate.probed`)."""
        for est in estimates:
            found = [w for (path, _), w in est.wires.items() if path == PROBE_PATH]
            if found:
                self.probed_at[est.link] = step
                rated = [w for w in found if w.per_byte_ms is not None]
                if rated:
                    self.held[est.link] = max(rated, key=lambda w: w.per_byte_ms or 0.0)
                    self.misses[est.link] = 0
                else:
                    self.misses[est.link] += 1
            est.probed = self.held[est.link]

    def per_byte_ms(self) -> list[float | None]:
        """Per link, the held rate as ms per byte (None: none held)."""
        return [w.per_byte_ms if w is not None else None for w in self.held]

    def settle(self, estimates: Sequence[LinkEstimate], links: Sequence[LinkState], floor_ms: float) -> None:
        """Forget what is held for links that no longer need a rate (:func:`_wanted`)."""
        for est, state in zip(estimates, links, strict=True):
            if not _wanted(est, state, floor_ms):
                self.held[est.link] = None
                self.probed_at[est.link] = None
                self.misses[est.link] = 0

    def due(
        self, step: int, estimates: Sequence[LinkEstimate], links: Sequence[LinkState], floor_ms: float
    ) -> tuple[int, ...]:
        """The links to probe before the next step (the same on every rank)."""
        out = []
        for est, state in zip(estimates, links, strict=True):
            if not _wanted(est, state, floor_ms):
                continue
            last, held = self.probed_at[est.link], self.held[est.link]
            misses = self.misses[est.link]
            every = min(self.every_steps, 2**misses) if held is None and misses else self.every_steps
            stale = last is None or step - last >= every
            if stale or (held is not None and _contradicted(est, held)):
                out.append(est.link)
        return tuple(out)


def _wanted(est: LinkEstimate, state: LinkState, floor_ms: float) -> bool:
    """Does the monitor want this link's rate: is it slow, congested, or are the delays of its
    slowest tenth of messages above the detector's floor (what is below it no plan distinguishes)?"""
    return state.slow or state.over > 0 or (bool(est.exact) and quantile(est.exact, WANTED_QUANTILE) > floor_ms)


def _contradicted(est: LinkEstimate, held: WireEstimate) -> bool:
    """Did a pipeline message cross faster than the held rate allows (the rate went up)?"""
    per_byte = held.per_byte_ms
    if per_byte is None:
        return False
    for (path, _), w in est.wires.items():
        if path == PROBE_PATH or not w.costs_ms or w.typical_bytes <= 0:
            continue
        if min(w.costs_ms) < CONTRADICTED * per_byte * w.typical_bytes:
            return True
    return False

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

The book asks for a probe of a link that is slow, congested, or whose messages take longer than the
detector's floor (a rate limit shows before it congests the plan) when none of that step's pipeline
messages measured its rate, at most once every :data:`PROBE_EVERY_STEPS` steps, or sooner when the
held rate is contradicted (a message cost less than the held transmit time: the link got faster).
It holds a link's last probe that measured a rate until the link no longer needs one.
"""

from __future__ import annotations

from collections.abc import Sequence

from titan_morph.monitor.bandwidth import WireEstimate
from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import LinkState
from titan_morph.monitor.profile import PROBE_PATH

__all__ = ["PROBE_EVERY_STEPS", "RateProbes"]

PROBE_EVERY_STEPS = 20
"""Steps between two probes of a link that stays congested (each costs a few message times)."""

CONTRADICTED = 0.9  # a pipeline message under this share of the held transmit time re-probes


class RateProbes:
    """Per link: the last probe that measured a rate, and the step it ran in."""

    def __init__(self, num_links: int, every_steps: int = PROBE_EVERY_STEPS) -> None:
        if every_steps < 1:
            raise ValueError(f"probes need at least 1 step between them, got {every_steps}")
        self.every_steps = every_steps
        self.held: list[WireEstimate | None] = [None] * num_links
        self.probed_at: list[int | None] = [None] * num_links

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

    def due(
        self, step: int, estimates: Sequence[LinkEstimate], links: Sequence[LinkState], floor_ms: float
    ) -> tuple[int, ...]:
        """The links to probe before the next step (the same on every rank)."""
        out = []
        for est, state in zip(estimates, links, strict=True):
            if not _wanted(est, state, floor_ms):
                continue
            if any(w.identified and not w.assumed_rate for (path, _), w in est.wires.items() if path != PROBE_PATH):
                continue  # the pipeline's own messages measured the rate
            last, held = self.probed_at[est.link], self.held[est.link]
            stale = last is None or step - last >= self.every_steps
            if stale or (held is not None and _contradicted(est, held)):
                out.append(est.link)
        return tuple(out)


def _wanted(est: LinkEstimate, state: LinkState, floor_ms: float) -> bool:
    """Does the monitor want this link's rate: is it slow, congested, or are its messages' delays
    above the detector's floor (what is below it no plan distinguishes)?"""
    delay = est.delay_ms
    return state.slow or state.over > 0 or (delay is not None and delay > floor_ms)


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

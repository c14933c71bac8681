"""The runtime's TensorBoard figures, assembled from one step's record and the per-step exchange.

TorchTitan writes TensorBoard from the first rank of the last stage; every rank can compute every
figure here, because the exchange gave each of them all stages' rows. One name per figure (the
README's tables list them). :class:`MetricsSource` and :class:`ImageSource` are what TorchTitan's
metrics processor asks a schedule for.
"""

from __future__ import annotations

import logging
import math
import pickle
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from titan_morph.monitor.profile import StepProfile
from titan_morph.pipelining.core.links import LinkDownError, LinkModel, StaticDelays
from titan_morph.pipelining.core.model import Plan
from titan_morph.pipelining.timing.bounds import lower_bound_under
from titan_morph.pipelining.timing.simulate import simulate
from titan_morph.runtime.records import StepRecord

__all__ = [
    "ImageSource",
    "MetricsSource",
    "TimelineRenderer",
    "bound_ms",
    "message_latencies",
    "pipeline_metrics",
    "pipeline_ms",
    "plan_scalar",
    "predicted_ms",
    "record_metrics",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class MetricsSource(Protocol):
    """A schedule that reports scalars of its last step (called on every rank at the same steps; no
    collectives inside)."""

    def tensorboard_metrics(self, step: int) -> dict[str, float]: ...


@runtime_checkable
class ImageSource(Protocol):
    """A schedule that reports images (HWC RGB arrays) of its last step, as :class:`MetricsSource`."""

    def tensorboard_images(self, step: int) -> dict[str, Any]: ...


def plan_scalar(plan_id: str) -> float:
    """A plan id as a TensorBoard scalar: its first 6 hex digits as an integer (exact in float32)."""
    return float(int(plan_id[:6], 16))


def record_metrics(record: StepRecord, plan: Plan, plan_changes: int, planned_bubble_rate: float) -> dict[str, float]:
    """This rank's figures: its step time, compute, idle and send blocking, and the plan it runs."""
    out = {
        "morph/iteration_ms": record.iteration_ms,
        "morph/compute_ms": record.busy_ms,
        "morph/idle_ms": record.idle_ms,
        "morph/blocked_ms": sum(record.blocked_ms.values()),
        "morph/plan_id": plan_scalar(record.plan_id),
        "morph/plan_changes": float(plan_changes),
        "morph/planned_bubble_rate": planned_bubble_rate,
    }
    if record.planned_makespan_ms is not None:
        out["morph/planned_makespan_ms"] = record.planned_makespan_ms
    model = plan.model
    for link in range(model.num_links):  # a link's slackness: the least of the hops it carries (two in the V)
        out[f"morph/slackness/link{link}"] = float(min(plan.slackness[hop] for hop in model.link_hops(link)))
    for link, ms in sorted(record.blocked_ms.items()):
        out[f"morph/blocked_ms/link{link}"] = ms
    return out


def message_latencies(profiles: Sequence[StepProfile]) -> dict[int, list[float]]:
    """Host latency of emulated messages per link: observed arrival - the link model's delivery time.

    Counted only for messages whose receiver was already waiting when they were due, so a busy
    receiver does not count as latency. This is what the CPU emulation adds to every message (gloo
    over TCP, thread wake-ups); the link model and the simulator assume 0.
    """
    planned = {m.key: m.t2 for p in profiles for m in p.messages if m.side == "send" and not math.isnan(m.t2)}
    out: dict[int, list[float]] = {}
    for p in profiles:
        for m in p.messages:
            due = planned.get(m.key) if m.side == "recv" else None
            if due is not None and not math.isnan(m.t3) and m.t2 <= due:
                out.setdefault(m.link, []).append(m.t3 - due)
    return out


def pipeline_ms(profiles: Sequence[StepProfile], num_stages: int) -> float | None:
    """Stage 0's start to the latest end of any stage (None unless every rank reported; with one
    profile per rank, ``num_stages`` counts ranks)."""
    if len(profiles) != num_stages or profiles[0].stage != 0:
        return None
    span = max(p.end_ms for p in profiles) - profiles[0].start_ms
    return span if span > 0 else None


def pipeline_metrics(profiles: Sequence[StepProfile], num_stages: int) -> dict[str, float]:
    """Figures over all stages of one step (the exchanged profiles, ms on the common clock).

    ``morph/pipeline_ms``: stage 0's start to the latest end of any stage -- what the simulator's
    makespan measures; ``morph/bubble_rate``: 1 - busy / (R x that span) over the ``num_stages``
    profiles, one per rank (R = S with one stage per rank); per-rank (``stage{i}``) idle and send
    blocking; failovers counted on both ends of a link; message latencies (mean: latencies add up
    along the critical path, tail included) and send lateness.
    """
    out: dict[str, float] = {"morph/failovers": float(sum(p.failovers for p in profiles))}
    for p in profiles:
        out[f"morph/stage{p.stage}/idle_ms"] = max(0.0, (p.end_ms - p.start_ms) - p.busy_ms)
        out[f"morph/stage{p.stage}/blocked_ms"] = p.blocked_ms
    span = pipeline_ms(profiles, num_stages)
    if span is not None:
        out["morph/pipeline_ms"] = span
        out["morph/bubble_rate"] = max(0.0, 1.0 - sum(p.busy_ms for p in profiles) / (num_stages * span))
    latencies = message_latencies(profiles)
    if latencies:
        out["morph/latency_ms"] = statistics.fmean(v for vs in latencies.values() for v in vs)
        for link, values in sorted(latencies.items()):
            out[f"morph/latency_ms/link{link}"] = statistics.fmean(values)
    sends = sum(p.sends for p in profiles)
    if sends:
        out["morph/send_latency_ms"] = sum(p.send_late_ms for p in profiles) / sends
    return out


def predicted_ms(plan: Plan, links: LinkModel | None, depth: int | None, step: int, t0_ms: float) -> float | None:
    """The simulator's makespan of ``plan`` for TorchTitan step ``step`` starting at ``t0_ms`` on the
    common clock, under the transport's link model and queue depth (None when it cannot complete)."""
    model = plan.model.with_delays((0.0,) * plan.model.num_links)
    try:
        return simulate(model, plan.orders, links=links, depth=depth, step=step, t0=t0_ms).makespan
    except (LinkDownError, RuntimeError, ValueError):
        return None


def bound_ms(plan: Plan, links: LinkModel | None, step: int, t0_ms: float) -> float | None:
    """A lower bound on any schedule's makespan for the same step, links and compute times as
    :func:`predicted_ms` (:func:`~titan_morph.pipelining.timing.bounds.lower_bound_under`): how far the
    running plan is from the best possible one. None when a link is down."""
    model = plan.model
    if links is None:  # no injected delays
        links = StaticDelays.zeros(model.num_links)
    value = lower_bound_under(model, links, step=step, t0=t0_ms)
    return value if math.isfinite(value) else None


class TimelineRenderer:
    """The active plan's simulated timeline as an RGB array, once per plan change.

    Drawing takes ~1 s of matplotlib, far too long to spend between two steps on the logging rank
    (it would stall the whole pipeline), and what matplotlib allocates natively stays with the
    process that draws (:mod:`titan_morph.pipelining.output.render`): a child process draws it, one at a
    time, and the first call after it is done returns the image (logged at that step).
    """

    def __init__(self) -> None:
        self._image_for: str | None = None  # plan id whose timeline was last asked for
        self._job: tuple[subprocess.Popen[bytes], tempfile.TemporaryDirectory[str]] | None = None

    def image(self, plan: Plan, title: str) -> Any | None:
        job = self._job
        if job is not None and job[0].poll() is not None:
            self._job = None
            return _collect(*job)
        if job is None and self._image_for != plan.plan_id:
            self._image_for = plan.plan_id
            try:
                self._job = _start_render(plan, title)
            except Exception as err:  # a picture must never break training
                logger.warning("titan_morph: could not render the plan timeline: %s", err)
        return None

    def close(self, timeout_s: float) -> None:
        """End a render in progress (its picture would be logged by no later step): the child is
        stopped and its folder removed at once; ``timeout_s`` bounds the wait for it to go."""
        job, self._job = self._job, None
        if job is None:
            return
        proc, folder = job
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning(
                "titan_morph: the plan timeline's process %d did not exit within %.0f s", proc.pid, timeout_s
            )
        folder.cleanup()


def _start_render(plan: Plan, title: str) -> tuple[subprocess.Popen[bytes], tempfile.TemporaryDirectory[str]]:
    folder = tempfile.TemporaryDirectory(prefix="titan_morph_tl")
    source = Path(folder.name, "plan.pkl")
    source.write_bytes(pickle.dumps((plan, title, 80)))
    render = "titan_morph.pipelining.output.render"
    command = [sys.executable, "-m", render, str(source), str(source.with_suffix(".img"))]
    with open(Path(folder.name, "stderr"), "wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    return proc, folder


def _collect(proc: subprocess.Popen[bytes], folder: tempfile.TemporaryDirectory[str]) -> Any | None:
    """The finished child's picture (None, with a warning, when it failed)."""
    try:
        out = Path(folder.name, "plan.img")
        if proc.returncode == 0 and out.exists():
            return pickle.loads(out.read_bytes())
        tail = Path(folder.name, "stderr").read_text(errors="replace").strip().splitlines()[-1:]
        logger.warning("titan_morph: could not render the plan timeline: exit %s %s", proc.returncode, "".join(tail))
        return None
    finally:
        folder.cleanup()

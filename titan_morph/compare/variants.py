"""Named variants of a comparison: a schedule plus the ``[morph]`` transport/adaptation switches.

The defaults mirror the paper's §7 line-up: torch's ``1F1B`` and ZeroBubble ``ZBH2`` on the
default (blocking, NCCL-like) transport, ``PipeMorph-CPU`` (delegated transport of §5, no
re-planning) and ``PipeMorph`` (``transport = auto`` + live re-planning, Alg. 2). For DP x PP
(§7.3, Fig. 19) the orchestrator is part of the variant: ``ZBH2-nomove`` (ranks never move),
``ZBH2-move`` (the slow DP pair moved onto a pipeline link, nothing else: Falcon-like) and
``PipeMorph-move`` (the move, then re-planning and delegation). Every variant is one torchrun job
of ``titan_morph.train``; its overrides come before the scenario's and the user's, so a user
override still wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "Variant",
    "VARIANTS",
    "DEFAULT_VARIANTS",
    "HYBRID_VARIANTS",
    "UnknownVariantError",
    "parse_variants",
    "is_baseline",
]


class UnknownVariantError(ValueError):
    """A variant name that the harness does not know; the message lists the allowed ones."""


@dataclass(frozen=True)
class Variant:
    """One schedule/transport combination run as its own training job."""

    name: str
    schedule: str
    """``[parallelism] pipeline_parallel_schedule``."""
    transport: str
    """``[morph] transport``: default | delegate | auto."""
    adapt: bool
    """``[morph] adapt``: live re-planning (Alg. 2 at step boundaries)."""
    description: str
    extra: tuple[str, ...] = ()
    """Further overrides of the variant (e.g. ``[morph] orchestrator``)."""

    @property
    def overrides(self) -> tuple[str, ...]:
        """Command-line overrides selecting this variant (TorchTitan's bool flags: --x / --no-x)."""
        return (
            "--parallelism.pipeline_parallel_schedule",
            self.schedule,
            "--morph.transport",
            self.transport,
            "--morph.adapt" if self.adapt else "--morph.no-adapt",
            *self.extra,
        )

    @property
    def torch_builtin(self) -> bool:
        """torch's own schedules (no ``morph/*`` schedule scalars, fused backward)."""
        return self.schedule in ("1F1B", "GPipe")


def _v(name: str, schedule: str, transport: str, adapt: bool, description: str, *extra: str) -> Variant:
    return Variant(name, schedule, transport, adapt, description, tuple(extra))


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        _v("1F1B", "1F1B", "default", False, "torch's Schedule1F1B, default (blocking) transport"),
        _v("GPipe", "GPipe", "default", False, "torch's ScheduleGPipe, default transport"),
        _v("Morph1F1B", "Morph1F1B", "default", False, "1F1B orders with split backward in MorphSchedule"),
        _v("ZBH1", "ZBH1", "default", False, "ZeroBubble-H1 (1F1B memory), default transport"),
        _v("ZBH2", "ZBH2", "default", False, "ZeroBubble-H2, default transport"),
        _v("PipeMorph-noadapt", "PipeMorph", "default", False, "PipeMorph's initial plan (Alg. 1), default transport"),
        _v("PipeMorph-replan", "PipeMorph", "default", True, "re-planning (Alg. 2) without delegation"),
        _v("PipeMorph-CPU", "PipeMorph", "delegate", False, "delegated transport (§5) without re-planning"),
        _v("PipeMorph", "PipeMorph", "auto", True, "transport auto + live re-planning (the full system)"),
        _v("ZBH2-nomove", "ZBH2", "default", False, "ZB-H2, ranks never moved", "--morph.orchestrator", "off"),
        _v(
            "ZBH2-move",
            "ZBH2",
            "default",
            False,
            "ZB-H2 after a slow DP pair is moved onto a pipeline link (Falcon-like)",
            "--morph.orchestrator",
            "pp",
        ),
        _v(
            "PipeMorph-move",
            "PipeMorph",
            "auto",
            True,
            "the move, then re-planning and delegation (the full system of §6)",
            "--morph.orchestrator",
            "pp",
        ),
    )
}

HYBRID_VARIANTS: tuple[str, ...] = ("ZBH2-nomove", "ZBH2-move", "PipeMorph-move")
"""Fig. 19's line-up (DP x PP): baseline, move only, PipeMorph."""

DEFAULT_VARIANTS: tuple[str, ...] = ("1F1B", "ZBH2", "PipeMorph-CPU", "PipeMorph")


def parse_variants(spec: str | Iterable[str] | None) -> tuple[Variant, ...]:
    """``"1F1B,ZBH2"`` (case-insensitive, no duplicates) → variants; None/"" → the defaults."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        names: list[str] = list(DEFAULT_VARIANTS)
    else:
        names = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec) if p.strip()]
    by_lower = {name.lower(): v for name, v in VARIANTS.items()}
    out: list[Variant] = []
    for name in names:
        variant = by_lower.get(name.lower())
        if variant is None:
            raise UnknownVariantError(f"unknown variant {name!r}: allowed variants are {', '.join(VARIANTS)}")
        if variant in out:
            raise UnknownVariantError(f"variant {variant.name!r} is listed twice")
        out.append(variant)
    if not out:
        raise UnknownVariantError(f"no variants given: allowed variants are {', '.join(VARIANTS)}")
    return tuple(out)


def is_baseline(variant: Variant) -> bool:
    """Baselines of the speedup columns: every non-PipeMorph schedule."""
    return variant.schedule != "PipeMorph"

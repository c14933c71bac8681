"""Every wrapper titan_morph puts on torch's ``PipelineStage``, in one place and one checked order.

torch's schedules call a stage's ``forward_one_chunk`` (F), ``backward_one_chunk`` (B, or I with
``full_backward=False``) and ``backward_weight_one_chunk`` (W) by name, with no hook around them, so
titan_morph wraps those methods on the stage instance. From the innermost:

1. ``compute``: the op's emulated time, either a compute straggler's extra time on a real model
   (:mod:`.slowdown`) or the synthetic testbed's padding to configured times (:mod:`.testbed`),
   which reads the straggler's factor itself; never both on one stage;
2. ``timing``: the runtime's op clock (:class:`.schedule.MorphSchedule`), outermost, so that it
   measures what the schedule sees, emulated time included, as a GPU's events would.

Apart from the ops, ``messages`` wraps the stage module's ``forward`` (the testbed's fixed message
size, :func:`.testbed.pad_stage_messages`). A layer installed twice, or an op layer under one already
installed, is refused, so the order above is a checked fact rather than a convention of the call sites.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

__all__ = ["OP_METHODS", "Layer", "OpWrapper", "layers", "wrap_module_forward", "wrap_ops"]

OP_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
"""The stage methods torch's schedules call for F, B or I, and W."""

Layer = Literal["messages", "compute", "timing"]
_OP_ORDER: dict[str, int] = {"compute": 0, "timing": 1}
_HELD = "_titan_morph_layers"

OpWrapper = Callable[[str, Callable[..., Any]], Callable[..., Any]]
"""``(method name, the method as installed so far) -> its replacement``."""


def wrap_ops(stage: Any, layer: Literal["compute", "timing"], wrapper: OpWrapper, what: str) -> None:
    """Replace each of ``stage``'s :data:`OP_METHODS` by ``wrapper(name, current)``, as ``layer``
    (``what`` says what it does, for the error when it is installed again)."""
    _claim(stage, layer, what)
    for name in OP_METHODS:
        setattr(stage, name, wrapper(name, getattr(stage, name)))


def wrap_module_forward(stage: Any, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]], what: str) -> None:
    """Replace ``stage.submod.forward`` (torch's stage calls ``submod(...)``) by ``wrapper(forward)``,
    as the ``messages`` layer."""
    _claim(stage, "messages", what)
    submod = stage.submod
    submod.forward = wrapper(submod.forward)


def layers(stage: Any) -> dict[str, str]:
    """The layers installed on ``stage``, innermost first, each with what it does."""
    return dict(vars(stage).get(_HELD, {}))


def _claim(stage: Any, layer: Layer, what: str) -> None:
    held: dict[str, str] = vars(stage).setdefault(_HELD, {})
    index = stage.stage_index
    if layer in held:
        raise RuntimeError(f"stage {index}: {layer} already {held[layer]}")
    above = [name for name in held if layer in _OP_ORDER and _OP_ORDER.get(name, -1) > _OP_ORDER[layer]]
    if above:
        raise RuntimeError(f"stage {index}: {layer} ({what}) must go under {above[0]}, which is already installed")
    held[layer] = what

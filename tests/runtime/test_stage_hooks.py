"""The wrappers on torch's stage stack in the stated order: compute under timing, each once, the
calls passing through every layer innermost first."""

from __future__ import annotations

import pytest

from titan_morph.runtime.stage_hooks import OP_METHODS, layers, wrap_module_forward, wrap_ops


class _Stage:
    stage_index = 2

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.submod = type("Module", (), {"forward": staticmethod(lambda x: x + 1)})()

    def forward_one_chunk(self, mb: int) -> str:
        self.calls.append(f"F{mb}")
        return "out"

    def backward_one_chunk(self, mb: int, full_backward: bool = True) -> None:
        self.calls.append(f"B{mb}")

    def backward_weight_one_chunk(self, mb: int) -> None:
        self.calls.append(f"W{mb}")


def _tagging(stage: _Stage, tag: str):
    def wrap(name, inner):
        def wrapped(*args, **kwargs):
            stage.calls.append(f"{tag}>")
            out = inner(*args, **kwargs)
            stage.calls.append(f"<{tag}")
            return out

        return wrapped

    return wrap


def test_compute_then_timing_wraps_every_op_with_timing_outermost():
    stage = _Stage()
    wrap_ops(stage, "compute", _tagging(stage, "compute"), "slowed")
    wrap_ops(stage, "timing", _tagging(stage, "timing"), "timed")
    wrap_module_forward(stage, lambda forward: lambda x: forward(x) * 10, "padded")
    assert stage.forward_one_chunk(0) == "out"
    stage.backward_one_chunk(0, full_backward=False)
    stage.backward_weight_one_chunk(0)
    assert stage.calls == [c for op in ("F0", "B0", "W0") for c in ("timing>", "compute>", op, "<compute", "<timing")]
    assert stage.submod.forward(1) == 20
    assert list(layers(stage)) == ["compute", "timing", "messages"]
    assert all(name in vars(stage) for name in OP_METHODS)  # on the instance, torch's class untouched


def test_a_layer_twice_or_compute_over_timing_is_refused_naming_the_stage():
    stage = _Stage()
    wrap_ops(stage, "timing", _tagging(stage, "timing"), "timed by a MorphSchedule")
    with pytest.raises(RuntimeError, match=r"^stage 2: timing already timed by a MorphSchedule$"):
        wrap_ops(stage, "timing", _tagging(stage, "timing"), "timed again")
    with pytest.raises(RuntimeError, match=r"^stage 2: compute \(slowed\) must go under timing"):
        wrap_ops(stage, "compute", _tagging(stage, "compute"), "slowed")
    stage.forward_one_chunk(1)
    assert stage.calls == ["timing>", "F1", "<timing"]  # the refused layers left nothing behind
    wrap_module_forward(stage, lambda forward: forward, "padded")  # messages: not an op layer
    with pytest.raises(RuntimeError, match="messages already padded"):
        wrap_module_forward(stage, lambda forward: forward, "padded")

"""Scenario ``fig5-8``: the paper's §3.1 simulations, from the scheduler alone (no training).

* Fig. 5: S = 4, N = 12, F = B = W = 10 ms, a delay c_0 on link 0-1. ZB-H2's orders, planned
  without delay, take 390 ms; executed with c_0 = 10 ms 400 ms and with 20 ms 440 ms (the
  cascade). Next to them: 1F1B's orders, and PipeMorph planned for c_0 (Alg. 2 + Alg. 3/4).
* Fig. 8: N = 30, t = 10 ms, warm-up counts x_i = 1 + Δ(S−1−i) for a uniform slackness Δ, one
  slow link (the last); accumulated delay (makespan − no-delay makespan) and mean bubble rate as
  the delay grows. Theorem 1: up to (Δ−1)·t the delay is absorbed (Θ(c)); beyond it cascades.

All runs use the non-blocking transport (dependency bubbles only, as in §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SimFigures", "fig5_8", "FIG5_DELAYS", "FIG8_DELAYS", "FIG8_SLACKNESS"]

T = 10.0
FIG5_DELAYS = (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0)
FIG8_DELAYS = tuple(float(c) for c in range(0, 81, 10))
FIG8_SLACKNESS = (1, 2, 3, 4)
FIG8_STAGES = 4
FIG8_MICROBATCHES = 30


@dataclass
class SimFigures:
    """Numbers behind both figures; ``markdown()`` renders them, ``plot(path)`` draws them."""

    fig5: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    """schedule -> [(c_0, makespan ms, mean bubble rate)]."""
    fig5_warmup: dict[float, tuple[int, ...]] = field(default_factory=dict)
    """c_0 -> PipeMorph's warm-up counts."""
    fig8: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)
    """Δ -> [(c, accumulated delay ms, mean bubble rate)]."""

    def markdown(self) -> str:
        lines = [
            "**Fig. 5** — S = 4, N = 12, F = B = W = 10 ms, delay c_0 on link 0-1 (non-blocking links); ZB-H2 and"
            " 1F1B run their no-delay orders, PipeMorph is planned for c_0 (Alg. 2, memory unbounded).",
            "",
            "| c_0 (ms) | " + " | ".join(f"{s} ms (bubble rate)" for s in self.fig5) + " | PipeMorph x_i |",
            "|---:|" + "---:|" * len(self.fig5) + "---|",
        ]
        delays = [c for c, _, _ in next(iter(self.fig5.values()))]
        for k, c in enumerate(delays):
            cells = [f"{c:g}"] + [f"{rows[k][1]:.0f} ({rows[k][2]:.1%})" for rows in self.fig5.values()]
            cells.append(",".join(map(str, self.fig5_warmup.get(c, ()))))
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            f"**Fig. 8** — S = {FIG8_STAGES}, N = {FIG8_MICROBATCHES}, t = 10 ms, x_i = 1 + Δ(S−1−i), delay c on the"
            " last link: accumulated delay in ms (mean bubble rate); Theorem 1 threshold (Δ−1)·t.",
            "",
            "| c (ms) | " + " | ".join(f"Δ = {d} (threshold {(d - 1) * T:g} ms)" for d in self.fig8) + " |",
            "|---:|" + "---:|" * len(self.fig8) + "",
        ]
        for k, c in enumerate(FIG8_DELAYS):
            cells = [f"{c:g}"] + [f"{rows[k][1]:.0f} ({rows[k][2]:.1%})" for rows in self.fig8.values()]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, path: Path) -> Path:
        from titan_morph.compare.plots import pyplot, save

        fig, axes = pyplot().subplots(1, 3, figsize=(14, 4.2))
        for name, rows in self.fig5.items():
            axes[0].plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=name)
        axes[0].set(xlabel="c_0 (ms), link 0-1", ylabel="iteration time (ms)", title="Fig. 5: S=4, N=12, t=10 ms")
        for d, rows in self.fig8.items():
            axes[1].plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=f"Δ = {d}")
            axes[2].plot([r[0] for r in rows], [100 * r[2] for r in rows], marker="o", label=f"Δ = {d}")
        axes[1].set(xlabel="delay c on the last link (ms)", ylabel="accumulated delay (ms)", title="Fig. 8 (left)")
        axes[2].set(xlabel="delay c on the last link (ms)", ylabel="mean bubble rate (%)", title="Fig. 8 (right)")
        for ax in axes:
            ax.grid(alpha=0.3)
        return save(fig, path, *axes)


def fig5_8() -> SimFigures:
    """Compute both figures (pure Python, well under a second)."""
    from titan_morph.pipelining.core.model import CostModel
    from titan_morph.pipelining.schedules.generate import generate
    from titan_morph.pipelining.schedules.slackness import uniform_warmup
    from titan_morph.pipelining.search.builders import build
    from titan_morph.pipelining.timing.simulate import simulate

    out = SimFigures()
    base = CostModel.uniform(4, 12, T, T, T)
    fixed = {"ZB-H2": build("zb-h2", base), "1F1B": build("1f1b", base)}
    for name, plan in fixed.items():
        rows = []
        for c in FIG5_DELAYS:
            result = simulate(base.with_delays([c, 0.0, 0.0]), plan.orders)
            rows.append((c, result.makespan, result.mean_bubble_rate))
        out.fig5[name] = rows
    rows = []
    for c in FIG5_DELAYS:
        model = base.with_delays([c, 0.0, 0.0])
        plan = build("pipemorph", model)
        result = simulate(model, plan.orders)
        rows.append((c, result.makespan, result.mean_bubble_rate))
        out.fig5_warmup[c] = plan.warmup
    out.fig5["PipeMorph"] = rows

    stages, n = FIG8_STAGES, FIG8_MICROBATCHES
    model0 = CostModel.uniform(stages, n, T, T, T)
    for slackness in FIG8_SLACKNESS:
        x = uniform_warmup(stages, n, slackness)
        no_delay = simulate(model0, generate(model0, x)).makespan
        rows = []
        for c in FIG8_DELAYS:
            model = model0.with_delays([0.0] * (stages - 2) + [c])
            result = simulate(model, generate(model, x))
            rows.append((c, result.makespan - no_delay, result.mean_bubble_rate))
        out.fig8[slackness] = rows
    return out

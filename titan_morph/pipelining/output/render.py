"""A plan's timeline drawn in a process of its own, for a training rank to log.

``python -m titan_morph.pipelining.output.render IN OUT``: IN holds a pickle of (plan, title, dpi); OUT
receives a pickle of the picture, an H x W x 3 float array (RGB in 0..1).

Why a process: the rank that writes TensorBoard draws the new plan after every re-plan. Drawn in
the rank, matplotlib's native memory (FreeType's glyph caches, kept per font and per thread; the Agg
canvas; the PNG decode) stays with it: ~1-2 MB of resident memory per picture that the allocator
does not give back, over a run that re-plans every few dozen steps. A child takes all of it with it
when it exits, and its second of drawing does not hold the rank's interpreter lock.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from titan_morph.pipelining.core.model import Plan
from titan_morph.pipelining.output.export import timeline_png
from titan_morph.pipelining.timing.simulate import simulate

__all__ = ["render_pickled"]


def render_pickled(source: Path, target: Path) -> None:
    """Draw the plan pickled in ``source`` (with its title and dpi) and pickle its RGB array to
    ``target`` (written whole: a reader never sees half of it). The PNG is drawn beside ``target``:
    the caller's folder holds everything, so removing it leaves nothing behind, even after a kill."""
    import matplotlib.image

    plan, title, dpi = pickle.loads(source.read_bytes())
    if not isinstance(plan, Plan):
        raise TypeError(f"{source}: expected a Plan, got {type(plan).__name__}")
    path = timeline_png(simulate(plan.model, plan.orders), target.with_suffix(".png"), title, dpi=dpi)
    image = matplotlib.image.imread(str(path))[..., :3]
    partial = target.with_name(target.name + ".part")
    partial.write_bytes(pickle.dumps(image))
    partial.replace(target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m titan_morph.pipelining.output.render IN OUT")
    render_pickled(Path(sys.argv[1]), Path(sys.argv[2]))

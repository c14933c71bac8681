"""Export plans and simulated runs: torch CSV, ASCII, Chrome trace, PNG.

A plan is data (architecture contract); this module turns it into what other tools read:

* :func:`write_csv` / :func:`read_csv` — torch's *compute-only* CSV (one line per rank, actions
  such as ``0F0,0I0,0W0``), exactly what ``_PipelineScheduleRuntime._load_csv(path,
  "compute_only")`` and TorchTitan's ``pipeline_parallel_schedule_csv`` read.
* :func:`format_orders` — a step × rank grid like torch's ``_format_pipeline_order`` for logs.
* :func:`chrome_trace` / :func:`timeline_png` — pictures of a simulated iteration
  (``simulate.SimResult``): ops, idle bubbles, head-of-line send blocking (§3.2) and link delays.

Pure Python except the matplotlib import inside :func:`timeline_png`; the lowering to torch's
``_Action`` IR lives with the runtime (``titan_morph.runtime.actions``).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from titan_morph.pipelining.core.model import KINDS, Op, Order, Plan, validate_orders

if TYPE_CHECKING:  # pragma: no cover - typing only
    from titan_morph.pipelining.core.links import LinkModel
    from titan_morph.pipelining.timing.simulate import SimResult

PlanOrOrders = Plan | Sequence[Sequence[Op]]

# Token of torch's compute-only CSV: <stage><kind><microbatch>, e.g. "0F0", "3W11".
_TOKEN_RE = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")
_COMM_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OVERLAP_F_B")

#: Colours per op kind, shared by the PNG and (as names) the Chrome trace.
COLORS = {"F": "#4e79a7", "I": "#f28e2b", "W": "#59a14f", "B": "#e15759"}
_CHROME_COLORS = {"F": "thread_state_running", "I": "thread_state_iowait", "W": "good", "B": "terrible"}


def _orders_of(plan_or_orders: PlanOrOrders) -> tuple[Order, ...]:
    """Per-stage orders of a :class:`Plan` or of a sequence of op sequences (strings allowed)."""
    orders = plan_or_orders.orders if isinstance(plan_or_orders, Plan) else plan_or_orders
    out = []
    for stage, order in enumerate(orders):
        ops = []
        for op in order:
            if isinstance(op, str):
                op = Op.parse(op)
            elif not isinstance(op, Op):
                raise TypeError(f"stage {stage}: expected Op or 'F3'-style string, got {type(op).__name__}")
            ops.append(op)
        out.append(tuple(ops))
    return tuple(out)


def csv_rows(plan_or_orders: PlanOrOrders) -> list[list[str]]:
    """Rows of the compute-only CSV: row ``r`` holds ``f"{stage}{kind}{mb}"`` per op of rank ``r``
    (the op's stage; the rank itself when the op names none: one stage per rank)."""
    return [
        [f"{rank if op.stage is None else op.stage}{op.kind}{op.mb}" for op in order]
        for rank, order in enumerate(_orders_of(plan_or_orders))
    ]


def write_csv(plan_or_orders: PlanOrOrders, path: str | Path) -> Path:
    """Write torch's compute-only CSV (what ``_load_csv(path, "compute_only")`` reads); returns the path.
    A :class:`Plan` is checked first against what torch's runtime needs (:func:`model.validate_orders`)."""
    if isinstance(plan_or_orders, Plan):
        validate_orders(plan_or_orders.model, plan_or_orders.orders)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        for row in csv_rows(plan_or_orders):
            writer.writerow(row)
    return path


def read_csv(path: str | Path) -> tuple[Order, ...]:
    """Parse a compute-only torch CSV into per-rank orders (line ``r`` = rank ``r``).

    Pure Python (no torch). Empty cells (torch writes ``None`` steps as ``""``) are skipped;
    trailing blank lines are ignored. When every action's stage is its rank, the ops name no stage
    (one stage per rank); otherwise every op keeps its stage (several stages per rank, e.g. the V,
    which :func:`model.validate_orders` then checks). Anything that is not
    ``<stage><F|I|W|B><mb>`` raises ``ValueError`` naming the file, line and token.
    """
    path = Path(path)
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise ValueError(f"{path}: empty schedule CSV (expected one line of actions per rank, e.g. '0F0,0I0,0W0')")
    orders: list[Order] = []
    for rank, row in enumerate(rows):
        line = rank + 1
        ops: list[Op] = []
        for col, cell in enumerate(row, start=1):
            token = cell.strip()
            if not token:
                continue
            where = f"{path}: line {line}, token {col} {token!r}"
            match = _TOKEN_RE.match(token)
            if match is None:
                raise ValueError(f"{where}: expected <stage><kind><microbatch> such as '{rank}F0'")
            stage, kind, mb = int(match.group(1)), match.group(2), match.group(3)
            if kind in _COMM_KINDS:
                raise ValueError(f"{where}: {kind} is not a compute action; only compute-only CSVs ({'/'.join(KINDS)})")
            if kind not in KINDS:
                raise ValueError(f"{where}: unknown action kind {kind!r}, expected one of {'/'.join(KINDS)}")
            if mb == "":
                raise ValueError(f"{where}: missing microbatch index")
            ops.append(Op(kind, int(mb), stage))
        if not ops:
            raise ValueError(f"{path}: line {line}: rank {rank} has no actions")
        orders.append(tuple(ops))
    if all(op.stage == rank for rank, order in enumerate(orders) for op in order):
        return tuple(tuple(Op(op.kind, op.mb) for op in order) for order in orders)
    ranks = len(orders)
    for rank, (row, order) in enumerate(zip(rows, orders)):
        for op in order:
            if op.stage not in (rank, 2 * ranks - 1 - rank):
                col = 1 + [cell.strip() for cell in row].index(f"{op.stage}{op.kind}{op.mb}")
                raise ValueError(
                    f"{path}: line {rank + 1}, token {col} '{op}': stage {op.stage} on rank {rank}; titan_morph"
                    f" places one stage per rank (stage = rank) or two in a V (stages {rank} and"
                    f" {2 * ranks - 1 - rank} on rank {rank} of {ranks})"
                )
    return tuple(orders)


def format_orders(orders: PlanOrOrders, error_step: int | None = None) -> str:
    """Step × rank grid of the orders (like torch's ``_format_pipeline_order``) for logs."""
    ords = _orders_of(orders)
    if not ords:
        return "(no stages)\n"
    steps = max(len(o) for o in ords)
    width = len(str(max(steps - 1, 0)))
    labels = [f"Step {str(i).zfill(width)}" for i in range(steps)]
    cols = [[str(op) for op in o] + [""] * (steps - len(o)) for o in ords]
    widths = [max(len(f"Rank {r}"), *(len(c) for c in col)) for r, col in enumerate(cols)]
    header = " " * (len(labels[0]) + 2) + " ".join(f"{f'Rank {r}':<{w}}" for r, w in enumerate(widths))
    rows = []
    for i, label in enumerate(labels):
        cells = " ".join(f"{col[i]:<{w}}" for col, w in zip(cols, widths)).rstrip()
        mark = "  <-- ERROR HERE" if error_step == i else ""
        rows.append(f"{label}: {cells}{mark}")
    return header.rstrip() + "\n" + "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------------
# Pictures of a simulated iteration
# ---------------------------------------------------------------------------------------------


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


OpTimingLike = Any  # simulate.OpTiming (duck-typed so this module imports without simulate)


@dataclass(frozen=True)
class Message:
    """One inter-stage message of a simulated run (activation ``fwd`` or gradient ``bwd``)."""

    link: int
    direction: str
    src: OpTimingLike
    dst: OpTimingLike
    accepted: float  # the link took it: sender end + send blocking
    delivered: float  # FIFO delivery under the link model
    wire: tuple[float, float] = (0.0, 0.0)  # its transmission (start, end): the link's occupancy

    @property
    def transmitting(self) -> bool:
        """Did it occupy the wire (a link with a transmit time), or only take the latency?"""
        return self.wire[1] > self.wire[0]


def messages(result: SimResult, links: LinkModel | None = None, step: int = 0) -> list[Message]:
    """Every message of ``result`` with its delivery time (links.py semantics: FIFO per link/direction).

    F on stage s sends to F on s+1, I/B on stage s to I/B on s−1, over the link between their
    ranks (``fwd`` from rank i to i+1, ``bwd`` back; one stage per rank: link s, link s−1); the
    V's local hop sends nothing. ``links`` defaults to the model's (``model.delays`` as latency,
    ``model.transmit`` per message); pass the model the run was simulated with when it was not
    static. Deliveries come from :class:`links.LinkQueue` (one message on the wire at a time).
    """
    from titan_morph.pipelining.core.links import DIRECTIONS, LinkQueue, StaticDelays

    model = result.model
    link_model = links if links is not None else StaticDelays(model.delays, transmit=model.transmit)
    route_f, route_b = model.routes()
    where: dict[tuple[int, str, int], Any] = {}
    for rank_timings in result.timings:
        for t in rank_timings:
            stage = t.stage if t.op.stage is None else t.op.stage
            where[(stage, "I" if t.op.kind == "B" else t.op.kind, t.op.mb)] = t
    pending: dict[tuple[int, str], list[tuple[float, Any, Any]]] = {}
    for rank_timings in result.timings:
        for t in rank_timings:
            stage = t.stage if t.op.stage is None else t.op.stage
            if t.op.kind == "F":
                route, dst = route_f[stage], where.get((stage + 1, "F", t.op.mb))
            elif t.op.kind in ("I", "B"):
                route, dst = route_b[stage], where.get((stage - 1, "I", t.op.mb))
            else:
                continue
            if route is None:  # a local hop, or no next stage
                continue
            key = (route[0], DIRECTIONS[route[1]])
            if dst is not None:
                pending.setdefault(key, []).append((t.end + t.blocked, t, dst))
    out = []
    for (link, direction), sends in sorted(pending.items()):
        queue = LinkQueue(link_model, link, direction)
        for accepted, src, dst in sorted(sends, key=lambda e: (e[0], e[1].end)):
            sent = queue.send(accepted, step)
            out.append(Message(link, direction, src, dst, accepted, sent.delivered, sent.on_wire))
    return out


def chrome_trace(result: SimResult, path: str | Path, links: LinkModel | None = None, step: int = 0) -> Path:
    """Write a Chrome/Perfetto trace of a simulated iteration; returns the path.

    One process per rank (``pid`` = rank; the stage with one stage per rank): complete ``X``
    events named ``F3``/``I3``/``W3`` (``5F3`` when ops name their stage; ``cat`` = kind) on
    thread 0, and send-blocking intervals (head-of-line blocking, §3.2) as ``X`` events with
    ``cat = "blocked"`` on thread 1. One more process per link (``pid`` = R + link) shows each
    message in flight (async ``b``/``e`` events, ``cat = "link"``, from acceptance to delivery:
    the link delay), on links with a transmit time each direction's occupancy (``X`` events, ``cat
    = "wire"``, thread 1 ``fwd`` and 2 ``bwd``: one message at a time), and a flow arrow joins each sending op to the op
    that consumes the message. Times are µs from the iteration start. ``links``/``step`` as in
    :func:`messages` (the link model and step the run was simulated with).
    """
    events: list[dict[str, Any]] = []
    stages = len(result.timings)
    word = "stage" if result.model.stages_per_rank == 1 else "rank"
    for stage in range(stages):
        events.append({"name": "process_name", "ph": "M", "pid": stage, "tid": 0, "args": {"name": f"{word} {stage}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": stage, "tid": 0, "args": {"sort_index": stage}})
        events.append({"name": "thread_name", "ph": "M", "pid": stage, "tid": 0, "args": {"name": "compute"}})
        events.append({"name": "thread_name", "ph": "M", "pid": stage, "tid": 1, "args": {"name": "send blocked"}})
    for link in range(result.model.num_links):
        pid = stages + link
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"link {link}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        if result.model.transmit[link] > 0 or links is not None:
            for tid, direction in ((1, "fwd"), (2, "bwd")):
                label = {"name": f"wire {direction}"}
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": label})
    for stage_timings in result.timings:
        for t in stage_timings:
            events.append(
                {
                    "name": str(t.op),
                    "cat": t.op.kind,
                    "ph": "X",
                    "pid": t.stage,
                    "tid": 0,
                    "ts": _us(t.start),
                    "dur": _us(t.end - t.start),
                    "cname": _CHROME_COLORS[t.op.kind],
                    "args": {"microbatch": t.op.mb, "ready_ms": t.ready, "waited_ms": max(0.0, t.start - t.ready)},
                }
            )
            if t.blocked > 0:
                events.append(
                    {
                        "name": f"send after {t.op} blocked",
                        "cat": "blocked",
                        "ph": "X",
                        "pid": t.stage,
                        "tid": 1,
                        "ts": _us(t.end),
                        "dur": _us(t.blocked),
                        "cname": "bad",
                        "args": {"blocked_ms": t.blocked},
                    }
                )
    for msg_id, msg in enumerate(messages(result, links, step)):
        name = f"{msg.src.op} {msg.src.stage}->{msg.dst.stage}"
        args = {"accepted_ms": msg.accepted, "delivered_ms": msg.delivered, "delay_ms": msg.delivered - msg.accepted}
        pid = stages + msg.link
        common = {"name": name, "cat": "link", "id": f"m{msg_id}", "pid": pid, "tid": 0}
        events.append({**common, "ph": "b", "ts": _us(msg.accepted), "args": args})
        events.append({**common, "ph": "e", "ts": _us(msg.delivered)})
        if msg.transmitting:
            start, end = msg.wire
            events.append(
                {
                    "name": name,
                    "cat": "wire",
                    "ph": "X",
                    "pid": pid,
                    "tid": 1 if msg.direction == "fwd" else 2,
                    "ts": _us(start),
                    "dur": _us(end - start),
                    "args": {"queued_ms": start - msg.accepted, "transmit_ms": end - start},
                }
            )
        # Flow arrow from the producing op to the consuming op (bound to the middle of each slice).
        flow = {"name": name, "cat": "dataflow", "id": msg_id}
        src_mid, dst_mid = (msg.src.start + msg.src.end) / 2, (msg.dst.start + msg.dst.end) / 2
        events.append({**flow, "ph": "s", "pid": msg.src.stage, "tid": 0, "ts": _us(src_mid)})
        events.append({**flow, "ph": "f", "bp": "e", "pid": msg.dst.stage, "tid": 0, "ts": _us(dst_mid)})
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "makespan_ms": result.makespan,
            "bubble_rate": list(result.bubble_rate),
            "blocked_ms": list(result.blocked_ms),
            "delays_ms": list(result.model.delays),
            "transmit_ms": list(result.model.transmit),
        },
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def timeline_png(result: SimResult, path: str | Path, title: str | None = None, *, dpi: int = 110) -> Path:
    """Draw stages × time (Fig. 4/5 style) to a PNG; returns the path.

    Ops are coloured by kind (:data:`COLORS`) with the microbatch id on each box, idle time shows
    the light background (bubbles), send-blocked intervals are hatched, and the makespan and each
    stage's bubble rate are annotated. matplotlib (Agg) is imported here only.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    stages = len(result.timings)
    makespan = max(result.makespan, 1e-9)
    fig_w = min(24.0, max(8.0, 0.06 * sum(len(t) for t in result.timings) / max(stages, 1) * 3 + 4))
    fig_h = 0.55 * stages + 1.8
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=dpi)
    pts_per_ms = fig_w * 72 * 0.82 / (makespan * 1.13)  # axes ≈ 82 % of the figure width
    kinds_used = _draw_rows(ax, result, makespan, pts_per_ms)
    wire_used = _draw_links(ax, result)
    _draw_frame(fig, ax, result, makespan, title, kinds_used, wire_used)
    fig.tight_layout(rect=(0, 0.35 / fig_h, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


_ROW_H = 0.8  # a row's height in the timeline, in rows


def _draw_rows(ax: Any, result: SimResult, makespan: float, pts_per_ms: float) -> list[str]:
    """One row per rank: the idle background, the ops, send-blocked intervals and the bubble rate;
    returns the op kinds drawn, in order of appearance."""
    from matplotlib.patches import Rectangle

    stages, row_h = len(result.timings), _ROW_H
    kinds_used: list[str] = []
    for stage, stage_timings in enumerate(result.timings):
        y: float = stages - 1 - stage
        ax.add_patch(Rectangle((0, y - row_h / 2), makespan, row_h, facecolor="#f4f4f4", edgecolor="#d0d0d0"))
        for t in stage_timings:
            kind = t.op.kind
            if kind not in kinds_used:
                kinds_used.append(kind)
            width = t.end - t.start
            ax.add_patch(
                Rectangle(
                    (t.start, y - row_h / 2), width, row_h, facecolor=COLORS[kind], edgecolor="white", linewidth=0.6
                )
            )
            if t.blocked > 0:
                ax.add_patch(
                    Rectangle(
                        (t.end, y - row_h / 2),
                        t.blocked,
                        row_h,
                        facecolor="none",
                        edgecolor="#b22222",
                        hatch="////",
                        linewidth=0.6,
                    )
                )
            # Microbatch id on the box (with its stage in the V), in the largest font (<= 7 pt) that fits.
            label = str(t.op.mb) if t.op.stage is None else f"{t.op.stage}:{t.op.mb}"
            size = min(7.0, width * pts_per_ms / (0.62 * len(label) + 0.3))
            if size >= 4.0:
                ax.text(
                    t.start + width / 2,
                    y,
                    label,
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="white",
                    fontweight="bold",
                )
        rate = result.bubble_rate[stage]
        blocked = result.blocked_ms[stage]
        note = f"bubble {rate:.1%}" + (f"\nblocked {blocked:.0f} ms" if blocked > 0 else "")
        ax.text(makespan * 1.01, y, note, va="center", ha="left", fontsize=8)
    return kinds_used


def _draw_links(ax: Any, result: SimResult) -> bool:
    """Between the rows a link joins: its occupancy under transmit times (thin bars, forward above)
    and its delay (the model's view, left of the axis); returns whether a wire was busy."""
    from matplotlib.patches import Rectangle

    stages = len(result.timings)
    wire_used = False
    for msg in messages(result) if result.model.has_transmit else ():
        if msg.transmitting:
            wire_used = True
            y = stages - 1.5 - msg.link + (0.05 if msg.direction == "fwd" else -0.05)
            start, end = msg.wire
            color = "#333333" if msg.direction == "fwd" else "#8a8a8a"
            ax.add_patch(Rectangle((start, y - 0.04), end - start, 0.08, facecolor=color, linewidth=0))
    for link, delay in enumerate(result.model.delays):
        if delay > 0:
            y = stages - 1.5 - link
            ax.text(
                -0.005,
                y,
                f"{delay:g} ms",
                transform=ax.get_yaxis_transform(),
                ha="right",
                va="center",
                fontsize=7,
                color="#b22222",
            )
    return wire_used


def _draw_frame(
    fig: Any, ax: Any, result: SimResult, makespan: float, title: str | None, kinds_used: list[str], wire_used: bool
) -> None:
    """The makespan line, the axes, the legend of what was drawn and the title with the run's figures."""
    from matplotlib.patches import Patch

    stages = len(result.timings)
    ax.axvline(makespan, color="black", linestyle="--", linewidth=1)
    ax.text(makespan, stages - 0.45, f"makespan {makespan:.1f} ms", ha="right", va="bottom", fontsize=9)
    ax.set_xlim(0, makespan * 1.13)
    ax.set_ylim(-0.6, stages - 0.4 + 0.35)
    ax.set_yticks(range(stages))
    v = result.model.stages_per_rank > 1
    ax.set_yticklabels([("R" if v else "S") + str(s) for s in reversed(range(stages))])
    ax.set_xlabel("time (ms)")
    names = {"F": "F (forward)", "I": "I (backward input)", "W": "W (backward weight)", "B": "B (full backward)"}
    handles = [Patch(facecolor=COLORS[k], label=names[k]) for k in KINDS if k in kinds_used]
    handles.append(Patch(facecolor="#f4f4f4", edgecolor="#d0d0d0", label="idle (bubble)"))
    if any(b > 0 for b in result.blocked_ms):
        handles.append(Patch(facecolor="none", edgecolor="#b22222", hatch="////", label="send blocked"))
    if wire_used:
        handles.append(Patch(facecolor="#333333", label="link busy fwd"))
        handles.append(Patch(facecolor="#8a8a8a", label="link busy bwd"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    delays = ", ".join(f"{d:g}" for d in result.model.delays) or "-"
    mean_rate = sum(result.bubble_rate) / max(len(result.bubble_rate), 1)
    head = title or "pipeline timeline"
    ax.set_title(
        f"{head}\n{f'R={stages} (2 stages per rank, V)' if v else f'S={stages}'} N={result.model.microbatches}"
        f"  link delays [{delays}] ms  "
        + (f"transmit [{', '.join(f'{t:g}' for t in result.model.transmit)}] ms/msg  " if wire_used else "")
        + f"makespan {makespan:.1f} ms  mean bubble {mean_rate:.1%}",
        fontsize=10,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def load_orders_json(data: Mapping[str, Sequence[str]]) -> tuple[Order, ...]:
    """Inverse of :meth:`Plan.orders_json`: ``{"0": ["F0", ...], ...}`` (or ``"5F3"`` with stages) →
    per-rank orders."""
    try:
        ranks = sorted(int(k) for k in data)
    except ValueError as exc:
        raise ValueError(f"orders JSON keys must be rank numbers, got {sorted(data)}") from exc
    if ranks != list(range(len(ranks))):
        raise ValueError(f"orders JSON must hold ranks 0..{len(ranks) - 1} exactly, got {ranks}")
    return tuple(tuple(Op.parse(s) for s in data[str(r)]) for r in ranks)

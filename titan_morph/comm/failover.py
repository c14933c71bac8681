"""``[morph] transport = "auto"``: the default path per link, the delegated path when told or when
the link fails (issue 5 items 2–3; paper §5: a failed link/NIC is routed around via the delegates
instead of crashing training).

:class:`FailoverTransport` routes each (link, direction) either through ``primary`` (the default
transport, normally the link emulator) or through ``delegate`` (a
:class:`~titan_morph.comm.delegate.DelegateTransport`).

* Told (``switch(links)``): between steps, on every rank, both directions of the links move to the
  delegates — nothing is in flight then, so nothing is lost or reordered.
* Failover: a send the primary refuses with :class:`LinkDownError` moves that (link, direction) to
  the delegates on the sending rank and is re-issued there. The receiving rank learns it from its
  receive (the emulator delivers the refused message's placeholder, or gives up after its grace
  period, as :class:`LinkDownError`): it moves the (link, direction) too and re-posts, on the
  delegates and *in posting order*, every receive of that direction still outstanding on the
  primary. Both sides thus number the delegated messages of that direction identically from the
  first failed one on (the delegated path's per-link order), without restart. Each failover is
  counted (``failovers``) and logged.

Records (issue 6): :meth:`take_records` returns both paths' :class:`MessageRecord` s, each naming
its ``path``; sequence numbers count per path, so a send matches its receive by
(path, link, direction, seq). Both transports share one ``epoch`` (t=0 of all their times).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch.distributed as dist

from titan_morph.comm.emulator import MessageRecord
from titan_morph.comm.transport import Handle, Transport, classify_op
from titan_morph.pipelining.links import LinkDownError

logger = logging.getLogger(__name__)

__all__ = ["FailoverTransport"]


class _Recv:
    """A receive posted on the primary that fails over to the delegates if the link goes down."""

    def __init__(self, owner: FailoverTransport, key: tuple[int, str], ops: list[dist.P2POp], inner: Handle) -> None:
        self.owner, self.key, self.ops, self.inner = owner, key, ops, inner
        self.rerouted: Handle | None = None
        self.done = False

    def wait(self, timeout: float | None = None) -> bool:
        if self.rerouted is None and not self.done:
            try:
                self.inner.wait(timeout)
                self.done = True
                pending = self.owner._pending.get(self.key, [])
                if self in pending:
                    pending.remove(self)
                return True
            except LinkDownError as e:
                self.owner._fail_over(self.key, f"receive: {e}")
        if self.rerouted is not None:
            return bool(self.rerouted.wait(timeout))
        return True

    def is_completed(self) -> bool:
        return self.done or (
            self.rerouted is not None and bool(getattr(self.rerouted, "is_completed", lambda: False)())
        )


class FailoverTransport:
    """Per-(link, direction) routing between a default ``primary`` and a ``delegate`` transport."""

    name = "auto"

    def __init__(self, primary: Transport, delegate: Any, *, stage: int, num_stages: int) -> None:
        self.primary, self.delegate = primary, delegate
        self.stage, self.num_stages = stage, num_stages
        self.delegated: set[tuple[int, str]] = set()
        self.switched: set[tuple[int, str]] = set()  # delegated by switch() (not by a failure)
        self.failovers = 0
        self.failover_log: list[tuple[int, int, str, str]] = []  # (step, link, direction, why)
        self._pending: dict[tuple[int, str], list[_Recv]] = {}
        self._group_name = delegate.group.group_name
        # what MorphSchedule reads for predictions/metrics: the primary's link model
        self.links = getattr(primary, "links", None)
        epochs = {float(e) for t in (primary, delegate) if (e := getattr(t, "epoch", None)) is not None}
        if len(epochs) > 1:
            raise ValueError(
                f"FailoverTransport: primary and delegate must share one epoch (records' t=0), got {sorted(epochs)}"
            )
        self.epoch = epochs.pop() if epochs else None
        self.depth = getattr(primary, "depth", None)
        self.step = 0

    def set_step(self, step: int) -> None:
        self.step = int(step)
        for t in (self.primary, self.delegate):
            if hasattr(t, "set_step"):
                t.set_step(step)

    def switch(self, links: list[int] | set[int]) -> None:
        """Move both directions of ``links`` to the delegates; call between steps on every rank."""
        for link in links:
            if not 0 <= link < self.num_stages - 1:
                raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")
            for d in ("fwd", "bwd"):
                if self._pending.get((link, d)):
                    raise RuntimeError(f"switch(link {link}) with {d} receives outstanding: switch between steps only")
                if (link, d) not in self.delegated:
                    self.switched.add((link, d))
                self.delegated.add((link, d))

    def restore(self, links: list[int] | set[int]) -> None:
        """Move ``links`` that :meth:`switch` delegated back to the primary (a recovered straggler);
        call between steps on every rank. Directions that failed over (link down) stay delegated:
        nothing shows that the failed path works again."""
        for link in links:
            if not 0 <= link < self.num_stages - 1:
                raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")
            for d in ("fwd", "bwd"):
                if (link, d) in self.switched:
                    self.switched.discard((link, d))
                    self.delegated.discard((link, d))

    def _fail_over(self, key: tuple[int, str], why: str) -> None:
        if key in self.delegated:
            return
        self.delegated.add(key)
        self.switched.discard(key)  # a failed path stays delegated, even after a restore()
        self.failovers += 1
        self.failover_log.append((self.step, key[0], key[1], why))
        logger.warning(
            "titan_morph: link %d (%s) failed at step %d on stage %d; traffic fails over to the delegates (%s)",
            key[0],
            key[1],
            self.step,
            self.stage,
            why,
        )
        for rec in list(self._pending.get(key, [])):  # re-post outstanding receives, in posting order
            (rec.rerouted,) = self.delegate.batch_p2p(rec.ops)
        self._pending[key] = []

    def _down_now(self, link: int, direction: str) -> bool:
        links = getattr(self.primary, "links", None)
        now = getattr(self.primary, "now_ms", None)
        if links is None or now is None:
            return False
        return math.isinf(links.delay_ms(link, direction, now(), getattr(self.primary, "step", 0)))

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        ops = list(ops)
        via_delegate, via_primary, keys = [], [], {}
        for op in ops:
            if op.group.group_name != self._group_name:
                via_primary.append(op)
                continue
            lo = classify_op(op, self.stage, self.num_stages)
            keys[id(op)] = (lo.link, lo.direction, lo.is_send)
            (via_delegate if (lo.link, lo.direction) in self.delegated else via_primary).append(op)
        handles: list[Handle] = []
        if via_delegate:
            handles += self.delegate.batch_p2p(via_delegate, desc)
        if not via_primary:
            return handles
        try:
            inner = self.primary.batch_p2p(via_primary, desc)
        except LinkDownError as e:  # nothing of the batch was issued; move the dead sends and retry
            down = {
                (k[0], k[1]) for op in via_primary if (k := keys.get(id(op))) and k[2] and self._down_now(k[0], k[1])
            }
            for key in down or {(e.link, e.direction)}:
                self._fail_over(key, f"send: {e}")
            return handles + self.batch_p2p(via_primary, desc)
        for h in inner:
            h_ops = getattr(h, "ops", None)
            rec = getattr(h, "record", None)
            if h_ops and rec is not None and rec.side == "recv":
                key = (rec.link, rec.direction)
                wrapped = _Recv(self, key, list(h_ops), h)
                self._pending.setdefault(key, []).append(wrapped)
                handles.append(wrapped)
            else:
                handles.append(h)
        return handles

    def _gather(self, method: str) -> list[MessageRecord]:
        out: list[MessageRecord] = []
        for t in (self.primary, self.delegate):
            fn = getattr(t, method, None)
            if callable(fn):
                out += fn()
        return out

    def records(self) -> list[MessageRecord]:
        """Snapshot (copies) of the primary's and the delegate's message records; see ``path``."""
        return self._gather("records")

    def take_records(self) -> list[MessageRecord]:
        """The primary's and the delegate's records so far, then forget them (per-step metrics)."""
        return self._gather("take_records")

    def blocked_ms(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for t in (self.primary, self.delegate):
            fn = getattr(t, "blocked_ms", None)
            for link, ms in (fn() if callable(fn) else {}).items():
                out[link] = out.get(link, 0.0) + ms
        return out

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        try:
            self.primary.close()
        finally:
            self.delegate.close(timeout=timeout, drain=drain)

    def __enter__(self) -> FailoverTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)

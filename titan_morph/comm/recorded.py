"""RecordedTransport: plain torch.distributed P2P that keeps a :class:`MessageRecord` per message,
so the straggler monitor also works without the link emulator (``[morph] transport = "default"``
with no injection, including real GPU clusters).

The ops of one ``batch_p2p`` call go to ``inner`` in one call, exactly as torch's ``_batch_p2p``
issues them (NCCL coalescing of mixed batches included); this wrapper only names each message
(one call's ops on one (link, direction), as the emulator groups them) and stamps it. No threads,
no store traffic: a dict lookup and a record per message.

Stamps (ms since ``epoch``): a send has ``issued = accepted`` = the call (torch queues it at once)
and ``completed`` = its wait returned; a receive has ``issued`` = posted, ``waited`` = the consumer
began waiting and ``completed`` = that wait returned. ``arrived`` stays None: gloo cannot report a
receive before its wait. A monitor therefore gets an exact delivery sample only from a receive the
consumer was already blocked on when the data came; other receives bound the delay from above.

On NCCL a bounded wait is stream-ordered and returns at once (:class:`~titan_morph.comm.transport.TorchHandle`);
``completed`` is then when the device watch saw the operation complete, i.e. when the data was
usable on this device, and a send from CUDA tensors also gets ``ready``: when its payload was ready
on the sender's device
(:mod:`titan_morph.comm.machine.stamps`), so a busy sender queue is not read as a slow link.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from titan_morph.comm.machine.stamps import DeviceStamps, ReadyStamp
from titan_morph.comm.records import CommTimeoutError, MessageBook, MessageRecord
from titan_morph.comm.transport import P2P, DefaultPathOnly, DeviceOrdered, Handle, Transport, group_by_link
from titan_morph.comm.waits import DeviceOp, on_nccl

__all__ = ["PROBE_MESSAGES", "ProbeTimes", "RecordedTransport", "probe_train"]


class _Handle:
    """One message's inner works; the first wait stamps ``waited``, the first that returns
    ``completed`` (``settle`` waits for them without stamps: :class:`~titan_morph.comm.transport.Settles`)."""

    __slots__ = ("owner", "ops", "record", "works", "settled")
    due_s = None

    def __init__(
        self, owner: RecordedTransport, ops: list[dist.P2POp], record: MessageRecord, works: list[Handle]
    ) -> None:
        self.owner, self.ops, self.record, self.works = owner, ops, record, works
        self.settled = False  # the inner works were waited (gloo's point-to-point works take one wait)

    def wait(self, timeout: float | None = None) -> bool:
        rec = self.record
        if rec.waited is None:
            rec.waited = self.owner.now_ms()
        self.settle(timeout)
        on_device = self.device_ops()
        if on_device and rec.completed is None:  # NCCL: completed once the device ran them (stamped by the watch)
            left = [len(on_device)]
            lock = threading.Lock()

            def landed(t: float) -> None:
                with lock:
                    left[0] -= 1
                    if left[0] == 0 and rec.completed is None:
                        rec.completed = (t - self.owner.epoch) * 1e3
                        rec.status = "done"

            for device_op in on_device:
                device_op.when_landed(landed)
        elif rec.completed is None:
            rec.completed = self.owner.now_ms()
            rec.status = "done"
        return True

    def settle(self, timeout: float | None = None) -> None:
        """Wait for the inner works once (at most ``timeout`` s) without stamping: a gloo send or
        receive work consumes its completion in its first wait, a second one blocks to its bound. A
        failure of torch's own is named with this rank, the link and the message."""
        if self.settled:
            return
        rec = self.record
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        try:
            for w in self.works:
                w.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self.settled = True
        except Exception as e:
            rec.status = "error"
            if type(e).__module__.startswith("titan_morph"):
                raise  # named already (a per-link group's error: the failover acts on its type)
            # torch's own error (a gloo timeout, a closed pair) names neither rank nor link
            op = "send to" if rec.side == "send" else "receive from"
            cause = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            kind = CommTimeoutError if "timed out" in cause.lower() else RuntimeError
            raise kind(
                f"{self.owner.where()}: {op} stage {rec.peer_stage} on link {rec.link} ({rec.direction}), message "
                f"{rec.seq} of step {rec.step}, failed after {time.monotonic() - t0:.3g} s: {cause}"
            ) from e

    def is_completed(self) -> bool:
        return self.record.completed is not None or self.settled

    def device_ops(self) -> list[DeviceOp]:
        return [op for w in self.works if isinstance(w, DeviceOrdered) for op in w.device_ops()]


class RecordedTransport(DefaultPathOnly, MessageBook, Transport):
    """Records every pipeline message of ``inner`` (normally :class:`TorchTransport`); see module docstring.

    Args:
        inner: the transport that moves the bytes; closed by ``close``.
        stage, num_stages: this rank's stage (= its rank in ``group``) and the pipeline size.
        group: the pipeline process group (None = default group); ops on other groups pass through
            unrecorded.
        epoch: the pipeline's t=0 (:func:`~titan_morph.comm.clock.sync_clock`).
        record: keep records (``records()``/``take_records()``), the newest ``max_records`` of them.
    """

    name = "default"
    path = "torch"
    links = None
    depth = None  # the real network: nothing is modelled

    def __init__(
        self,
        inner: Transport,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        epoch: float,
        record: bool = True,
        max_records: int = 200_000,
        stamps: DeviceStamps | None = None,
    ) -> None:
        super().__init__(
            stage=stage, num_stages=num_stages, group=group, epoch=epoch, record=record, max_records=max_records
        )
        self.inner = inner
        if stamps is None and on_nccl(self.group):
            import torch

            stamps = DeviceStamps(torch.device("cuda", torch.cuda.current_device()))
        self.stamps = stamps
        self._marks: list[tuple[MessageRecord, ReadyStamp]] = []

    def set_step(self, step: int) -> None:
        """The training step about to run, here and in ``inner`` (its timeouts, its injected breaks)."""
        super().set_step(step)
        self.inner.set_step(step)

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        pass  # sends leave when torch issues them

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Issue ``ops`` through ``inner`` in one call (pipeline-group ops; others pass through)."""
        ops = list(ops)
        mine, handles = self._partition(ops, self.inner.batch_p2p, desc)
        if not mine:
            return handles
        messages = group_by_link(mine, self.stage, self.num_stages)
        recs: dict[tuple[int, str, bool], MessageRecord] = {}
        with self._lock:
            for (link, d, send), mops in messages.items():
                seq = self._next(self._send_seq if send else self._recv_seq, link, d)
                recs[(link, d, send)] = self._new_record("send" if send else "recv", link, d, seq, mops)
        if self.stamps is not None and any(send for (_, _, send) in recs):
            mark = self.stamps.mark()  # the sends are ordered after everything queued so far
            self._marks += [(rec, mark) for (_, _, send), rec in recs.items() if send]
        works = self.inner.batch_p2p(mine, desc)
        index = {id(op): i for i, op in enumerate(mine)} if len(works) == len(mine) else None
        for key, mops in messages.items():
            rec = recs[key]
            if key[2]:
                rec.accepted = rec.issued
            # one work per op (gloo, homogeneous batches), else (NCCL coalesced) the batch's works
            mw = works if index is None else [works[index[id(op)]] for op in mops]
            handles.append(_Handle(self, mops, rec, mw))
        return handles

    def rate_probe_path(self, link: int) -> P2P | None:
        """``inner``, unrecorded (a rate probe's messages are not the pipeline's); None on NCCL,
        whose waits do not return when the data is there."""
        return self.inner if self.stamps is None and not on_nccl(self.group) else None

    def take_records(self) -> list[MessageRecord]:
        """The records since the last call, sends stamped ``ready`` where the device has been seen past
        their payload (a mark not stamped yet leaves ``ready`` None: the delay then runs from ``accepted``)."""
        if self.stamps is not None:
            self.stamps.poll()
            left = []
            for rec, mark in self._marks:
                if mark.t_s is not None:
                    rec.ready = (mark.t_s - self.epoch) * 1e3
                elif rec.completed is None:
                    left.append((rec, mark))
            self._marks = left
        return super().take_records()

    def blocked_ms(self) -> dict[int, float]:
        return {}  # torch queues every send at once

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        """Close ``inner`` (and the stamping thread; nothing else of its own)."""
        if self.stamps is not None:
            self.stamps.close()
        self.inner.close(timeout, drain)

    def __enter__(self) -> RecordedTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- rate probes ------------------------------------------------------------------------------
# A probe train: a few messages sent back to back on one direction of a pipeline link, timed.
#
# The monitor cannot read a link's rate from messages that each find the wire idle (latency and
# transmit time add up the same way, :mod:`titan_morph.monitor.rate_probes`); messages sent together
# queue behind one another on a rate-limited wire and arrive one transmit time apart. A train of
# :data:`PROBE_MESSAGES` messages of the link's usual size crosses the link's default path (the very
# process group and socket its pipeline messages use, without their records) between two steps; the
# sender stamps when it handed them over, the receiver when each wait began and returned. The
# receiver posts every receive first and waits in order, so each wait after the first blocks until
# its message arrived whenever the wire spaced them.
#
# Only a path that moves bytes on the host can be timed this way (gloo: a wait returns when the
# message is there); a transport offers one per link through :class:`RateProbeable`.

PROBE_MESSAGES = 3
"""Messages per train and direction: two arrival gaps, so one late stamp spoils one of them."""


@dataclass(frozen=True)
class ProbeTimes:
    """One side of one train, in ms on the common clock: the sender's ``sent`` (one per message,
    when it was handed over) or the receiver's ``waited`` and ``returned`` per message."""

    link: int
    direction: str
    nbytes: int
    sent: tuple[float, ...] = ()
    waited: tuple[float, ...] = ()
    returned: tuple[float, ...] = ()


def probe_train(
    path: P2P,
    group: dist.ProcessGroup,
    *,
    link: int,
    direction: str,
    peer: int,
    send: bool,
    nbytes: int,
    timeout_s: float,
    now_ms: Callable[[], float],
    messages: int = PROBE_MESSAGES,
) -> ProbeTimes:
    """Send (``send``) or receive ``messages`` messages of ``nbytes`` to/from global rank ``peer``
    over ``path`` on ``group``; every wait ends within ``timeout_s`` of the start, else the error
    names this rank, the peer, the link and the direction."""
    if nbytes < 1 or messages < 2:
        raise ValueError(f"a probe train needs >= 2 messages of >= 1 byte, got {messages} of {nbytes}")
    buffers = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(1 if send else messages)]
    op = dist.isend if send else dist.irecv
    deadline = time.monotonic() + timeout_s
    handed = now_ms()
    handles = [
        h for k in range(messages) for h in path.batch_p2p([dist.P2POp(op, buffers[0 if send else k], peer, group)])
    ]
    waited, returned = [], []
    for k, handle in enumerate(handles):
        waited.append(now_ms())
        done = handle.wait(max(1e-3, deadline - time.monotonic()))
        if not done:
            what = "send to" if send else "receive from"
            raise RuntimeError(
                f"rank {dist.get_rank()}: probe of link {link} ({direction}): could not {what} rank {peer} "
                f"(message {k + 1} of {messages}) within {timeout_s:g} s ([comm] timeouts)"
            )
        returned.append(now_ms())
    if send:
        return ProbeTimes(link, direction, nbytes, sent=(handed,) * messages)
    return ProbeTimes(link, direction, nbytes, waited=tuple(waited), returned=tuple(returned))

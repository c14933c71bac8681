"""Room in /dev/shm for the delegated data plane, checked before any rank starts (paper §5.1).

Each delegate keeps one shared-memory ring per message size: ``slots`` copies of a microbatch's
activations (or gradients). A tmpfs that runs out does not fail the write, it kills the writer with
SIGBUS mid-step, and containers mount /dev/shm with 64 MiB unless told otherwise; the 8B example
needs about 0.5 GB per ring. So the launcher sizes the rings of the ranks on this host and refuses
to start when they do not fit, naming the size and how to raise it.
"""

from __future__ import annotations

from titan_morph.comm.delegate.shm import DEFAULT_SLOTS, segment_bytes
from titan_morph.comm.machine.system import SHM_DIR, shm_free_bytes
from titan_morph.config import ConfigError, Settings
from titan_morph.config.links import configured_message_bytes

__all__ = ["check_ring_space", "delegate_shm_bytes"]


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def delegate_shm_bytes(
    settings: Settings, message: int, slots: int = DEFAULT_SLOTS, ranks_here: int | None = None
) -> int:
    """/dev/shm bytes of the delegate rings on one host: per link, per direction and per delegate
    one ring on each end (the sender's trainer and the receiver's delegate), per pipeline replica;
    0 when no delegate can run (``default`` transport, one stage). ``ranks_here``: the ranks this
    host runs (one node of several); each rank holds its share of the ends, rounded up."""
    if settings.morph.transport not in ("delegate", "auto") or settings.num_links == 0:
        return 0
    ends = settings.num_links * 2 * 2 * settings.morph.delegates_per_link * settings.dp_degree
    if ranks_here is not None and ranks_here < settings.world_size:
        ends = -(-ends * ranks_here // settings.world_size)
    return ends * segment_bytes(message, slots)


def check_ring_space(
    settings: Settings, message: int | None, free: int | None = None, ranks_here: int | None = None
) -> None:
    """:class:`ConfigError` when the delegates' rings of this host, for pipeline messages of
    ``message`` bytes (None: unknown, nothing checked), would not fit in /dev/shm's free space
    (``free``: that space, read from the system when None; ``ranks_here``: this node's ranks when the
    job spans several nodes). Each release's launcher finds the message size in its own config;
    the synthetic testbed's ``message_kb`` fixes it whatever the model."""
    message = configured_message_bytes(settings) or message
    if message is None:
        return
    needed = delegate_shm_bytes(settings, message, ranks_here=ranks_here)
    free = shm_free_bytes() if free is None else free
    if needed == 0 or free is None or needed <= free:
        return
    morph = settings.morph
    raise ConfigError(
        f"[morph] transport = {morph.transport!r}: the delegates' shared-memory rings need {_size(needed)} in "
        f"{SHM_DIR} ({settings.num_links} link(s) x 2 directions x 2 ends x {morph.delegates_per_link} delegate(s) "
        f"x {settings.dp_degree} replica(s), {DEFAULT_SLOTS} slots of {_size(message)} each) but only {_size(free)} "
        f"is free: raise it (docker run --shm-size={-(-needed // 2**30) + 1}g, or "
        f"mount -o remount,size={-(-needed // 2**30) + 1}G {SHM_DIR}) or use [morph] transport = 'default'"
    )

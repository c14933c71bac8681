"""One side of a rate probe between two lab nodes (run inside a node's namespace by
``test_rate_probe``): a gloo pair on the data NIC, a train each way, the times as JSON on stdout."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from datetime import timedelta


def main() -> None:
    rank, store_addr, port, nbytes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    import torch.distributed as dist

    from titan_morph.comm.recorded import probe_train
    from titan_morph.comm.transport import TorchTransport

    dist.init_process_group(
        "gloo", init_method=f"tcp://{store_addr}:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    try:
        group = dist.group.WORLD
        assert group is not None
        path, out = TorchTransport(0.0), []
        for direction, sender in (("fwd", 0), ("bwd", 1)):
            times = probe_train(
                path,
                group,
                link=0,
                direction=direction,
                peer=1 - rank,
                send=rank == sender,
                nbytes=nbytes,
                timeout_s=30.0,
                now_ms=lambda: time.monotonic() * 1e3,  # one host: one clock for both namespaces
            )
            out.append(dataclasses.asdict(times))
        print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

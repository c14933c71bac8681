"""``python -m titan_morph.netlab COMMAND``: a small cluster of network namespaces on this machine.

  up --nodes K [--host-nics 2]          K nodes (2..8), each with NICs data and host (and host2)
  down                                  remove the lab (namespaces, links, bridges, processes)
  status                                nodes, addresses, limits and broken paths
  shape --from A --to B --nic NIC --rate-mbit R [--burst-kb B]   limit A -> B (0 removes it)
  unshape --from A --to B --nic NIC
  break --nodes A,B --nic NIC           break the path A <-> B on NIC
  heal [--nodes A,B] [--nic NIC]        heal it (every broken path without options)
  schedule FILE                         apply a schedule (CSV time_s,from,to,nic,rate_mbit) now
  measure --from A --to B --nic NIC [--mbytes M]   time a TCP transfer A -> B
  run --nodes K --ranks-per-node R [--shape A-B:NIC:RATE]... [--schedule FILE] [--store-nic NIC]
      [--host-nics 2] [--timeout-s S] -- TRAIN ARGS   ./run_train.sh across the nodes (CONFIG_FILE
      as there; the pipeline's default path on data, delegates, exchange and store on host)
  compare --nodes K --ranks-per-node R [--shape A-B:NIC:RATE]... [--schedule FILE]
      [--variants 1F1B,ZBH2,PipeMorph] [--steps N] [--logdir D] [--name N] -- TRAIN ARGS
      every variant in turn on one lab under the same limits; compare's tables (netlab.compare)

Every command takes --prefix P (default tmlab), the name every lab object starts with. Errors are
one line ``error: ...`` and exit code 2; ``run`` exits with the job's code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from titan_morph.netlab.lab import (
    DEFAULT_PREFIX,
    MAX_HOST_NICS,
    MAX_NODES,
    NICS,
    Lab,
    LabError,
    can_make_namespaces,
    down,
)
from titan_morph.netlab.schedule import Controller, node_index, read_schedule
from titan_morph.netlab.shape import break_path, breaks, heal, shape, shapes, unshape

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m titan_morph.netlab", description="Network namespaces as nodes.")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text)
        c.add_argument("--prefix", default=DEFAULT_PREFIX, help="name prefix of every lab object")
        return c

    def path_options(c: argparse.ArgumentParser) -> None:
        c.add_argument("--from", dest="src", required=True, help="sending node (0 or n0)")
        c.add_argument("--to", dest="dst", required=True, help="receiving node")
        c.add_argument("--nic", choices=NICS, required=True)

    c = command("up", "make the lab")
    c.add_argument("--nodes", type=int, required=True)
    host_nics = "host NICs per node: 1 (host) or 2 (host, host2)"
    c.add_argument("--host-nics", type=int, default=1, help=host_nics)
    command("down", "remove the lab")
    command("status", "show the lab")
    c = command("shape", "limit traffic from one node to another")
    path_options(c)
    c.add_argument("--rate-mbit", type=float, required=True, help="Mbit/s; 0 removes the limit")
    c.add_argument("--burst-kb", type=float, default=0.0, help="bucket size (default: tc's)")
    path_options(command("unshape", "remove a limit"))
    c = command("break", "break the path between two nodes")
    c.add_argument("--nodes", required=True, help="A,B")
    c.add_argument("--nic", choices=NICS, required=True)
    c = command("heal", "heal broken paths")
    c.add_argument("--nodes", help="A,B (default: every broken path)")
    c.add_argument("--nic", choices=NICS)
    command("schedule", "apply a schedule now").add_argument("file")
    c = command("measure", "time a TCP transfer")
    path_options(c)
    c.add_argument("--mbytes", type=float, default=4.0)
    c.add_argument("--timeout-s", type=float, default=30.0)
    c = command("run", "train across the nodes")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--ranks-per-node", type=int, required=True)
    c.add_argument("--shape", action="append", default=[], help="A-B:NIC:RATE, limit from the start")
    c.add_argument(
        "--schedule", help="CSV time_s,from,to,nic,rate_mbit (time_s: seconds from the job's start, or step=N)"
    )
    c.add_argument("--timeout-s", type=float, default=6 * 3600.0, help="stop the job after this long")
    c.add_argument("--store-nic", choices=NICS, default="host", help="NIC of the rendezvous and c10d store")
    c.add_argument("--host-nics", type=int, default=1, help=host_nics)
    c.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then ./run_train.sh arguments")
    c = command("compare", "run compare's variants in turn on one shaped lab")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--ranks-per-node", type=int, required=True)
    c.add_argument("--shape", action="append", default=[], help="A-B:NIC:RATE, limit from each job's start")
    c.add_argument("--schedule", help="CSV time_s,from,to,nic,rate_mbit (restarted with each job)")
    c.add_argument("--variants", default="1F1B,ZBH2,PipeMorph", help="compare's variants, comma-separated")
    c.add_argument("--steps", type=int, default=12)
    c.add_argument("--skip-warmup", type=int, help="steps left out of the medians")
    c.add_argument("--logdir", default="outputs/netlab_compare", help="log folder (one sub-folder per comparison)")
    c.add_argument("--name", default="lab", help="this comparison's sub-folder and title")
    c.add_argument("--base-latency-ms", type=float, default=0.0, help="per-message latency of the simulated links")
    c.add_argument("--timeout-s", type=float, help="seconds per job")
    c.add_argument("--host-nics", type=int, default=1, help=host_nics)
    c.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then overrides for every job")
    return p


def _pair(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2:
        raise LabError(f"--nodes {text!r}: two nodes, A,B")
    return node_index(parts[0]), node_index(parts[1])


def _status(lab: Lab) -> None:
    print(f"lab {lab.prefix}: {lab.nodes} nodes (switch namespace {lab.switch})")
    for i in range(lab.nodes):
        addrs = "  ".join(f"{nic} {lab.address(i, nic)}/24" for nic in lab.nics)
        print(f"  node {i}  {lab.node(i)}  {addrs}")
    limits = shapes(lab)
    print("limits:" + ("" if limits else " none"))
    for s in limits:
        print(f"  {s.src} -> {s.dst} on {s.nic}: {s.rate}")
    broken = {(min(b.a, b.b), max(b.a, b.b), b.nic): b for b in breaks(lab)}
    print("broken paths:" + ("" if broken else " none"))
    for a, b, nic in sorted(broken):
        print(f"  {a} <-> {b} on {nic}")


def _compare(args: argparse.Namespace) -> int:
    from titan_morph.compare.configs import ComparisonError
    from titan_morph.compare.variants import UnknownVariantError, parse_variants
    from titan_morph.netlab.compare import CompareOptions, compare, shell_command
    from titan_morph.netlab.run import parse_shape_spec

    try:
        opts = CompareOptions(
            nodes=args.nodes,
            ranks_per_node=args.ranks_per_node,
            variants=parse_variants(args.variants),
            shapes=[parse_shape_spec(s) for s in args.shape],
            schedule=read_schedule(args.schedule) if args.schedule else [],
            steps=args.steps,
            skip=args.skip_warmup,
            train_args=args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args,
            logdir=Path(args.logdir),
            name=args.name,
            base_latency_ms=args.base_latency_ms,
            prefix=args.prefix,
            timeout_s=args.timeout_s,
            host_nics=args.host_nics,
            command=shell_command(sys.argv[1:]),
        )
        markdown, _ = compare(opts)
    except (ComparisonError, UnknownVariantError) as err:
        raise LabError(str(err)) from None
    print(markdown)
    return 0


def _main(args: argparse.Namespace) -> int:
    if args.command in ("up", "run"):
        why = can_make_namespaces()
        if why:
            raise LabError(why)
    if args.command == "up":
        if not 2 <= args.nodes <= MAX_NODES:
            raise LabError(f"--nodes {args.nodes}: 2..{MAX_NODES}")
        if not 1 <= args.host_nics <= MAX_HOST_NICS:
            raise LabError(f"--host-nics {args.host_nics}: 1..{MAX_HOST_NICS}")
        lab = Lab(args.nodes, args.prefix, args.host_nics)
        lab.up()
        _status(lab)
        return 0
    if args.command == "down":
        removed = down(args.prefix)
        print(f"removed {', '.join(removed)}" if removed else f"no lab {args.prefix!r} was up")
        return 0
    if args.command == "run":
        from titan_morph.netlab.run import RunOptions, parse_shape_spec, run

        train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        opts = RunOptions(
            nodes=args.nodes,
            ranks_per_node=args.ranks_per_node,
            train_args=train_args,
            shapes=[parse_shape_spec(s) for s in args.shape],
            schedule=read_schedule(args.schedule) if args.schedule else [],
            prefix=args.prefix,
            timeout_s=args.timeout_s,
            store_nic=args.store_nic,
            host_nics=args.host_nics,
        )
        return run(opts)
    if args.command == "compare":
        return _compare(args)
    lab = Lab.existing(args.prefix)
    if args.command == "status":
        _status(lab)
    elif args.command == "shape":
        shape(lab, node_index(args.src), node_index(args.dst), args.nic, args.rate_mbit, args.burst_kb)
    elif args.command == "unshape":
        unshape(lab, node_index(args.src), node_index(args.dst), args.nic)
    elif args.command == "break":
        break_path(lab, *_pair(args.nodes), args.nic)
    elif args.command == "heal":
        a, b = _pair(args.nodes) if args.nodes else (None, None)
        heal(lab, a, b, args.nic)
    elif args.command == "schedule":
        controller = Controller(lab, read_schedule(args.file), log=sys.stdout).start()
        try:
            while not controller.wait(0.5):
                pass
        finally:
            controller.stop()
    elif args.command == "measure":
        from titan_morph.netlab.transfer import measure

        nbytes = int(args.mbytes * 2**20)
        seconds = measure(lab, node_index(args.src), node_index(args.dst), args.nic, nbytes, args.timeout_s)
        rate = nbytes * 8 / seconds / 1e6
        print(f"{nbytes} bytes {args.src} -> {args.dst} on {args.nic}: {seconds:.3f} s, {rate:.1f} Mbit/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:  # before a job started; whatever was made is removed on the way out
        return 130


if __name__ == "__main__":
    sys.exit(main())

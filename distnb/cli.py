"""The `distnb` command: `distnb demo` and `distnb doctor`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from distnb.errors import DistnbError
from distnb.ranklist import format_ranks
from distnb.records.doctor import DoctorReport


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distnb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start 2 CPU ranks and show what distnb reports")
    demo.add_argument("--out", default="distnb-demo", help="folder for the timeline files")
    doctor = sub.add_parser("doctor", help="check devices, the process group and bandwidth")
    doctor.add_argument("-n", type=int, default=None, help="ranks (default: one per GPU, else 2)")
    doctor.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    doctor.add_argument("--engines", default="local", help="ipyparallel launcher")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from distnb.demo import run_demo

            return run_demo(args.out)
        return run_doctor(args.n, args.backend, args.engines)
    except DistnbError as exc:
        print(f"distnb {args.command}: {exc}", file=sys.stderr)
        return 1


SIZES = (32, 1 << 20, 16 << 20)


def run_doctor(n: int | None, backend: str, engines: str) -> int:
    import distnb
    from distnb.rank import doctor

    print(f"distnb doctor: starting {n or 'default'} ranks ({backend}, {engines} engines)")
    with distnb.start(n, backend=backend, engines=engines, progress=False) as s:
        reports = s.call(doctor.check, SIZES)
    for r in reports:
        versions = ", ".join(f"{k} {v}" for k, v in r.versions)
        print(
            f"rank {r.rank}: host {r.host} pid {r.pid} device {r.device} "
            f"backend {r.backend} ({versions})"
        )
    _print_torch(reports)
    print("all_reduce bus bandwidth (rank 0, nccl-tests formula):")
    for bw in reports[0].bandwidth:
        print(f"  {bw.nbytes:>10} B  {bw.seconds * 1e3:8.3f} ms  {bw.busbw_gbps:8.3f} GB/s")
    bad = [r for r in reports if not r.ok]
    for r in bad:
        for problem in r.problems:
            print(f"FAIL rank {r.rank}: {problem}")
    print("OK" if not bad else f"FAILED on {len(bad)} rank(s)")
    return 0 if not bad else 1


def _print_torch(reports: Sequence[DoctorReport]) -> None:
    """Each torch the ranks run (usually one): whether it is tested, and what it leaves
    unchecked."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    for r in reports:
        version = dict(r.versions).get("torch", "?")
        groups.setdefault((version, r.torch_range, r.torch_gaps), []).append(r.rank)
    for (version, verdict, gaps), ranks in groups.items():
        who = f"{format_ranks(ranks)}: " if len(groups) > 1 else ""
        print(f"{who}torch {version}: {verdict}")
        for gap in gaps or ("every collective path distnb knows is checked",):
            print(f"  {gap}")


if __name__ == "__main__":
    sys.exit(main())

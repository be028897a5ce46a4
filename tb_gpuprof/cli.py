"""`tb-gpuprof` command line: report, compare, import, dmon, demo.

Every user error (bad path, bad trace, no GPU) ends as one line on stderr and exit status 2;
only bugs produce tracebacks. Subcommands import their machinery lazily so `--help` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__
from .errors import GpuProfError, RunNotFoundError

EXIT_USER_ERROR = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tb-gpuprof",
        description="Why is my training slow on NVIDIA GPUs, and what should I change?",
    )
    parser.add_argument("--version", action="version", version=f"tb-gpuprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    rep = sub.add_parser(
        "report",
        help="analyze a trace file (Kineto JSON, XPlane, Nsight SQLite) or a tb_gpuprof run",
        description="Print the DLProf-style report of a trace file or of a run's stored report.",
    )
    rep.add_argument("path", metavar="PATH", help="trace file, run directory or log directory")
    rep.add_argument("--top", type=_positive_int, default=10, help="kernels to list (default 10)")
    rep.add_argument("--format", choices=("text", "json", "csv"), default="text")
    rep.add_argument("--iter-start", type=_non_negative_int, default=None,
                     help="first iteration (index in the trace, or step number) to analyze")
    rep.add_argument("--iter-stop", type=_non_negative_int, default=None,
                     help="iteration to stop before (exclusive)")
    rep.add_argument("--key", default=None,
                     help="name of the annotation/NVTX range that marks one iteration "
                          "(DLProf's --key_node)")
    rep.add_argument("--run", default=None, help="with a log directory: which run to report")
    rep.add_argument("--reanalyze", action="store_true",
                     help="with a run: rebuild its report from the stored raw trace and the "
                          "context the hook stored beside it, with the installed analysis "
                          "(a report made by an older analysis is rebuilt anyway)")
    rep.add_argument("--dask", metavar="ADDRESS", default=None,
                     help="with a directory of rank traces: analyse them on this Dask "
                          "scheduler (tcp://host:8786) instead of local processes")
    rep.add_argument("--jobs", type=_positive_int, default=None,
                     help="with a directory of rank traces: at most this many at once "
                          "(default: the cores, as memory allows)")

    cmp = sub.add_parser(
        "compare", help="compare run B with baseline A; exit 1 when B is too much slower",
        description="Compare two runs, run directories or trace files (A: the baseline). "
                    "Exit 1 with a one-line reason when B's iteration time exceeds A's by more "
                    "than --max-slowdown percent; exit 2 on bad input.")
    cmp.add_argument("a", metavar="A", help="baseline: trace file, run directory or log directory")
    cmp.add_argument("b", metavar="B", help="candidate: trace file, run directory or log directory")
    cmp.add_argument("--max-slowdown", type=_non_negative_float, default=None, metavar="PCT",
                     help="fail (exit 1) when B is slower than A by more than PCT percent")
    cmp.add_argument("--format", choices=("text", "json"), default="text")
    cmp.add_argument("--top", type=_positive_int, default=5,
                     help="kernels that changed most to list (default 5)")

    imp = sub.add_parser("import", help="turn a trace file into a run TensorBoard shows")
    imp.add_argument("trace", metavar="TRACE")
    imp.add_argument("--logdir", required=True, help="TensorBoard log directory")
    imp.add_argument("--run", default=None, help="run name (default: the trace's file name)")
    imp.add_argument("--key", default=None, help="iteration key range name")

    dmon = sub.add_parser("dmon", help="live GPU metrics like `nvidia-smi dmon`, plus GPM")
    dmon.add_argument("--interval", type=_positive_float, default=1.0, help="seconds (default 1)")
    dmon.add_argument("--count", type=_positive_int, default=None, help="samples, then exit")
    dmon.add_argument("--logdir", default=None, help="also record to this run directory")

    demo = sub.add_parser("demo", help="write sample runs plus a live run and start TensorBoard")
    demo.add_argument("--logdir", default="runs/tb_gpuprof_demo")
    demo.add_argument("--port", type=int, default=6006)
    demo.add_argument("--no-tensorboard", action="store_true",
                      help="write the runs and exit without starting TensorBoard")
    demo.add_argument("--no-live", action="store_true", help="skip the live training run")
    sub.add_parser("schema", help="print the report's JSON Schema (docs/report-schema.md)")
    return parser


def _cmd_schema(args: argparse.Namespace) -> int:
    import json

    from .analysis.schema import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .analysis.format import render

    if os.path.isdir(args.path):
        from .parallel import find_rank_traces
        from .store.reader import find_runs

        traces = find_rank_traces(args.path) if not find_runs(args.path) else []
        if traces:  # a directory of rank traces, not a TensorBoard log directory
            return _report_ranks(traces, args)
        report = _stored_run_report(args)
        if report is None:  # an out-of-memory error before any window: its report alone
            return 0
    else:
        if args.reanalyze:
            raise GpuProfError("--reanalyze takes a run or log directory; a trace file is "
                               "always analysed afresh")
        import msgspec

        from .pipeline import analyse_trace, trace_context

        # a window's trace inside a run: with the context the hook stored beside it, and
        # the options given here over it
        given = {name: getattr(args, name) for name in ("key", "iter_start", "iter_stop")
                 if getattr(args, name) is not None}
        report = analyse_trace(args.path,
                               msgspec.structs.replace(trace_context(args.path), **given))
    sys.stdout.write(render(report, fmt=args.format, top=args.top))
    return 0


def _stored_run_report(args: argparse.Namespace) -> dict | None:
    """The run's current report, after a line per out-of-memory report of the run (text);
    None where the run holds only out-of-memory reports (printed)."""
    from .pipeline import run_report

    failures = _out_of_memory_lines(args.path, args.run)
    lines = "".join(f"{line} Report: {where}\n" for line, where in failures)
    try:
        report = run_report(args.path, run=args.run, reanalyze=args.reanalyze)
    except RunNotFoundError as e:
        if not failures:
            raise
        if args.format != "text":
            raise RunNotFoundError(f"{e}; out-of-memory report: {failures[0][1]}") from None
        sys.stdout.write(lines)
        return None
    if lines and args.format == "text":
        sys.stdout.write(lines + "\n")
    return report


def _out_of_memory_lines(path: str, run: str | None) -> list[tuple[str, str]]:
    """(summary, path) of each out-of-memory report in the run(s)."""
    import json

    from .analysis.oom import summary
    from .store.reader import oom_reports

    lines = []
    for found in oom_reports(path, run):
        try:
            with open(found, encoding="utf-8") as f:
                lines.append((summary(json.load(f)), found))
        except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
            lines.append((f"tb_gpuprof: an unreadable out-of-memory report "
                          f"({type(e).__name__}).", found))
    return lines


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def _load_any_report(path: str) -> dict:
    """A stored run's current report (run or log directory) or a trace file's, as `report`
    gives it."""
    if os.path.isdir(path):
        from .pipeline import run_report

        return run_report(path)
    from .pipeline import analyse_trace, trace_context

    return analyse_trace(path, trace_context(path))


def _cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare_reports, render_comparison, slowdown_reason

    cmp = compare_reports(_load_any_report(args.a), _load_any_report(args.b), top=args.top)
    sys.stdout.write(render_comparison(cmp, fmt=args.format))
    sys.stdout.flush()
    reason = slowdown_reason(cmp, args.max_slowdown) if args.max_slowdown is not None else None
    if reason:
        print(f"tb-gpuprof compare: {reason}", file=sys.stderr)
        return 1
    return 0


def _report_ranks(traces: list[str], args: argparse.Namespace) -> int:
    from .parallel import analyze_ranks, render_ranks

    result = analyze_ranks(traces, dask_address=args.dask, workers=args.jobs,
                           iter_start=args.iter_start, iter_stop=args.iter_stop, key=args.key)
    sys.stdout.write(render_ranks(result, fmt=args.format))
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from .pipeline import import_trace

    run_dir = import_trace(args.trace, args.logdir, run=args.run, key=args.key)
    print(f"imported {args.trace} -> {run_dir}")
    print(f"view it: tensorboard --logdir {args.logdir}")
    return 0


def _cmd_dmon(args: argparse.Namespace) -> int:
    from .nvml.dmon import run_dmon

    return run_dmon(interval=args.interval, count=args.count, logdir=args.logdir)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(logdir=args.logdir, port=args.port, start_tensorboard=not args.no_tensorboard,
                    live=not args.no_live)


COMMANDS = {"report": _cmd_report, "compare": _cmd_compare, "import": _cmd_import,
            "dmon": _cmd_dmon, "demo": _cmd_demo, "schema": _cmd_schema}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return COMMANDS[args.command](args)
    except GpuProfError as e:
        print(f"tb-gpuprof {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tb-gpuprof report x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())

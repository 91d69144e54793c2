"""The argument parser of `xtune`: every subcommand, its flags and their defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from xtune.boards.agent import MAX_REPEAT
from xtune.cli.common import U32, Command, _defaults, _float_in, _int_in, _Parser
from xtune.ops.layout import DEFAULT, Layout
from xtune.transfer.options import TrainOptions
from xtune.tuning.allocation import SchedulerOptions, Strategy
from xtune.tuning.options import CONFIRM_TIMINGS, TUNERS, MeasureOptions, TuneOptions
from xtune.version import __version__


def _add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layout",
        choices=[lay.value for lay in Layout],
        default=None,
        help=f"with a model: the layout the network runs in (default {DEFAULT.value}); its "
        "input and output stay in ONNX's NCHW",
    )


def _add_nonfinite(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--refuse-nonfinite",
        action="store_true",
        help="with --model: refuse a model whose constants hold NaN or infinity (default: build it, with a "
        "warning naming them)",
    )


def _add_model_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    train = _defaults(TrainOptions)
    p = sub.add_parser("model", help="pretrained cost models for transfer learning (train, info)")
    model_sub = p.add_subparsers(dest="model_command", required=True, parser_class=_Parser)
    t = model_sub.add_parser("train", help="train a cost model on tuning logs of any workloads and targets")
    t.add_argument("log", nargs="+", help="tuning log(s), JSON lines")
    t.add_argument("-o", "--output", required=True, help="model file to write (JSON), e.g. model.json")
    t.add_argument(
        "--objective",
        choices=("reg", "rank"),
        default=train["objective"],
        help="reg: squared error on normalized throughput; rank: pairwise ranking (default %(default)s)",
    )
    t.add_argument("--seed", type=_int_in(0, 2**31 - 1), default=train["seed"])
    t.add_argument(
        "--threads",
        type=_int_in(0, 1024),
        default=train["nthread"],
        metavar="N",
        help="xgboost threads (default %(default)s; 0 = every core, best on an otherwise idle machine)",
    )
    t.add_argument("--json", action="store_true", help="one JSON object on stdout")
    t.set_defaults(
        handler=Command(
            module="xtune.cli.kernels", function="cmd_model_train", loads=("xtune.transfer.pretrained",)
        )
    )
    i = model_sub.add_parser("info", help="print a model file's manifest")
    i.add_argument("model")
    i.add_argument("--json", action="store_true", help="one JSON object on stdout")
    i.set_defaults(
        handler=Command(
            module="xtune.cli.kernels", function="cmd_model_info", loads=("xtune.transfer.modelfile",)
        )
    )


def build_parser() -> argparse.ArgumentParser:
    tune, measure, scheduler = _defaults(TuneOptions), _defaults(MeasureOptions), _defaults(SchedulerOptions)
    parser = _Parser(prog="xtune", description="Auto-tune tensor kernels for embedded targets.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("targets", help="list target descriptors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=Command(module="xtune.cli.boards", function="cmd_targets"))

    p = sub.add_parser("boards", help="list boards (SSH ones with their reachability)")
    p.add_argument(
        "--boards",
        type=Path,
        default=None,
        help="boards.toml (default: ./boards.toml, then ~/.config/xtune/boards.toml)",
    )
    p.add_argument(
        "--timeout", type=_float_in(0.001, 3600), default=3.0, help="seconds per SSH reachability check"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(
        handler=Command(
            module="xtune.cli.boards", function="cmd_boards", loads=("xtune.boards.board", "xtune.boards.ssh")
        )
    )

    p = sub.add_parser("deploy", help="build and upload the agent to an SSH board, record its fingerprint")
    p.add_argument("--board", required=True)
    p.add_argument(
        "--boards",
        type=Path,
        default=None,
        help="boards.toml (default: ./boards.toml, then ~/.config/xtune/boards.toml)",
    )
    p.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust the host key offered if known_hosts has none, and record it",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(
        handler=Command(
            module="xtune.cli.boards", function="cmd_deploy", loads=("xtune.boards.board", "xtune.boards.ssh")
        )
    )

    p = sub.add_parser(
        "tune",
        help="tune a workload, or every task of an ONNX model under one budget, on a "
        "board; every measurement goes to the log",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload")
    what.add_argument(
        "--model",
        metavar="MODEL.onnx",
        help="tune every task of the model (see `xtune "
        "tasks`) under the one budget of --trials, with a task scheduler",
    )
    p.add_argument(
        "--strategy",
        choices=[s.value for s in Strategy],
        default=scheduler["strategy"].value,
        help="--model: which task gets the next batch: the largest expected gain of the model's "
        "latency (gradient), or each in turn (default %(default)s)",
    )
    p.add_argument("--board", action="append", help="board name; repeat for parallel boards of one target")
    p.add_argument(
        "--boards", type=Path, metavar="FILE", help="boards.toml (default: ./boards.toml, ~/.config/xtune/)"
    )
    p.add_argument(
        "--target",
        default=None,
        help="code to tune on the local board (default: the host's target), e.g. x86-sse42 on an AVX2 host",
    )
    p.add_argument(
        "--trials",
        type=_int_in(1, 10**9),
        default=tune["trials"],
        metavar="N",
        help="new trials to measure in this run (default %(default)s): configs already in the "
        "log for this workload, target and cpu are resumed, not measured again, and do not "
        "count",
    )
    p.add_argument("--tuner", choices=TUNERS, default=tune["tuner"])
    p.add_argument("--log", default="xtune-log.jsonl", help="tuning log (JSON lines), appended and resumed")
    p.add_argument(
        "--early-stopping",
        type=_int_in(1, 10**9),
        default=tune["early_stopping"],
        metavar="N",
        help="stop after N trials without gain (with --model: each task)",
    )
    p.add_argument("--seed", type=_int_in(0, U32), default=tune["seed"])
    p.add_argument("--batch-size", type=_int_in(1, 4096), default=tune["batch_size"])
    p.add_argument(
        "--repeat", type=_int_in(1, MAX_REPEAT), default=measure["repeat"], help="timed repeats per candidate"
    )
    p.add_argument("--min-repeat-ms", type=_float_in(0, U32 / 1000), default=measure["min_repeat_ms"])
    p.add_argument(
        "--cold-weights",
        action="store_true",
        help="time each call with the weights evicted from every cache level (one call per repeat), as a "
        "layer of a network whose weights outgrow the caches finds them",
    )
    p.add_argument(
        "--timeout-ms",
        type=_int_in(1, U32),
        default=measure["timeout_ms"],
        help="deadline per kernel call/repeat",
    )
    p.add_argument(
        "--confirm",
        type=_int_in(0, 1024),
        default=tune["confirm"],
        metavar="K",
        help=f"at the end, time the K fastest configs again until each has {CONFIRM_TIMINGS} "
        "timings; the best is the lowest median, not the luckiest single timing "
        "(default %(default)s; 0 = off)",
    )
    p.add_argument(
        "--transfer-from",
        action="extend",
        nargs="+",
        metavar="SOURCE",
        help="pretrained cost model: a model file, tuning log(s) to train on, or 'builtin'",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    _add_layout(p)
    p.set_defaults(
        handler=Command(
            module="xtune.cli.tune",
            function="cmd_tune",
            loads=("xtune.tuning.run", "xtune.tuning.task_scheduler"),
        )
    )

    p = sub.add_parser("best", help="the best correct config per workload and target in tuning logs")
    p.add_argument("--log", required=True, action="append")
    p.add_argument("--workload")
    p.add_argument("--target")
    p.add_argument("--json", action="store_true")
    p.set_defaults(
        handler=Command(module="xtune.cli.kernels", function="cmd_best", loads=("xtune.tuning.report",))
    )

    p = sub.add_parser("report", help="summary table of a tuning log, and a convergence plot")
    p.add_argument("log", nargs="+")
    p.add_argument("--plot", metavar="PNG", help="write the convergence plot (needs xtune[plot])")
    p.add_argument("--json", action="store_true")
    p.set_defaults(
        handler=Command(module="xtune.cli.kernels", function="cmd_report", loads=("xtune.tuning.report",))
    )

    p = sub.add_parser(
        "bench",
        help="default (or given) config vs numpy and ONNX Runtime, in one run; "
        "or a whole network (--model) against ONNX Runtime",
    )
    p.add_argument("--workload", default=None, help='e.g. "matmul:m=512,n=512,k=512"')
    p.add_argument("--model", default=None, help="ONNX or TFLite model: build, run, check the whole network")
    p.add_argument("--log", action="append", help="with --model: tuning log(s) to take the best configs from")
    p.add_argument("--board", default="local")
    p.add_argument("--boards", type=Path, metavar="FILE", help="boards.toml for SSH boards")
    p.add_argument(
        "--config",
        type=_int_in(0, 2**63 - 1),
        default=None,
        help="config index (default: the template's default)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="code to run on the local board (default: the host's target), e.g. x86-sse42 on an AVX2 host",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument(
        "--profile",
        action="store_true",
        help="with --model: also each step's time in the network beside its tuned latency "
        "alone (wall-time boards on x86-64 and AArch64)",
    )
    _add_nonfinite(p)
    _add_layout(p)
    p.set_defaults(
        handler=Command(
            module="xtune.cli.kernels", function="cmd_bench", loads=("xtune.tuning.kernel_bench",)
        )
    )

    p = sub.add_parser("build", help="one object + C header of the best (or default) kernels for firmware")
    p.add_argument("--target", default=None, help="target name, see `xtune targets` (default: the host's)")
    p.add_argument("--workload", action="append", help="repeat for each kernel")
    p.add_argument("--model", default=None, help="ONNX or TFLite model: one object running the whole network")
    p.add_argument("--log", action="append", help="tuning log(s) to take the best configs from")
    p.add_argument("-o", "--output", required=True, help="relocatable object to write, e.g. kernels.o")
    p.add_argument("--header", required=True, help="C header to write, e.g. kernels.h")
    p.add_argument("--archive", default=None, help="also write a static library, e.g. libkernels.a")
    p.add_argument("--prefix", default=None, help="entry point prefix (default: xt; net with --model)")
    p.add_argument(
        "--reference",
        default=None,
        help="with --model: also write a reference file (a random "
        "input and ONNX Runtime's output) for a firmware's self-test",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument(
        "--profile",
        action="store_true",
        help="with --model: add NAME_profile, which also "
        "writes a counter reading after every step (x86-64 and AArch64)",
    )
    _add_nonfinite(p)
    _add_layout(p)
    p.set_defaults(
        handler=Command(module="xtune.cli.kernels", function="cmd_build", loads=("xtune.firmware.kernels",))
    )

    p = sub.add_parser("tasks", help="the unique tuning tasks of an ONNX model (fused epilogues included)")
    p.add_argument("model", help="ONNX or TFLite model file, e.g. resnet18.onnx")
    p.add_argument("--target", default=None, help="target name (default: the host's target)")
    p.add_argument("--log", action="append", help="tuning log(s): show which tasks already have a best")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    _add_layout(p)
    p.set_defaults(
        handler=Command(
            module="xtune.cli.networks",
            function="cmd_tasks",
            loads=("xtune.frontend.tasks", "xtune.frontend.load"),
        )
    )

    _add_model_parser(sub)
    return parser

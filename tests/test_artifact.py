"""Firmware artifacts linked by real toolchains: host gcc, and Debian's cross gcc run under qemu-user."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from xtune.cli import main
from xtune.errors import InputError
from xtune.firmware.kernels import Artifact, build
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import random_inputs
from xtune.target import Target, get_target
from xtune.tuning.database import TuningLog, make_record
from xtune.tuning.measure import MeasureResult, MeasureStatus

ROOT = Path(__file__).resolve().parent.parent
# Small shapes with tails on every axis; k=2100 exceeds the default kc on every target, so C is accumulated
# over k blocks.
WORKLOADS = (
    "matmul:m=8,n=16,k=4",
    "matmul:m=13,n=19,k=7",
    "matmul:m=5,n=33,k=2100",
    "matmul:m=1,n=7,k=3",
    "matmul:m=6,n=10,k=5,bias=1,relu=1",
)
# prepacked=1: the checker lays the weights out with each kernel's pack function first, as a firmware does.
PREPACKED = (
    "conv2d:n=1,c=13,h=9,w=9,k=21,r=3,s=3,stride=1,pad=1,bias=1,relu=1,prepacked=1",
    "conv2d:n=1,c=11,h=10,w=8,k=19,r=3,s=3,pad=1,algo=winograd,prepacked=1",
    "conv2d:n=2,c=13,h=5,w=7,k=21,r=1,s=1,stride=1,pad=0,prepacked=1",
    "matmul:m=5,n=33,k=2100,prepacked=1",
)
Capture = pytest.CaptureFixture[str]
CROSS = {"aarch64": "aarch64-linux-gnu-gcc", "riscv64": "riscv64-linux-gnu-gcc"}


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def _run(cmd: Sequence[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    shown = " ".join(map(str, cmd))
    assert done.returncode == 0, f"{shown} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _c_floats(a: np.ndarray) -> str:
    # %.9e round-trips every float32 exactly.
    return ", ".join(f"{float(x):.9e}f" for x in a.ravel())


def checker_source(workloads: Sequence[str], prefix: str = "xt") -> str:
    """A C program calling every kernel on numpy's inputs and comparing with numpy's outputs."""
    parts = ["#include <stdio.h>", "#include <string.h>", '#include "kernels.h"', ""]
    calls = []
    for n, text in enumerate(workloads):
        wl = parse_workload(text)
        inputs = random_inputs(wl, seed=n)
        expected = wl.reference(inputs).astype(np.float32)
        args, symbol = [], f"{prefix}_{wl.symbol}"
        for slot, (tensor, data) in enumerate(
            zip([t for t in wl.tensors() if not t.is_output], inputs, strict=True)
        ):
            parts.append(f"static const float w{n}_{tensor.name}[] = {{{_c_floats(data)}}};")
            args.append(f"w{n}_{tensor.name}")
            if (
                dict(wl.params).get("prepacked") and slot == 1
            ):  # the weights, packed by the kernel's own function
                parts.append(f"static float w{n}_packed[{symbol.upper()}_PACKED_FLOATS];")
                calls.append(f"    {symbol}_pack(w{n}_{tensor.name}, w{n}_packed);")
                args[-1] = f"w{n}_packed"
        parts.append(f"static const float w{n}_want[] = {{{_c_floats(expected)}}};")
        parts.append(f"static float w{n}_got[{expected.size}];")
        tol = 1e-4 * max(1.0, float(np.abs(expected).max())) * wl["k"] ** 0.5
        calls += [
            f"    memset(w{n}_got, 0xff, sizeof w{n}_got); /* NaN: an unwritten element fails */",
            f"    {prefix}_{wl.symbol}({', '.join(args)}, w{n}_got);",
            f'    bad += compare("{wl.symbol}", w{n}_got, w{n}_want, {expected.size}, {tol:.9e}f);',
        ]
    parts += [
        "static int compare(const char *name, const float *got, const float *want, int n, float tol) {",
        "    int bad = 0;",
        "    for (int i = 0; i < n; i++) {",
        "        float d = got[i] - want[i];",
        "        if (!(d <= tol && d >= -tol)) bad++;",
        "    }",
        '    printf("%s: %d of %d wrong\\n", name, bad, n);',
        "    return bad;",
        "}",
        "int main(void) {",
        "    int bad = 0;",
        *calls,
        "    return bad != 0;",
        "}",
        "",
    ]
    return "\n".join(parts)


def _runner(target: Target) -> list[str]:
    if target.arch == "x86_64":
        return []
    _need(target.qemu_binary)
    # riscv64-gcv's qemu_cpu is "rv64,v=true,vlen=256,vext_spec=v1.0" (RVV 1.0, docs/notes.md §3).
    return [target.qemu_binary, "-cpu", target.qemu_cpu]


def link_and_run(artifact: Artifact, workloads: Sequence[str], tmp: Path, archive: bool = False) -> str:
    """Write the artifact, link the checker with the target's gcc and run it; its stdout."""
    target = artifact.target
    cc = CROSS.get(target.arch, "gcc")
    _need(cc)
    artifact.write(tmp / "kernels.o", tmp / "kernels.h", tmp / "libkernels.a")
    (tmp / "check.c").write_text(checker_source(workloads))
    lib = ["-L", tmp, "-lkernels"] if archive else [tmp / "kernels.o"]
    static = ["-static"] if target.arch != "x86_64" else []
    _run([cc, "-O1", "-std=c99", "-I", tmp, tmp / "check.c", *lib, *static, "-o", tmp / "check"])
    return _run([*_runner(target), tmp / "check"]).stdout


# ---- real toolchains ----------------------------------------------------------------------------------


@pytest.mark.host_runs("x86-avx2")
def test_host_gcc_links_the_object_and_every_kernel_is_right(tmp_path: Path) -> None:
    artifact = build("x86-avx2", WORKLOADS)
    out = link_and_run(artifact, WORKLOADS, tmp_path)
    assert out.count(" 0 of ") == len(WORKLOADS), out
    assert [k.symbol for k in artifact.kernels] == [f"xt_{parse_workload(w).symbol}" for w in WORKLOADS]
    assert all(k.code_bytes > 0 for k in artifact.kernels)


@pytest.mark.host_runs("x86-avx2")
def test_prepacked_kernels_link_with_their_pack_functions_and_are_right(tmp_path: Path) -> None:
    artifact = build("x86-avx2", PREPACKED)
    out = link_and_run(artifact, PREPACKED, tmp_path)
    assert out.count(" 0 of ") == len(PREPACKED), out
    for entry in artifact.kernels:
        assert entry.pack is not None and entry.pack.symbol == entry.symbol + "_pack"
        assert f"#define {entry.symbol.upper()}_PACKED_FLOATS {entry.pack.packed_floats}u" in artifact.header
        assert (
            f"void {entry.pack.symbol}(const float *{entry.pack.tensor}, float *packed);" in artifact.header
        )
    # The header names the layout the pack function takes: the workload's tensors().
    assert "weights: float[21][13][3][3] (k, c, r, s: OIHW), row-major" in artifact.header
    assert "B: float[2100][33] (k, n), row-major" in artifact.header


@pytest.mark.board
@pytest.mark.parametrize("target", ["arm-a72-neon", "riscv64-gc", "riscv64-gcv"])
def test_prepacked_kernels_and_pack_functions_run_under_qemu(target: str, tmp_path: Path) -> None:
    out = link_and_run(build(target, PREPACKED), PREPACKED, tmp_path, archive=True)
    assert out.count(" 0 of ") == len(PREPACKED), out


@pytest.mark.host_runs("x86-avx2")
def test_archive_links_too(tmp_path: Path) -> None:
    out = link_and_run(build("x86-avx2", WORKLOADS[:2]), WORKLOADS[:2], tmp_path, archive=True)
    assert out.count(" 0 of ") == 2, out
    listing = _run(["nm", "-s", tmp_path / "libkernels.a"]).stdout
    assert "xt_matmul_m8_n16_k4 in kernels.o" in listing


@pytest.mark.board
@pytest.mark.parametrize("target", ["arm-a72-neon", "arm-a53-neon", "riscv64-gc", "riscv64-gcv"])
def test_cross_gcc_static_binary_runs_under_qemu(target: str, tmp_path: Path) -> None:
    out = link_and_run(build(target, WORKLOADS), WORKLOADS, tmp_path)
    assert out.count(" 0 of ") == len(WORKLOADS), out


@pytest.mark.parametrize("target", ["x86-avx2", "arm-a72-neon", "riscv64-gcv"])
def test_object_is_pic_without_got_and_only_entry_points_are_global(target: str, tmp_path: Path) -> None:
    _need("readelf", "nm")
    artifact = build(target, WORKLOADS[:2], prefix="fw")
    (tmp_path / "k.o").write_bytes(artifact.object)
    relocations = _run(["readelf", "-rW", tmp_path / "k.o"]).stdout
    assert "GOT" not in relocations and "_ABS64" not in relocations and "R_X86_64_64" not in relocations
    symbols = _run(["nm", "-g", tmp_path / "k.o"]).stdout.split("\n")
    assert sorted(line.split()[-1] for line in symbols if line) == sorted(k.symbol for k in artifact.kernels)
    assert all(k.symbol.startswith("fw_matmul_") for k in artifact.kernels)


def test_header_compiles_as_strict_c99_and_as_cpp(tmp_path: Path) -> None:
    _need("gcc", "g++")
    artifact = build("x86-avx2", WORKLOADS[:2])
    (tmp_path / "kernels.h").write_text(artifact.header)
    # Included twice: the guard must hold.
    use = '#include "kernels.h"\n#include "kernels.h"\nint main(void) { return 0; }\n'
    (tmp_path / "use.c").write_text(use)
    _run(
        [
            "gcc",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=c99",
            "-pedantic",
            "-c",
            tmp_path / "use.c",
            "-o",
            tmp_path / "use.o",
        ]
    )
    _run(
        [
            "g++",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-x",
            "c++",
            "-c",
            tmp_path / "use.c",
            "-o",
            tmp_path / "use_cpp.o",
        ]
    )
    header = artifact.header
    assert "void xt_matmul_m8_n16_k4(const float *A, const float *B, float *C);" in header
    assert "A: float[8][4], row-major" in header and "must not overlap" in header
    assert f"#define XT_MATMUL_M8_N16_K4_STACK_BYTES {artifact.kernels[0].stack_bytes}u" in header


@pytest.mark.host_runs("x86-avx2")
def test_example_makefile_builds_and_runs(tmp_path: Path) -> None:
    _need("make", "gcc")
    xtune = f"{sys.executable} -m xtune.cli"
    _run(["make", "-C", ROOT / "examples/firmware", f"BUILD={tmp_path}", f"XTUNE={xtune}"])
    out = _run([tmp_path / "demo"]).stdout
    assert out.count(" ok") == 3, out


@pytest.mark.board
def test_example_cmake_cross_build_runs_under_qemu(tmp_path: Path) -> None:
    _need("cmake", "make", "aarch64-linux-gnu-gcc", "qemu-aarch64")
    xtune = f"{sys.executable} -m xtune.cli"
    _run(
        [
            "cmake",
            "-S",
            ROOT / "examples/firmware",
            "-B",
            tmp_path,
            f"-DXTUNE={xtune}",
            "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            "-DXTUNE_TARGET=arm-a72-neon",
            "-DCMAKE_EXE_LINKER_FLAGS=-static",
        ]
    )
    _run(["cmake", "--build", tmp_path])
    out = _run(["qemu-aarch64", "-cpu", "cortex-a72", tmp_path / "demo"]).stdout
    assert out.count(" ok") == 3, out


# ---- which config reaches the artifact ----------------------------------------------------------------


def _write_log(path: Path, target: str, rows: Sequence[tuple[str, int | None, MeasureStatus, float]]) -> None:
    """(workload, config index or None for the default, status, seconds) rows, via the log's own writer."""
    records = []
    for text, index, status, seconds in rows:
        template = template_for(parse_workload(text), get_target(target))
        config = template.default_config() if index is None else template.space.config(index)
        result = MeasureResult(status, (seconds,), "" if status is MeasureStatus.OK else "bad")
        records.append(make_record(text, target, "local", config, result))
    TuningLog(path).append(records)


def test_wrong_answers_and_crashes_never_reach_the_artifact(tmp_path: Path) -> None:
    tuned, untuned, failed = "matmul:m=8,n=16,k=4", "matmul:m=13,n=19,k=7", "matmul:m=1,n=7,k=3"
    log = tmp_path / "log.jsonl"
    _write_log(
        log,
        "x86-avx2",
        [
            (tuned, 5, MeasureStatus.WRONG_ANSWER, 1e-9),  # fastest, but wrong
            (tuned, 6, MeasureStatus.RUNTIME_ERROR, 1e-9),
            (tuned, 7, MeasureStatus.OK, 2e-6),
            (tuned, 8, MeasureStatus.OK, 3e-6),
            (failed, 1, MeasureStatus.WRONG_ANSWER, 1e-9),
            (failed, 2, MeasureStatus.RUNTIME_ERROR, 1e-9),
        ],
    )
    # `untuned` was tuned, but on another target only.
    _write_log(tmp_path / "arm.jsonl", "arm-a72-neon", [(untuned, 3, MeasureStatus.OK, 1e-6)])
    artifact = build("x86-avx2", [tuned, untuned, failed], logs=[tmp_path / "arm.jsonl", log])
    by_workload = {k.workload: k for k in artifact.kernels}
    assert by_workload[tuned].source == "log" and by_workload[tuned].config_index == 7
    assert by_workload[tuned].gflops == pytest.approx(2 * 8 * 16 * 4 / 2e-6 / 1e9)
    default = {
        w: template_for(parse_workload(w), get_target("x86-avx2")).default_config().index
        for w in (untuned, failed)
    }
    for w in (untuned, failed):
        assert by_workload[w].source == "default" and by_workload[w].config_index == default[w]
    assert by_workload[untuned].reason == "never tuned on x86-avx2; logged only for arm-a72-neon"
    assert "only failed records" in by_workload[failed].reason
    assert "1 wrong_answer" in by_workload[failed].reason
    (warning,) = artifact.warnings
    assert untuned in warning and failed in warning and tuned not in warning
    assert "config 7 (best OK record in the log" in artifact.header
    out = link_and_run(artifact, [tuned, untuned, failed], tmp_path)
    assert out.count(" 0 of ") == 3, out


def test_no_log_and_stale_log_fall_back_with_reasons(tmp_path: Path) -> None:
    artifact = build("x86-avx2", ["matmul:m=8,n=16,k=4", "matmul:m=8,n=16,k=4"])
    assert len(artifact.kernels) == 1  # duplicates are built once
    assert artifact.kernels[0].reason == "no log given" and "no log given" in artifact.warnings[0]
    log = tmp_path / "log.jsonl"
    _write_log(log, "x86-avx2", [("matmul:m=8,n=16,k=4", 7, MeasureStatus.OK, 1e-6)])
    line = json.loads(log.read_text())
    line["knobs"][0][1] = "99x9"  # the template has changed since this was logged
    log.write_text(json.dumps(line) + "\n")
    artifact = build("x86-avx2", ["matmul:m=8,n=16,k=4"], logs=[log])
    (entry,) = artifact.kernels
    assert entry.source == "default" and entry.reason == "never tuned on x86-avx2"
    assert any(f"{log}: skipped 1 record" in w and "no longer match" in w for w in artifact.warnings)


def test_bad_input_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown target"):
        build("pdp11", WORKLOADS[:1])
    with pytest.raises(InputError, match="unknown operator"):
        build("x86-avx2", ["conv9d:m=1"])
    with pytest.raises(InputError, match="no such log"):
        build("x86-avx2", WORKLOADS[:1], logs=[tmp_path / "missing.jsonl"])
    with pytest.raises(InputError, match="not a C identifier"):
        build("x86-avx2", WORKLOADS[:1], prefix="9x")


# ---- the command line ---------------------------------------------------------------------------------


def test_cli_build_writes_files_and_prints_the_table(tmp_path: Path, capsys: Capture) -> None:
    obj, hdr, lib = tmp_path / "k.o", tmp_path / "k.h", tmp_path / "libk.a"
    argv = [
        "build",
        "--target",
        "riscv64-gc",
        "--workload",
        WORKLOADS[0],
        "--workload",
        WORKLOADS[1],
        "-o",
        str(obj),
        "--header",
        str(hdr),
        "--archive",
        str(lib),
        "--prefix",
        "nn",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "nn_matmul_m8_n16_k4" in out and "default" in out and "symbol" in out
    assert "warning" in err and WORKLOADS[1] in err
    assert obj.read_bytes()[:4] == b"\x7fELF" and lib.read_bytes()[:8] == b"!<arch>\n"
    assert "nn_matmul_m13_n19_k7(" in hdr.read_text()
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [k["symbol"] for k in report["kernels"]] == ["nn_matmul_m8_n16_k4", "nn_matmul_m13_n19_k7"]
    assert report["kernels"][0]["code_bytes"] > 0


def test_cli_unknown_target_is_one_line_and_exit_2(tmp_path: Path, capsys: Capture) -> None:
    argv = [
        "build",
        "--target",
        "nope",
        "--workload",
        WORKLOADS[0],
        "-o",
        str(tmp_path / "k.o"),
        "--header",
        str(tmp_path / "k.h"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown target 'nope'" in err
    assert not (tmp_path / "k.o").exists()

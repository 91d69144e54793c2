"""Peers: a workload in, the seconds per call of the library a user would run instead (numpy, one thread)."""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator

from xtune.workload import Workload, random_inputs

# Names under which OpenBLAS builds export their thread-count setter (numpy's wheels rename it).
_BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads",
)
_BLAS_GETTERS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads",
)


def _openblas() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(path)
    return None


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Pin numpy's OpenBLAS to one thread for a fair single-core comparison, then restore it."""
    lib = _openblas()
    setter = next((getattr(lib, n) for n in _BLAS_SETTERS if lib is not None and hasattr(lib, n)), None)
    getter = next((getattr(lib, n) for n in _BLAS_GETTERS if lib is not None and hasattr(lib, n)), None)
    if setter is None or getter is None:
        yield  # no OpenBLAS found: numpy's BLAS is already whatever OPENBLAS_NUM_THREADS says
        return
    before = int(getter())
    setter(1)
    try:
        yield
    finally:
        setter(before)


def numpy_seconds(workload: Workload, repeat: int = 5, min_repeat_s: float = 0.05) -> list[float]:
    """Seconds per call of the numpy reference, one figure per repeat, on one thread."""
    inputs = random_inputs(workload)

    def per_call(number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            workload.reference(inputs)
        return (time.perf_counter() - start) / number

    with single_thread_blas():
        workload.reference(inputs)  # warm up: page in, let BLAS pick its kernels
        number = 1
        while (first := per_call(number)) * number < min_repeat_s:
            number *= 2  # like the agent: calls per repeat grow until a repeat is long enough
        costs = [first] + [per_call(number) for _ in range(repeat - 1)]
    return costs

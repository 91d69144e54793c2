"""The resize family's kernels: the taps of every output row and column (`Tap`, computed at build time by
xtune/ops/resize.py) in, the loop nest that blends them out, in NCHW (vectors along W) or NHWC (vectors
along C).

Along an axis, outputs split into runs in which the taps of output j + P are those of output j moved by
Q input rows (an integer upscale by s: P = s, Q = 1), plus the few outputs at the edges where the
coordinate is clamped (`runs`); the kernel unrolls one period of each run and loops over the rest.

- NHWC: a pixel's channels are blended as vectors, each tap's weight one constant for all lanes.
- NCHW: `lanes` consecutive outputs of a row are one vector (`Group`): the input columns they read are
  loaded as the few vectors that cover them and picked lane by lane with shufflevector, each lane's weight
  a constant of its own (`Lanes`): nearest is loads and shuffles only.

Direct: each (row period, column period) pair is one unrolled body, every output read straight from the
input. When the patterns do not repeat within a short period (align_corners from 100 to 173: periods of
172) that would be rows x columns bodies, so beyond `MAX_BODIES` the kernel is separable instead: the
rows are blended first, a whole output row at a time, into a scratch image of oh x w pixels (vectors along
W in NCHW; in NHWC one channel block of `lanes` at a time), then each scratch row is resampled along W in
a loop over the rows: rows + columns bodies. Both orders are exact bilinear up to float32 rounding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Const,
    Lanes,
    Load,
    MulAdd,
    NestBuilder,
    Shuffle,
    Value,
)

MAX_PERIOD = 64  # the longest repeating pattern of taps looked for along an axis
MAX_BODIES = 4096  # unrolled bodies a kernel may have: a bound on its code size
_SAME_WEIGHT = 1e-9  # float64 rounding of coordinates below 2^20; float32 keeps 6e-8 of a weight


@dataclass(frozen=True)
class Tap:
    """What one output row (or column) reads: input rows lo and hi, blended (1 - t) * lo + t * hi."""

    lo: int
    hi: int
    t: float

    def repeats(self, first: Tap, by: int) -> bool:
        """Whether this tap is `first` moved by `by` rows (the weight equal up to float64 rounding)."""
        return (self.lo, self.hi) == (first.lo + by, first.hi + by) and abs(self.t - first.t) <= _SAME_WEIGHT


@dataclass(frozen=True)
class Group:
    """`count` consecutive outputs of an NCHW row, one vector: lane i reads input columns lo + los[i] and
    lo + his[i], blended (1 - ts[i]) and ts[i]; `loads` the vectors read, (v, valid lanes) for the vector
    from column lo + v * lanes (a whole vector inside the row, else only the row's last columns)."""

    lo: int
    count: int
    los: tuple[int, ...]
    his: tuple[int, ...]
    ts: tuple[float, ...]
    loads: tuple[tuple[int, int], ...]

    def repeats(self, first: Group, by: int) -> bool:
        if (self.lo - by, self.count, self.los, self.his) != (first.lo, first.count, first.los, first.his):
            return False
        close = all(abs(a - b) <= _SAME_WEIGHT for a, b in zip(self.ts, first.ts, strict=True))
        return self.loads == first.loads and close


@dataclass(frozen=True)
class Run:
    """Outputs start + k * period + j (k < count, j < period) reading taps[j] moved by k * step rows."""

    start: int
    period: int
    count: int
    step: int
    taps: tuple[Tap | Group, ...]


def _repeats(taps: Sequence[Tap | Group], start: int, period: int) -> tuple[int, int]:
    """How many whole periods from `start` repeat the first one, each moved by the same step."""
    step = taps[start + period].lo - taps[start].lo if start + period < len(taps) else 0
    count = 1
    while start + (count + 1) * period <= len(taps) and all(
        taps[start + count * period + j].repeats(taps[start + j], count * step)  # type: ignore[arg-type]
        for j in range(period)
    ):
        count += 1
    return count, step


def runs(taps: Sequence[Tap | Group]) -> tuple[Run, ...]:
    """`taps` as runs, greedily the longest repeating stretch first (the smallest period of that length)."""
    out: list[Run] = []
    start = 0
    while start < len(taps):
        best = (1, 1, 0)  # period, count, step
        for period in range(1, min(MAX_PERIOD, (len(taps) - start) // 2) + 1):
            count, step = _repeats(taps, start, period)
            if count > 1 and period * count > best[0] * best[1]:
                best = (period, count, step)
        period, count, step = best
        out.append(Run(start, period, count, step, tuple(taps[start : start + period])))
        start = start + period * count
    return tuple(out)


def groups(taps: tuple[Tap, ...], lanes: int, row_len: int) -> tuple[Group, ...]:
    """The taps of a row's outputs as vectors of `lanes` outputs (the last may hold fewer), reading rows of
    `row_len` columns."""
    out = []
    for first in range(0, len(taps), lanes):
        part = taps[first : first + lanes]
        lo = min(t.lo for t in part)
        los, his = tuple(t.lo - lo for t in part), tuple(t.hi - lo for t in part)
        vectors = sorted({o // lanes for o in los + his})
        loads = tuple((v, min(lanes, row_len - lo - v * lanes)) for v in vectors)
        out.append(Group(lo, len(part), los, his, tuple(t.t for t in part), loads))
    return tuple(out)


def bodies(rows: tuple[Run, ...], cols: tuple[Run, ...]) -> tuple[int, int]:
    """The unrolled bodies of the direct kernel (rows x columns) and of the separable one (rows + columns)."""
    r, c = sum(run.period for run in rows), sum(run.period for run in cols)
    return r * c, r + c


Term = tuple[Value, tuple[float, ...]]  # a loaded vector and its weight: one for all lanes, or one per lane


def weights(tap: Tap) -> list[tuple[int, float]]:
    """The input rows a tap reads with their weights, the zero ones left out."""
    if tap.t == 0 or tap.lo == tap.hi:
        return [(tap.lo, 1.0)]
    return [(tap.lo, 1.0 - tap.t), (tap.hi, tap.t)]


def tap_terms(src: str, row: Affine, tap: Tap, unit: int, ch: Affine, width: int, count: int) -> list[Term]:
    """An NHWC output pixel's channel vector from one source row at `row`: its columns' loads, `unit`
    elements a column apart, and their weights."""
    return [(Load(src, row + col * unit + ch, width, count), (w,)) for col, w in weights(tap)]


def group_terms(src: str, row: Affine, group: Group, lanes: int) -> list[Term]:
    """An NCHW output vector from one source row at `row`: the vectors that cover the columns its lanes
    read, picked lane by lane with shuffles (one per vector after the second), each with its lanes'
    weights."""
    loaded = {v: Load(src, row + group.lo + v * lanes, lanes, count) for v, count in group.loads}

    def pick(offsets: tuple[int, ...]) -> Value:
        want = [offsets[i] if i < len(offsets) else offsets[0] for i in range(lanes)]
        vectors = sorted({o // lanes for o in want})
        if len(vectors) == 1 and [o % lanes for o in want] == list(range(lanes)):
            return loaded[vectors[0]]  # the columns as they are (a scale of 1 along W)
        first, second = vectors[0], vectors[min(1, len(vectors) - 1)]
        mask = [
            o % lanes if o // lanes == first else lanes + o % lanes if o // lanes == second else 0
            for o in want
        ]
        acc: Value = Shuffle(loaded[first], loaded[second], tuple(mask))
        for v in vectors[2:]:  # a strong downscale: merge one more vector at a time
            mask = [lanes + o % lanes if o // lanes == v else i for i, o in enumerate(want)]
            acc = Shuffle(acc, loaded[v], tuple(mask))
        return acc

    if all(t == 0 for t in group.ts):
        return [(pick(group.los), (1.0,))]
    pad = (0.0,) * (lanes - group.count)
    return [
        (pick(group.los), tuple(1.0 - t for t in group.ts) + pad),
        (pick(group.his), (*group.ts, *pad)),
    ]


def blend(terms: Sequence[Term], width: int) -> Value:
    """The weighted sum of `terms` (a copy when there is one with weight 1)."""

    def const(w: tuple[float, ...]) -> Value:
        return Const(w[0], width) if len(set(w)) == 1 else Lanes(w)

    (v0, w0), *rest = terms
    acc = v0 if set(w0) == {1.0} else Binary(BinaryOp.MUL, v0, const(w0))
    for value, w in rest:
        acc = MulAdd(value, const(w), acc)
    return acc


def scaled(terms: list[Term], by: float) -> list[Term]:
    """`terms` with every weight multiplied by `by` (a row's weight)."""
    return [(v, tuple(x * by for x in w)) for v, w in terms]


def scratch(size: int) -> Buffer:
    """The separable kernel's image of row-blended pixels, on the kernel's stack."""
    return Buffer("T", size, BufferKind.LOCAL)


def each(b: NestBuilder, items: tuple[Run, ...], body: Callable[[Affine, Tap | Group, Affine], None]) -> None:
    """Every output of runs `items`: body(output index, its tap, input shift) in loops over the periods."""
    for run in items:
        with b.loop(run.count, "k") as k:
            for j, tap in enumerate(run.taps):
                body(k * run.period + (run.start + j), tap, k * run.step)


@dataclass(frozen=True, kw_only=True)
class Image:
    """A resize's sizes: `n` images of `c` channels, h x w to oh x ow, in NHWC or NCHW."""

    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    nhwc: bool


def column_runs(im: Image, cols: tuple[Tap, ...], lanes: int) -> tuple[Run, ...]:
    """The output columns' runs: pixels in NHWC, vectors of `lanes` outputs in NCHW."""
    return runs(cols if im.nhwc else groups(cols, lanes, im.w))


def direct(b: NestBuilder, im: Image, rows: tuple[Run, ...], cols: tuple[Run, ...], lanes: int) -> None:
    """Every output read straight from the input: one body per (row tap, column tap) of a period."""
    unit = im.c if im.nhwc else 1  # elements from one column to the next
    with b.loop(im.n if im.nhwc else im.n * im.c, "p") as p:
        src, dst = p * (im.h * im.w * unit), p * (im.oh * im.ow * unit)

        def row(oy: Affine, ty: Tap | Group, ys: Affine) -> None:
            assert isinstance(ty, Tap)
            at = [(src + (ys + iy) * (im.w * unit), wy) for iy, wy in weights(ty)]

            def column(ox: Affine, tx: Tap | Group, xs: Affine) -> None:
                if isinstance(tx, Group):
                    terms = [t for r, wy in at for t in scaled(group_terms("x", r + xs, tx, lanes), wy)]
                    b.store("out", dst + oy * im.ow + ox * lanes, blend(terms, lanes), lanes, tx.count)
                    return

                def channels(ch: Affine, count: int) -> None:
                    terms = [
                        t
                        for r, wy in at
                        for t in scaled(tap_terms("x", r + xs * unit, tx, unit, ch, lanes, count), wy)
                    ]
                    b.store("out", dst + (oy * im.ow + ox) * unit + ch, blend(terms, lanes), lanes, count)

                b.split(im.c, lanes, channels, "c")

            each(b, cols, column)

        each(b, rows, row)


def separable(b: NestBuilder, im: Image, rows: tuple[Run, ...], cols: tuple[Run, ...], lanes: int) -> None:
    """The rows blended into the scratch image `T` (oh x w pixels: in NHWC one channel block of `lanes`
    at a time), then each of its rows resampled along W in a loop over the rows."""
    if not im.nhwc:
        with b.loop(im.n * im.c, "p") as p:
            src, dst = p * (im.h * im.w), p * (im.oh * im.ow)

            def row(oy: Affine, ty: Tap | Group, ys: Affine) -> None:
                assert isinstance(ty, Tap)

                def span(x: Affine, count: int) -> None:
                    terms = [
                        (Load("x", src + (ys + iy) * im.w + x, lanes, count), (wy,)) for iy, wy in weights(ty)
                    ]
                    b.store("T", oy * im.w + x, blend(terms, lanes), lanes, count)

                b.split(im.w, lanes, span, "x")

            each(b, rows, row)
            with b.loop(im.oh, "oy") as oy:

                def column(ox: Affine, g: Tap | Group, xs: Affine) -> None:
                    assert isinstance(g, Group)
                    value = blend(group_terms("T", oy * im.w + xs, g, lanes), lanes)
                    b.store("out", dst + oy * im.ow + ox * lanes, value, lanes, g.count)

                each(b, cols, column)
        return
    with b.loop(im.n, "p") as p:
        src, dst = p * (im.h * im.w * im.c), p * (im.oh * im.ow * im.c)

        def block(cb: Affine, count: int) -> None:
            def row(oy: Affine, ty: Tap | Group, ys: Affine) -> None:
                assert isinstance(ty, Tap)
                with b.loop(im.w, "x") as x:
                    terms = [
                        (Load("x", src + ((ys + iy) * im.w + x) * im.c + cb, lanes, count), (wy,))
                        for iy, wy in weights(ty)
                    ]
                    b.store("T", (oy * im.w + x) * lanes, blend(terms, lanes), lanes, count)

            each(b, rows, row)
            with b.loop(im.oh, "oy") as oy:

                def column(ox: Affine, tx: Tap | Group, xs: Affine) -> None:
                    assert isinstance(tx, Tap)
                    terms = tap_terms("T", (oy * im.w + xs) * lanes, tx, lanes, Affine(), lanes, count)
                    b.store("out", dst + (oy * im.ow + ox) * im.c + cb, blend(terms, lanes), lanes, count)

                each(b, cols, column)

        b.split(im.c, lanes, block, "c")

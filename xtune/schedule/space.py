"""Config spaces: knobs in, a mixed-radix index <-> `Config` mapping out, shared by tuners, model and log;
and the sum of spaces (`SumSpace`: one space per alternative, such as a convolution's algorithms)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np

from xtune.errors import InputError

KnobValue = int | str


class KnobKind(Enum):
    TILE = "tile"  # a tile size of a loop axis (tails are handled by the template, so any size is legal)
    CHOICE = "choice"  # one of a few named alternatives (loop order, packing on/off, ...)
    UNROLL = "unroll"  # an unroll factor


@dataclass(frozen=True)
class Knob:
    name: str
    kind: KnobKind
    options: tuple[KnobValue, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"knob {self.name} has no options")


@dataclass(frozen=True)
class Config:
    """One point of a space: its index (the key everywhere) and the knob values it stands for."""

    index: int
    values: tuple[tuple[str, KnobValue], ...]

    def __getitem__(self, name: str) -> KnobValue:
        for key, value in self.values:
            if key == name:
                return value
        raise KeyError(name)

    def int(self, name: str) -> int:
        value = self[name]
        assert isinstance(value, int), name
        return value

    def as_dict(self) -> dict[str, KnobValue]:
        return dict(self.values)


@dataclass(frozen=True)
class ConfigSpace:
    """The product of the knobs' options; index = sum(choice_i * prod(radix_j for j < i)).

    The mixed-radix arithmetic lives here once, on numpy arrays (`digits`, `indices`, `with_digit`): the
    scalar methods call it with one index, and the vectorized search (tuning.search.SpaceArrays) and the
    features call it with thousands."""

    knobs: tuple[Knob, ...]

    @property
    def size(self) -> int:
        return math.prod(len(k.options) for k in self.knobs)

    @cached_property
    def radices(self) -> np.ndarray:
        """Options per knob: the radix of each digit."""
        return np.array([len(k.options) for k in self.knobs], dtype=self._dtype)

    @cached_property
    def strides(self) -> np.ndarray:
        """The index step of one option of each knob: the product of the radices before it."""
        return np.array(
            [math.prod(len(k.options) for k in self.knobs[:i]) for i in range(len(self.knobs))],
            dtype=self._dtype,
        )

    @cached_property
    def _dtype(self) -> type:
        # int64 below 2**62 (room for `with_digit`'s intermediate sums); Python ints beyond.
        return np.int64 if self.size < 2**62 else object

    def digits(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """(n,) indices in, (n, knobs) option numbers (the mixed-radix digits) out."""
        rest: np.ndarray = np.asarray(indices, dtype=self._dtype).reshape(-1)
        return (rest[:, None] // self.strides[None, :]) % self.radices[None, :]

    def indices(self, digits: np.ndarray) -> np.ndarray:
        """(n, knobs) option numbers in, (n,) indices out."""
        return np.asarray(digits, dtype=self._dtype).reshape(-1, len(self.knobs)) @ self.strides

    def with_digit(
        self, indices: np.ndarray, knobs: np.ndarray | int, digits: np.ndarray | int
    ) -> np.ndarray:
        """Each index with knob number `knobs[i]` set to option number `digits[i]` (scalars broadcast)."""
        indices = np.asarray(indices, dtype=self._dtype)
        radix, stride = self.radices[knobs], self.strides[knobs]
        old = (indices // stride) % radix
        return indices + (np.asarray(digits, dtype=self._dtype) - old) * stride

    def _check(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise InputError(f"config index {index} is outside the space (0..{self.size - 1})")

    def choices(self, index: int) -> tuple[int, ...]:
        """The option number of every knob at `index`."""
        self._check(index)
        return tuple(int(d) for d in self.digits([index])[0])

    def config(self, index: int) -> Config:
        digits = self.choices(index)
        return Config(index, tuple((k.name, k.options[d]) for k, d in zip(self.knobs, digits, strict=True)))

    def index_of(self, values: dict[str, KnobValue]) -> int:
        digits = []
        for knob in self.knobs:
            if knob.name not in values:
                raise InputError(f"config has no value for knob '{knob.name}'")
            try:
                digits.append(knob.options.index(values[knob.name]))
            except ValueError:
                raise InputError(f"knob '{knob.name}' has no option {values[knob.name]!r}") from None
        return int(self.indices(np.array([digits]))[0])

    def matches(self, index: int, values: tuple[tuple[str, KnobValue], ...]) -> bool:
        """Whether `values` (a logged config's knobs) are the config at `index`: the rule a log's record
        still means its config by. A knob appended to a space since the record was written is the most
        significant digit, so every older index keeps its config with the new knob at its first option
        (which must be the old behaviour): a record without it matches there."""
        if not 0 <= index < self.size:
            return False
        have, logged = self.config(index).values, len(values)
        return have[:logged] == values and not any(self.choices(index)[logged:])

    def neighbour(self, index: int, knob_number: int, digit: int) -> int:
        """`index` with one knob set to option number `digit`."""
        self._check(index)
        return int(self.with_digit(np.array([index]), knob_number, digit)[0])


@dataclass(frozen=True)
class SumSpace(ConfigSpace):
    """The disjoint union of `parts`, one space per alternative of the `tag` knob: part 0's indices are its
    own (0..size0-1), each later part's follow the ones before, so a space that gains an alternative keeps
    the indices, and the logs, of its first part. A config is ((tag, part name), *its part's values); a
    record of part 0 logged without the tag (before the sum existed) still `matches` its config.

    The digits of an index are the part's number, then every part's own digits, a part's columns left 0
    when another part is active: the knobs are (tag, *part 0's, *part 1's, ...). Built by `sum_space`."""

    tag: str
    parts: tuple[tuple[str, ConfigSpace], ...]

    @property
    def size(self) -> int:
        return sum(part.size for _, part in self.parts)

    @cached_property
    def offsets(self) -> np.ndarray:
        """The first index of each part."""
        return np.cumsum([0] + [part.size for _, part in self.parts[:-1]]).astype(self._dtype)

    @cached_property
    def columns(self) -> tuple[slice, ...]:
        """Each part's digit columns."""
        ends = np.cumsum([1] + [len(part.knobs) for _, part in self.parts]).tolist()
        return tuple(slice(a, b) for a, b in itertools.pairwise(ends))

    def split(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(n,) indices in, each one's part number and its index within that part out."""
        flat: np.ndarray = np.asarray(indices, dtype=self._dtype).reshape(-1)
        part = np.searchsorted(self.offsets, flat, side="right") - 1
        return part, flat - self.offsets[part]

    def digits(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        part, local = self.split(indices)
        out: np.ndarray = np.zeros((len(part), len(self.knobs)), dtype=self._dtype)
        out[:, 0] = part
        for p, (_, space) in enumerate(self.parts):
            mine = part == p
            if mine.any():
                out[np.ix_(mine, np.arange(len(self.knobs))[self.columns[p]])] = space.digits(local[mine])
        return out

    def indices(self, digits: np.ndarray) -> np.ndarray:
        d: np.ndarray = np.asarray(digits, dtype=self._dtype).reshape(-1, len(self.knobs))
        out: np.ndarray = np.zeros(len(d), dtype=self._dtype)
        for p, (_, space) in enumerate(self.parts):
            mine = d[:, 0] == p
            if mine.any():
                out[mine] = self.offsets[p] + space.indices(d[mine][:, self.columns[p]])
        return out

    def with_digit(
        self, indices: np.ndarray, knobs: np.ndarray | int, digits: np.ndarray | int
    ) -> np.ndarray:
        """As a product's, on the sum's digits: a move of the tag lands on the other part's config of
        digits 0 (`SpaceArrays.random_moves` lands at random instead), a move of an inactive part's knob
        changes nothing."""
        flat: np.ndarray = np.asarray(indices, dtype=self._dtype)
        knob, digit = np.broadcast_arrays(np.asarray(knobs), np.asarray(digits, dtype=self._dtype), flat)[:2]
        d = self.digits(flat)
        rows = np.arange(len(d))
        old_part = d[:, 0].copy()
        d[rows, knob.reshape(-1)] = digit.reshape(-1)
        switched = d[:, 0] != old_part
        for p in range(len(self.parts)):  # a new part starts from its own digits 0
            d[np.ix_(switched & (d[:, 0] == p), np.arange(len(self.knobs))[self.columns[p]])] = 0
        return self.indices(d).reshape(flat.shape)

    def config(self, index: int) -> Config:
        self._check(index)
        part, local = (int(v[0]) for v in self.split([index]))
        name, space = self.parts[part]
        return Config(index, ((self.tag, name), *space.config(local).values))

    def index_of(self, values: dict[str, KnobValue]) -> int:
        """The index of `values`; without the tag, of part 0 (a config logged before the sum existed)."""
        names = [name for name, _ in self.parts]
        name = values.get(self.tag, names[0])
        if name not in names:
            raise InputError(f"knob '{self.tag}' has no option {name!r}")
        part = names.index(name)
        own = {k: v for k, v in values.items() if k != self.tag}
        return int(self.offsets[part]) + self.parts[part][1].index_of(own)

    def matches(self, index: int, values: tuple[tuple[str, KnobValue], ...]) -> bool:
        if super().matches(index, values):
            return True
        first = self.parts[0][1]
        return index < first.size and first.matches(index, values)


def sum_space(tag: str, parts: Sequence[tuple[str, ConfigSpace]]) -> SumSpace:
    """The sum of `parts` (name, space), in order, its alternatives told apart by the knob `tag`."""
    if len(parts) < 2:
        raise ValueError(f"a sum of spaces needs two parts or more, got {len(parts)}")
    knobs = (Knob(tag, KnobKind.CHOICE, tuple(name for name, _ in parts)),)
    return SumSpace(knobs + tuple(k for _, space in parts for k in space.knobs), tag, tuple(parts))

"""Config spaces: knobs in, a mixed-radix index <-> `Config` mapping out, shared by tuners, model and log."""

from __future__ import annotations

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

    def neighbour(self, index: int, knob_number: int, digit: int) -> int:
        """`index` with one knob set to option number `digit`."""
        self._check(index)
        return int(self.with_digit(np.array([index]), knob_number, digit)[0])

"""Config spaces: knobs in, a mixed-radix index <-> `Config` mapping out, shared by tuners, model and log."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

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
    """The product of the knobs' options; index = sum(choice_i * prod(radix_j for j < i))."""

    knobs: tuple[Knob, ...]

    @property
    def size(self) -> int:
        return math.prod(len(k.options) for k in self.knobs)

    def choices(self, index: int) -> tuple[int, ...]:
        """The option number of every knob at `index` (the mixed-radix digits)."""
        if not 0 <= index < self.size:
            raise InputError(f"config index {index} is outside the space (0..{self.size - 1})")
        digits = []
        for knob in self.knobs:
            index, digit = divmod(index, len(knob.options))
            digits.append(digit)
        return tuple(digits)

    def digits(self, indices: np.ndarray) -> np.ndarray:
        """Vectorized `choices`: an (n,) int64 array of indices in, an (n, knobs) array of digits out."""
        rest = np.asarray(indices, dtype=np.int64)
        out = np.empty((rest.shape[0], len(self.knobs)), dtype=np.int64)
        for col, knob in enumerate(self.knobs):
            rest, out[:, col] = np.divmod(rest, len(knob.options))
        return out

    def config(self, index: int) -> Config:
        digits = self.choices(index)
        return Config(index, tuple((k.name, k.options[d]) for k, d in zip(self.knobs, digits, strict=True)))

    def index_of(self, values: dict[str, KnobValue]) -> int:
        index, radix = 0, 1
        for knob in self.knobs:
            if knob.name not in values:
                raise InputError(f"config has no value for knob '{knob.name}'")
            try:
                digit = knob.options.index(values[knob.name])
            except ValueError:
                raise InputError(f"knob '{knob.name}' has no option {values[knob.name]!r}") from None
            index += digit * radix
            radix *= len(knob.options)
        return index

    def neighbour(self, index: int, knob_number: int, digit: int) -> int:
        """`index` with one knob set to option number `digit`."""
        digits = list(self.choices(index))
        digits[knob_number] = digit
        out, radix = 0, 1
        for knob, d in zip(self.knobs, digits, strict=True):
            out += d * radix
            radix *= len(knob.options)
        return out

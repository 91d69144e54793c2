"""Config spaces: the mixed-radix index round trip, vectorized digits, and target-derived templates."""

import math
from collections.abc import Callable

import numpy as np
import pytest

from xtune.errors import InputError
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.tiles import group_lanes, parse_tile, register_tiles
from xtune.schedule.space import ConfigSpace, Knob, KnobKind
from xtune.target import get_target, load_targets
from xtune.tuning.features import featurize
from xtune.tuning.search import SpaceArrays

SPACE = ConfigSpace(
    (
        Knob("a", KnobKind.TILE, (1, 2, 4)),
        Knob("b", KnobKind.CHOICE, ("x", "y")),
        Knob("c", KnobKind.UNROLL, (1, 2, 4, 8, 16)),
    )
)


def test_index_round_trip_covers_the_space_exactly_once() -> None:
    assert SPACE.size == 30
    seen = set()
    for index in range(SPACE.size):
        config = SPACE.config(index)
        assert SPACE.index_of(config.as_dict()) == index
        seen.add(config.values)
    assert len(seen) == SPACE.size


def test_vectorized_digits_match_scalar_choices() -> None:
    indices = np.arange(SPACE.size)
    digits = SPACE.digits(indices)
    assert [tuple(row) for row in digits] == [SPACE.choices(i) for i in range(SPACE.size)]


def test_neighbour_changes_one_knob() -> None:
    index = SPACE.index_of({"a": 2, "b": "y", "c": 8})
    moved = SPACE.config(SPACE.neighbour(index, 2, 0))
    assert moved.as_dict() == {"a": 2, "b": "y", "c": 1}


def test_out_of_range_and_unknown_values_are_input_errors() -> None:
    with pytest.raises(InputError):
        SPACE.config(SPACE.size)
    with pytest.raises(InputError):
        SPACE.index_of({"a": 3, "b": "x", "c": 1})


@pytest.mark.parametrize("name", sorted(load_targets()))
def test_register_tiles_fit_the_register_file(name: str) -> None:
    target = get_target(name)
    tiles = [parse_tile(t) for t in register_tiles(target)]
    assert tiles
    assert all(mr * nv + nv + 1 <= target.vector_registers for mr, nv in tiles)


@pytest.mark.parametrize("name", sorted(load_targets()))
def test_default_config_is_in_the_space_and_uses_the_register_file(name: str) -> None:
    target = get_target(name)
    template = template_for(parse_workload("matmul:m=512,n=512,k=512"), target)
    config = template.default_config()
    assert template.space.config(config.index) == config
    mr, nv = parse_tile(str(config["tile"]))
    # The heuristic picks a tile that uses most of the accumulators the target has (in registers: RVV's
    # vectors are groups of lmul of them).
    lmul = int(group_lanes(target, mr, nv, int(config.as_dict().get("lmul", 1)))) // target.fp32_lanes
    assert (mr * nv + nv + 1) * lmul > target.vector_registers // 2


REAL_WORKLOADS = (
    "matmul:m=512,n=512,k=512",
    "matmul:m=37,n=53,k=71",
    "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,algo=direct",
    "conv2d:n=1,c=3,h=224,w=224,k=32,r=3,s=3,stride=2,pad=1,layout=nhwc",
    "depthwise:n=1,c=32,h=112,w=112,r=3,s=3,stride=2,pad=1",
)


@pytest.mark.parametrize("workload", REAL_WORKLOADS)
@pytest.mark.parametrize("target_name", ["x86-avx2", "x86-avx512", "arm-a53-neon", "riscv64-gc"])
def test_space_and_vectorized_search_agree_on_real_spaces(workload: str, target_name: str) -> None:
    space = template_for(parse_workload(workload), get_target(target_name)).space
    arrays = SpaceArrays(space)
    rng = np.random.default_rng(7)
    idx = rng.integers(0, space.size, 300)
    digits = arrays.digits(idx)
    radices = [len(k.options) for k in space.knobs]
    for i, row in zip(idx.tolist(), digits.tolist(), strict=True):
        # The definition, in Python ints: index = sum(digit_i * prod(radix_j for j < i)).
        assert sum(d * math.prod(radices[:n]) for n, d in enumerate(row)) == i
        assert all(0 <= d < r for d, r in zip(row, radices, strict=True))
        assert tuple(row) == space.choices(i)
        assert space.index_of(space.config(i).as_dict()) == i
    assert arrays.indices(digits).tolist() == idx.tolist()
    moved = arrays.random_moves(idx, rng)
    for i, j in zip(idx.tolist(), moved.tolist(), strict=True):
        before, after = space.choices(i), space.choices(j)
        changed = [n for n, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        assert len(changed) == 1 and space.neighbour(i, changed[0], after[changed[0]]) == j


class _SecondImplementation(Exception):
    pass


_INDEX_USERS: dict[str, Callable[[ConfigSpace, SpaceArrays], object]] = {
    "SpaceArrays.digits": lambda s, a: a.digits(np.arange(3)),
    "SpaceArrays.indices": lambda s, a: a.indices(np.zeros((2, len(s.knobs)), dtype=np.int64)),
    "SpaceArrays.random_moves": lambda s, a: a.random_moves(np.arange(3), np.random.default_rng(0)),
    "ConfigSpace.choices": lambda s, a: s.choices(5),
    "ConfigSpace.config": lambda s, a: s.config(5),
    "ConfigSpace.index_of": lambda s, a: s.index_of({k.name: k.options[0] for k in s.knobs}),
    "ConfigSpace.neighbour": lambda s, a: s.neighbour(5, 1, 0),
}


@pytest.mark.parametrize("user", sorted(_INDEX_USERS))
def test_every_index_conversion_goes_through_the_one_implementation(
    user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break ConfigSpace's array arithmetic: anything still working would be a second copy of the rule."""

    def broken(*args: object, **kwargs: object) -> None:
        raise _SecondImplementation

    space = SPACE
    arrays = SpaceArrays(space)
    for name in ("digits", "indices", "with_digit"):
        monkeypatch.setattr(ConfigSpace, name, broken)
    with pytest.raises(_SecondImplementation):
        _INDEX_USERS[user](space, arrays)


def test_features_use_the_space_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    template = template_for(parse_workload(REAL_WORKLOADS[0]), get_target("x86-avx2"))

    def broken(*args: object, **kwargs: object) -> None:
        raise _SecondImplementation

    monkeypatch.setattr(ConfigSpace, "digits", broken)
    with pytest.raises(_SecondImplementation):
        featurize(template, [0, 1])


def test_spaces_beyond_int64_keep_exact_indices() -> None:
    """The shared arithmetic uses Python ints where int64 would overflow (as the scalar code always did)."""
    huge = ConfigSpace(tuple(Knob(f"k{i}", KnobKind.TILE, tuple(range(1000))) for i in range(8)))
    assert huge.size > 2**63
    last = huge.size - 1
    assert huge.choices(last) == (999,) * 8
    assert huge.index_of(huge.config(last).as_dict()) == last
    assert huge.neighbour(last, 7, 0) == last - 999 * 1000**7


def test_a_record_logged_before_a_knob_was_appended_still_means_its_config() -> None:
    """RVV's lmul knob came after logs of RVV matmuls existed: it is the last (most significant) knob, its
    first option the old behaviour, so an old record's index and knobs still name the config it ran."""
    old = ConfigSpace((Knob("tile", KnobKind.CHOICE, ("4x2", "6x1")), Knob("kc", KnobKind.CHOICE, (64, 128))))
    new = ConfigSpace((*old.knobs, Knob("lmul", KnobKind.CHOICE, (1, 2, 4))))
    for index in range(old.size):
        assert new.matches(index, old.config(index).values)
        assert new.config(index).values[:2] == old.config(index).values
    # the same knobs with the new knob at another option is another config, and a changed value is stale
    assert not new.matches(old.size + 1, old.config(1).values)
    assert not new.matches(1, (("tile", "6x1"), ("kc", 128)))
    assert new.matches(3, new.config(3).values)
    assert not new.matches(new.size, new.config(3).values)

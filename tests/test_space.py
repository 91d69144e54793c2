"""Config spaces: the mixed-radix index round trip, vectorized digits, and target-derived templates."""

import numpy as np
import pytest

from xtune.errors import InputError
from xtune.schedule.space import ConfigSpace, Knob, KnobKind
from xtune.target import get_target, load_targets
from xtune.templates import template_for
from xtune.templates.matmul import parse_tile, register_tiles
from xtune.workload import parse_workload

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
    # The heuristic picks a tile that uses most of the accumulators the target has.
    assert mr * nv + nv + 1 > target.vector_registers // 2

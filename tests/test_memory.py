"""Static memory planner tests: lifetimes in (random, and ResNet-18 / MobileNetV2 at 224x224 as an
execution order would give them); plans checked for overlap, against the lower bound and for sharing."""

from __future__ import annotations

import random

import pytest

from tests.networks import INVERTED_RESIDUALS
from xtune.errors import InputError
from xtune.firmware.memory import ALIGN, MemoryPlan, Sharing, Step, TensorLife, plan_memory
from xtune.firmware.memory import lifetimes as tensor_lives

Layer = tuple[str, int, tuple[str, ...], str]  # name, float elements, inputs, kind: op | inplace | alias


SHARING = {"op": Sharing.NONE, "inplace": Sharing.IN_PLACE, "alias": Sharing.ALIAS}


def lifetimes(layers: list[Layer]) -> list[TensorLife]:
    """Execution order = list order; the first layer reads the network input and the last one's output is
    the network output (neither planned). An "inplace" layer may reuse an input, "alias" is a view."""
    steps = [
        Step(inputs=inputs or ("input",), output=name, sharing=SHARING[kind])
        for name, _, inputs, kind in layers
    ]
    nbytes = {"input": 4 * 3 * 224 * 224} | {name: 4 * elems for name, elems, _, _ in layers}
    return tensor_lives(steps, nbytes, frozenset({"input", layers[-1][0]}))


def resnet18() -> list[Layer]:
    layers: list[Layer] = [("stem", 64 * 112 * 112, (), "op"), ("pool", 64 * 56 * 56, ("stem",), "op")]
    x, c, hw = "pool", 64, 56
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            oh = hw // stride
            p = f"s{stage}b{block}"
            short = x
            if stride != 1 or c != width:
                layers.append((f"{p}down", width * oh * oh, (x,), "op"))
                short = f"{p}down"
            layers.append((f"{p}a", width * oh * oh, (x,), "op"))
            layers.append((f"{p}b", width * oh * oh, (f"{p}a",), "op"))
            layers.append((f"{p}add", width * oh * oh, (f"{p}b", short), "inplace"))  # add + relu
            x, c, hw = f"{p}add", width, oh
    layers += [("gap", 512, (x,), "op"), ("flat", 512, ("gap",), "alias"), ("fc", 1000, ("flat",), "op")]
    return layers


def mobilenet_v2() -> list[Layer]:
    layers: list[Layer] = [("stem", 32 * 112 * 112, (), "op")]
    x, c, hw = "stem", 32, 112
    for bi, (t, width, n, s) in enumerate(INVERTED_RESIDUALS):
        for i in range(n):
            stride = s if i == 0 else 1
            oh, p, inp = hw // stride, f"b{bi}_{i}", x
            if t != 1:
                layers.append((f"{p}e", c * t * hw * hw, (x,), "op"))
                inp = f"{p}e"
            layers.append((f"{p}dw", c * t * oh * oh, (inp,), "op"))
            layers.append((f"{p}pr", width * oh * oh, (f"{p}dw",), "op"))
            out = f"{p}pr"
            if stride == 1 and c == width:
                layers.append((f"{p}add", width * oh * oh, (out, x), "inplace"))
                out = f"{p}add"
            x, c, hw = out, width, oh
    layers += [("head", 1280 * 49, (x,), "op"), ("gap", 1280, ("head",), "op")]
    layers += [("flat", 1280, ("gap",), "alias"), ("fc", 1000, ("flat",), "op")]
    return layers


def chain(sizes: list[int]) -> list[Layer]:
    return [(f"t{i}", size, (f"t{i - 1}",) if i else (), "op") for i, size in enumerate(sizes)]


def assert_valid(tensors: list[TensorLife], plan: MemoryPlan) -> None:
    """No two tensors alive at the same step overlap unless they share storage by alias/in-place."""
    by_name = {t.name: t for t in tensors}
    shared = {(t.name, t.alias_of or t.in_place_of) for t in tensors if t.alias_of or t.in_place_of}
    for t in tensors:
        off = plan.offset(t.name)
        assert off % ALIGN == 0 and off + t.nbytes <= plan.workspace_bytes
    for a in tensors:
        for b in tensors:
            if a.name >= b.name or (a.name, b.name) in shared or (b.name, a.name) in shared:
                continue
            if a.produced <= b.last_read and b.produced <= a.last_read:
                oa, ob = plan.offset(a.name), plan.offset(b.name)
                assert oa + a.nbytes <= ob or ob + b.nbytes <= oa, (a, b, oa, ob)
    assert plan.workspace_bytes >= plan.lower_bound
    assert plan.lower_bound >= max(t.nbytes for t in by_name.values())


def random_tensors(rng: random.Random) -> list[TensorLife]:
    steps = rng.randrange(1, 40)
    tensors = []
    for i in range(rng.randrange(1, 60)):
        first = rng.randrange(steps)
        tensors.append(
            TensorLife(
                name=f"t{i}",
                nbytes=rng.choice([rng.randrange(1, 200), rng.randrange(1, 1 << 20)]),
                produced=first,
                last_read=min(steps - 1, first + int(rng.expovariate(0.3))),
            )
        )
    return tensors


@pytest.mark.parametrize("seed", range(300))
def test_random_lifetimes_never_overlap(seed: int) -> None:
    tensors = random_tensors(random.Random(seed))
    assert_valid(tensors, plan_memory(tensors))


@pytest.mark.parametrize("layers", [resnet18(), mobilenet_v2()], ids=["resnet18", "mobilenet_v2"])
def test_networks_within_ten_percent_of_the_bound(layers: list[Layer]) -> None:
    tensors = lifetimes(layers)
    plan = plan_memory(tensors)
    assert_valid(tensors, plan)
    assert plan.workspace_bytes <= 1.10 * plan.lower_bound, (plan.workspace_bytes, plan.lower_bound)
    assert plan.workspace_bytes < plan.intermediate_bytes / 3  # reuse is the point
    # The residual adds ran in place of their conv output: same offset, no extra buffer.
    add = next(t for t in tensors if t.in_place_of and t.name.endswith("add"))
    assert add.in_place_of is not None and plan.offset(add.name) == plan.offset(add.in_place_of)
    assert plan.offset("flat") == plan.offset("gap")


@pytest.mark.parametrize("seed", range(20))
def test_chains_within_ten_percent_of_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randrange(1000, 100_000)
    sizes = []
    for _ in range(rng.randrange(2, 30)):  # CNN-like: sizes halve, stay, or double step to step
        size = max(1000, int(size * rng.choice([0.5, 1, 1, 2])))
        sizes.append(size)
    tensors = lifetimes([*chain(sizes), ("out", 1, (f"t{len(sizes) - 1}",), "op")])
    plan = plan_memory(tensors)
    assert_valid(tensors, plan)
    assert plan.workspace_bytes <= 1.10 * plan.lower_bound, (sizes, plan)


def test_in_place_only_when_the_input_dies_at_that_step() -> None:
    tensors = [
        TensorLife(name="a", nbytes=4096, produced=0, last_read=2),  # read again after the ReLU
        TensorLife(name="relu", nbytes=4096, produced=1, last_read=2, in_place_of="a"),
        TensorLife(name="b", nbytes=4096, produced=2, last_read=3),
        TensorLife(name="clip", nbytes=4096, produced=3, last_read=4, in_place_of="b"),
    ]
    plan = plan_memory(tensors)
    assert_valid(tensors, plan)
    assert plan.offset("relu") != plan.offset("a") and plan.offset("clip") == plan.offset("b")
    assert plan.lower_bound == 3 * 4096 and plan.intermediate_bytes == 4 * 4096


def test_an_alias_keeps_its_source_alive() -> None:
    """A view read late extends its source's storage: nothing may be placed over it meanwhile."""
    tensors = [
        TensorLife(name="x", nbytes=1000, produced=0, last_read=1),
        TensorLife(name="view", nbytes=1000, produced=1, last_read=4, alias_of="x"),
        TensorLife(name="y", nbytes=1000, produced=2, last_read=3),
    ]
    plan = plan_memory(tensors)
    assert_valid(tensors, plan)
    assert plan.offset("view") == plan.offset("x") != plan.offset("y")
    assert plan.lower_bound == 2000 and plan.intermediate_bytes == 2000
    assert plan.workspace_bytes == 2 * 1024


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([TensorLife(name="a", nbytes=4, produced=2, last_read=1)], "produced <= last_read"),
        ([TensorLife(name="a", nbytes=0, produced=0, last_read=1)], "nbytes > 0"),
        ([TensorLife(name="a", nbytes=4, produced=0, last_read=0)] * 2, "twice"),
        ([TensorLife(name="a", nbytes=4, produced=0, last_read=1, alias_of="in")], "not an intermediate"),
    ],
)
def test_inconsistent_lifetimes_are_input_errors(tensors: list[TensorLife], message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan_memory(tensors)


def test_empty_network_needs_no_workspace() -> None:
    assert plan_memory([]) == MemoryPlan(offsets=(), workspace_bytes=0, lower_bound=0, intermediate_bytes=0)


def test_lifetimes_from_steps() -> None:
    """The sharing rule from an execution order: an Add overwrites the input that dies there (not the
    residual that lives on), a Flatten aliases its source, network inputs and outputs are not planned."""
    steps = [
        Step(inputs=("in",), output="a"),
        Step(inputs=("a",), output="b"),
        Step(inputs=("a", "b"), output="sum", sharing=Sharing.IN_PLACE),  # a is read again below
        Step(inputs=("sum", "a"), output="cat"),
        Step(inputs=("cat",), output="flat", sharing=Sharing.ALIAS),
        Step(inputs=("flat",), output="out"),
    ]
    nbytes = {"in": 64, "a": 400, "b": 400, "sum": 400, "cat": 800, "flat": 800, "out": 40}
    lives = {t.name: t for t in tensor_lives(steps, nbytes, frozenset({"in", "out"}))}
    assert sorted(lives) == ["a", "b", "cat", "flat", "sum"]
    assert lives["sum"].in_place_of == "b" and lives["flat"].alias_of == "cat"
    assert (lives["a"].produced, lives["a"].last_read, lives["flat"].last_read) == (0, 3, 5)
    with pytest.raises(InputError, match="external"):
        tensor_lives([Step(inputs=("in",), output="out", sharing=Sharing.ALIAS)], nbytes, frozenset({"in"}))

"""The operator families by name: text such as "matmul:m=512,n=512,k=512" in, its family's canonical
`Workload` out (`parse_workload`); a workload's template (`template_for`), the feature set that describes
a template's configs (`features_of`, `FEATURE_SETS`), and the family that runs an ONNX node (`anchor_of`).
A network's other nodes map to the generated operators of NODE_FAMILIES (`node_family`), whose kernels
are all `xtune.ops.opkit.GeneratedOp`s. Adding an operator is one family module and one entry in FAMILIES
(tunable) or NODE_FAMILIES (generated)."""

from __future__ import annotations

from functools import cache

from xtune.errors import InputError, UnsupportedNode
from xtune.graph import Graph, Node
from xtune.ops import (
    activation,
    arith,
    bmm,
    concat,
    elementwise,
    lrn,
    pad,
    pool2d,
    qpointwise,
    quantize,
    reduce,
    reshape,
    resize,
    slice,
    softmax,
    split,
    transpose,
)
from xtune.ops.anchor import Anchor
from xtune.ops.conv2d import Conv2d
from xtune.ops.depthwise import Depthwise
from xtune.ops.family import Family
from xtune.ops.featurize import FeatureSet
from xtune.ops.matmul import Matmul
from xtune.ops.opkit import NodeFamily
from xtune.ops.qconv2d import QConv2d
from xtune.ops.qdepthwise import QDepthwise
from xtune.ops.qmatmul.operator import QMatmul
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Workload, make_workload
from xtune.target import Target

FAMILIES: tuple[Family, ...] = (Matmul(), Conv2d(), Depthwise(), QMatmul(), QConv2d(), QDepthwise())
OPERATORS: dict[str, Family] = {f.name: f for f in FAMILIES}
FEATURE_SETS: dict[str, FeatureSet] = {fs.name: fs for f in FAMILIES for fs in f.feature_sets}
ANCHOR_OPS = frozenset(op for f in FAMILIES for op in f.onnx_ops)  # the ONNX op types tasks come from

NODE_FAMILIES: tuple[NodeFamily, ...] = (
    pool2d.FAMILY,
    elementwise.FAMILY,
    reshape.FAMILY,
    softmax.FAMILY,
    concat.FAMILY,
    transpose.FAMILY,
    activation.FAMILY,
    arith.FAMILY,
    reduce.FAMILY,
    lrn.FAMILY,
    pad.FAMILY,
    slice.FAMILY,
    split.FAMILY,
    quantize.FAMILY,
    qpointwise.FAMILY,
    resize.FAMILY,
    bmm.FAMILY,
)
_BUILT = {op: f for f in NODE_FAMILIES for op in f.onnx_ops}


def family(name: str) -> Family:
    return OPERATORS[name]


def parse_workload(text: str) -> Workload:
    """Parse "OP:key=value,..." into a canonical Workload, or raise InputError naming the problem."""
    op_name, _, rest = text.partition(":")
    if op_name not in OPERATORS:
        raise InputError(f"unknown operator {op_name!r} in workload {text!r} (known: {', '.join(OPERATORS)})")
    return make_workload(OPERATORS[op_name], rest, text)


@cache
def template_for(workload: Workload, target: Target) -> ScheduleTemplate:
    """The schedule template of `workload` on `target`: its family's pick."""
    return OPERATORS[workload.op].template(workload, target)


def features_of(template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
    """The feature set (and cost models, and estimate) that describes `template`'s configs, and the
    template whose configs it reads."""
    return OPERATORS[template.workload.op].features(template)


def anchor_of(graph: Graph, node: Node) -> Anchor | None:
    """The kernel call of a node whose op type is in ANCHOR_OPS, from the first family that claims it;
    None when none does and a generated operator family builds its op type (a MatMul whose B has
    batch axes)."""
    for f in FAMILIES:
        if node.op in f.onnx_ops and (anchor := f.anchor(graph, node)) is not None:
            return anchor
    if node_family(node.op) is not None:
        return None
    raise UnsupportedNode(graph.name, node.name, node.op, "no operator family runs it")


def node_family(op: str) -> NodeFamily | None:
    """The generated operator family that builds ONNX op type `op`, None if there is none."""
    return _BUILT.get(op)

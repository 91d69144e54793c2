"""The operator family protocol: what one tunable operator (matmul, conv2d, depthwise) owns, from its
workload keys to its ONNX mapping, template, features and the layouts a network runs it in. The registry
(xtune/ops/registry.py) finds families by name; nothing outside a family asks which operator it is."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor
from xtune.ops.featurize import FeatureSet
from xtune.ops.layout import Layout
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Inits, Operator, ParamValue, Workload
from xtune.target import Target

if TYPE_CHECKING:
    import onnx


class Family(Operator, Protocol):
    """A tunable operator: its workload (keys, defaults, validation, tensors, reference, flops: the
    `Operator` half a Workload carries), and:

    - `template`: the schedule template of a workload on a target (a family with several algorithms or
      layouts picks among its own templates from the workload's keys);
    - `features`: the feature set that describes a template's configs, and the template whose configs
      it reads (a pointwise conv2d's are its matmul's); `feature_sets` lists every set it can answer;
    - `onnx_ops` and `anchor`: the ONNX op types it maps, and a node of the network IR as its kernel
      call (None: the node is another family's, e.g. a grouped Conv); `task_key` the workload a call
      is tuned as, in the layout it runs in; `task_weights` its ONNX weights in that workload's layout;
      `onnx_nodes` the other way: a workload as ONNX nodes (the ONNX Runtime peer, tuning/peers.py);
    - `layouts`: the layouts a network may run it in (else NCHW, with conversions around it)."""

    onnx_ops: ClassVar[tuple[str, ...]]
    layouts: ClassVar[frozenset[Layout]]
    feature_sets: ClassVar[tuple[FeatureSet, ...]]

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate: ...
    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]: ...
    def anchor(self, graph: Graph, node: Node) -> Anchor | None: ...
    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str: ...
    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray: ...
    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]: ...

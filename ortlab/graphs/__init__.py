"""ORTModule's exported graphs, stage by stage: what each stage holds, what it changed, where a node sits.

With `save_onnx` ORTModule writes `PREFIX_STAGE_MODE.onnx` for every stage it builds: torch_exported,
post_processed, optimized_pre_grad (training only), optimized and execution_model, per mode (training,
inference). `ortlab.graphs.load(run_or_folder)` (also `ortlab.load_graphs`) reads any folder of such files,
made by ortlab or not. Importing this package imports neither onnx, pandas nor matplotlib.

Modules: names (what node names say), stage (one stage read), diff (stage a
-> b), neighbourhood and svg (where a node sits, drawn), figures (matplotlib charts), collection (`Graphs`,
`load`), netron (netron served inline), ranks (the ranks' graphs compared, in words); which files are stages
is ortlab.runs.stages. No public name below equals a module's name.
"""

from ortlab.graphs.collection import Graphs, load
from ortlab.graphs.diff import StageDiff, diff_stages
from ortlab.graphs.errors import GraphsError
from ortlab.graphs.names import KINDS, module_scope, node_kind, op_key
from ortlab.graphs.neighbourhood import Neighbourhood
from ortlab.graphs.netron import NetronError, NetronServer, netron_status, serve, stop_all
from ortlab.graphs.stage import Node, Stage
from ortlab.runs.stages import MODES, STAGES, StageFile, find_stage_files

__all__ = ["KINDS", "MODES", "STAGES", "Graphs", "GraphsError", "Neighbourhood", "NetronError",
           "NetronServer", "Node", "Stage", "StageDiff", "StageFile", "diff_stages", "find_stage_files",
           "load", "module_scope", "netron_status", "node_kind", "op_key", "serve", "stop_all"]

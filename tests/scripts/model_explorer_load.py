"""Load an ONNX stage file and ortlab's node-data JSON the way Google Model Explorer does, in a process whose
PYTHONPATH has Model Explorer's side folder first: its ONNX adapter (model-explorer-onnx) converts the graph, its
node_data_builder classes take the JSON, its config builds the URL its UI opens. Prints what the test checks, as
JSON: the graph ids, the node ids the data names that the graph lacks, and one node's value."""

import json
import sys

from model_explorer import config
from model_explorer.node_data_builder import GradientItem, GraphNodeData, ModelNodeData, NodeDataResult, ThresholdItem
from model_explorer_onnx.main import ONNXAdapter

stage, data_path, node = sys.argv[1:4]
graphs = ONNXAdapter().convert(stage, {})["graphs"]
ids = {g.id: {n.id for n in g.nodes} for g in graphs}
with open(data_path, encoding="utf-8") as f:
    raw = json.load(f)
model = ModelNodeData(graphsData={
    graph: GraphNodeData(results={k: NodeDataResult(**v) for k, v in d["results"].items()},
                         gradient=[GradientItem(**g) for g in d.get("gradient", [])],
                         thresholds=[ThresholdItem(**t) for t in d.get("thresholds", [])])
    for graph, d in raw.items()})
again = json.loads(model.to_json_string())  # what Model Explorer serves to its UI
url = config().add_model_from_path(stage).add_node_data_from_path(data_path).to_url_param_value()
graph = next(iter(again))
print(json.dumps({"graphs": sorted(ids), "data_graphs": sorted(again),
                  "missing": sorted(set(again[graph]["results"]) - ids.get(graph, set())),
                  "value": again[graph]["results"].get(node, {}).get("value"), "url": url}))

"""The order ORT executes an execution model in (onnxruntime-training 1.19.2, read off its source).

ORTModule picks ExecutionOrder.DEFAULT, unless the memory optimizer or memory-efficient gradient management is
on: then MEMORY_EFFICIENT. ORT saves the execution model in its DEFAULT order (`Graph::ToGraphProto` walks
`GraphViewer::GetNodesInTopologicalOrder()`), so DEFAULT is the file's node order, exactly.

MEMORY_EFFICIENT (`Graph::MemoryEfficientTopologicalSort`) is rebuilt here: the forward nodes by a reverse DFS
from the YieldOp's inputs (longest path from the graph's roots first), Shape/Size right after their parent;
then the backward nodes by Kahn's algorithm from the YieldOp, where each "branch" subgraph (nodes that need
only forward values, such as the recompute nodes a plan adds) runs just before the first backward node that
needs it. ORT breaks ties by its in-memory node index, which the file does not keep; the file position stands
in for it, so independent nodes may swap places against ORT's run, dependent ones never do.
"""

from __future__ import annotations

from collections import deque

from ortlab.account.graph import ExecGraph

ORDERS = ("default", "memory_efficient")


def _edges(g: ExecGraph) -> tuple[list[list[tuple[int, int, int]]], list[list[tuple[int, int, int]]]]:
    """ORT's edge sets: per node, (other node, src output slot, dst input slot), ordered as EdgeEndCompare."""
    producer = {t: (i, k) for i, outs in enumerate(g.outputs) for k, t in enumerate(outs) if t}
    ins: list[list[tuple[int, int, int]]] = []
    outs: list[list[tuple[int, int, int]]] = [[] for _ in g.names]
    for c, names in enumerate(g.inputs):
        edges = sorted({(*producer[t], j) for j, t in enumerate(names) if t in producer})
        ins.append(edges)
        for p, k, j in edges:
            outs[p].append((c, k, j))
    for e in outs:
        e.sort()
    return ins, outs


def execution_order(g: ExecGraph, kind: str) -> tuple[list[int], str]:
    """Node positions in the order ORT runs them, and the order used: `default` when asked, or when the graph
    has no single YieldOp (ORT too sorts a graph without one by default)."""
    yields = [i for i, op in enumerate(g.ops) if op == "YieldOp"]
    if kind == "memory_efficient" and len(yields) == 1:
        order = _memory_efficient(g, yields[0])
        if order is not None:
            return order, kind
    return list(range(len(g))), "default"


def _max_distance(n: int, ins, outs) -> list[int]:
    degree = [len(e) for e in ins]
    queue = deque(i for i in range(n) if not degree[i])
    dist = [0] * n
    while queue:
        cur = queue.popleft()
        for c, _, _ in outs[cur]:
            dist[c] = max(dist[c], dist[cur] + 1)
            degree[c] -= 1
            if not degree[c]:
                queue.append(c)
    return dist


def _forward(g: ExecGraph, y: int, ins, outs) -> list[int]:
    """SortForwardNodesByReverseDFS: post-order DFS from the YieldOp's producers, farthest input first."""
    n = len(g)
    dist = _max_distance(n, ins, outs)
    visited = bytearray(n)
    order: list[int] = []
    stack = [(p, False) for p, _, _ in ins[y]]
    while stack:
        node, leave = stack.pop()
        if leave:
            order.append(node)
            continue
        if visited[node]:
            continue
        visited[node] = 1
        stack.append((node, True))
        for m in sorted((p for p, _, _ in ins[node]), key=lambda m: (dist[m], m)):
            if not visited[m]:
                stack.append((m, False))
    forward = set(order)
    parents: dict[int, list[int]] = {}
    for i, op in enumerate(g.ops):
        if op in ("Shape", "Size") and ins[i]:
            parents.setdefault(ins[i][0][0], []).append(i)
    for parent, children in parents.items():
        if parent not in forward:
            continue
        for child in children:
            if child not in forward:
                order.insert(order.index(parent) + 1, child)
                forward.add(child)
    return order


class _Group:
    """A branch subgraph's nodes with one set of associated outputs (ORT's GroupNode)."""

    __slots__ = ("done", "inputs", "nodes", "outputs")

    def __init__(self, g: ExecGraph, nodes: list[int], outs) -> None:
        self.nodes, self.done = nodes, False
        members = set(nodes)
        produced: set[str] = set()
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        for i in nodes:
            self.inputs += [t for t in g.inputs[i] if t not in produced]
            produced.update(g.outputs[i])
            if not outs[i]:
                self.outputs += list(g.outputs[i])
            else:
                self.outputs += [g.outputs[i][k] for c, k, _ in outs[i] if c not in members]


def _memory_efficient(g: ExecGraph, y: int) -> list[int] | None:
    n = len(g)
    ins, outs = _edges(g)
    order = _forward(g, y, ins, outs)
    forward = set(order)
    degree = [0] * n
    branch_inputs: list[int] = []
    for i in range(n):
        if i in forward or i == y:
            continue
        degree[i] = sum(1 for p, _, _ in ins[i] if p not in forward)
        if not degree[i]:
            branch_inputs.append(i)
    # FindBranchGraph: everything that runs on forward values and graph inputs alone
    left = degree[:]
    branch = list(branch_inputs)
    queue = deque(branch_inputs)
    while queue:
        cur = queue.popleft()
        for c, _, _ in outs[cur]:
            left[c] -= 1
            if not left[c]:
                queue.append(c)
                branch.append(c)
    members = set(branch)
    ends: list[str] = []
    consumers: list[int] = []
    for i in branch:
        if not outs[i]:
            ends += list(g.outputs[i])
            continue
        for c, k, _ in outs[i]:
            if c not in members:
                consumers.append(c)
                ends.append(g.outputs[i][k])
    # TagNodeToAssociatedOutputs: group branch nodes by the branch outputs they feed
    producer = {t: i for i, names in enumerate(g.outputs) for t in names if t}
    tags: dict[int, set[str]] = {}
    for arg in ends:
        stack, seen = [producer[arg]], set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            tags.setdefault(node, set()).add(arg)
            stack += [p for p, _, _ in ins[node] if p not in forward and p not in seen]
    grouped: dict[frozenset, list[int]] = {}
    for i in branch:
        grouped.setdefault(frozenset(tags.get(i, ())), []).append(i)
    group_of: dict[str, _Group] = {}
    for nodes in grouped.values():
        group = _Group(g, nodes, outs)
        for arg in group.outputs:
            group_of.setdefault(arg, group)
    for c in consumers:
        degree[c] -= 1

    def emit(arg: str) -> None:
        group = group_of[arg]
        if group.done:
            return
        for a in group.inputs:
            if a and a in group_of and not group_of[a].done:
                emit(a)
        order.extend(group.nodes)
        group.done = True

    queue = deque([y])
    while queue:
        cur = queue.popleft()
        for _, _, j in ins[cur]:
            arg = g.inputs[cur][j]
            if arg in group_of and not group_of[arg].done:
                emit(arg)
        order.append(cur)
        for c, _, _ in outs[cur]:
            degree[c] -= 1
            if not degree[c]:
                queue.append(c)
    for arg in sorted(a for a, grp in group_of.items() if not grp.done):
        emit(arg)
    if len(order) != n or len(set(order)) != n:
        return None  # a graph ORT itself would refuse to sort ("Topological sort failed")
    return order

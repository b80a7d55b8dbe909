"""ORT's and the exporter's error text, read: the part a person reads first (operator, node, dtype), the C++
location after it.

ORT prefixes its messages with the C++ file, line and a function signature that can run to 300 characters
("/onnxruntime_src/...cc:543 onnxruntime::python::...<lambda(...)> [ONNXRuntimeError] : 10 : INVALID_GRAPH :
This is an invalid model. Type Error: ..."); the reason is at the end. This reads the public text only.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from ortlab import _ort
from ortlab.common.readable import sentence

_LOCATION = re.compile(r"/onnxruntime_src/(?P<file>[\w/.\-]+\.(?:cc|h|cpp)):(?P<line>\d+)")
_ORT_STATUS = re.compile(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*(?P<code>[A-Z_]+)\s*:\s*(?P<rest>.*)", re.S)
_ENFORCE = re.compile(r" was false\.\s*(?P<rest>.*)", re.S)

# ORT's training kernels of GRU and LSTM (CPU only) say this of a bidirectional or reverse layer
FORWARD_ONLY = "kernel only supports the forward direction"

# (pattern, what it names): the first that matches gives op, node and dtype
_SHAPES = (
    re.compile(r"Type Error: Type '(?P<dtype>[^']+)' of input parameter \((?P<input>[^)]*)\) of operator "
               r"\((?P<op>[^)]+)\) in node \((?P<node>[^)]*)\)"),
    re.compile(r"Could not find an implementation for (?P<op>\w+)\(\d+\) node with name '(?P<node>[^']*)'"),
    re.compile(r"The gradient builder has not been registered: (?P<op>\w+) for node (?P<node>\S*)"),
    re.compile(r"Exporting the operator '(?P<op>[\w:.]+)' to ONNX opset version (?P<opset>\d+) is not supported"),
    re.compile(r"(?P<op>GRU|LSTM)(?:Training)? and \w+ kernel only supports the forward direction"),
    re.compile(r"Node \((?P<node>[^)]*)\) Op \((?P<op>[^)]+)\)"),
    re.compile(r"[Nn]ode (?P<node>/\S+?)[:,]? .*?\bop(?:erator)? (?:type )?'?(?P<op>[A-Z]\w+)"),
    re.compile(r"for node:? (?P<node>/\S+)"),  # the graph builder: "... does not exist:<name>for node: /m/Loop"
)


@dataclass(frozen=True)
class ReadError:
    """One error message, read."""

    message: str  # the readable part, one line
    op: str | None = None
    node: str | None = None
    dtype: str | None = None
    code: str | None = None  # ORT's status name (INVALID_GRAPH, NOT_IMPLEMENTED, ...)
    location: str | None = None  # ORT's C++ file:line

    def line(self) -> str:
        """One line: what failed (op, node, dtype), then the message, then ORT's code and C++ location."""
        lead = ", ".join(x for x in (self.op and f"op {self.op}", self.dtype and f"dtype {self.dtype}",
                                     self.node and f"node {self.node}") if x)
        tail = " ".join(x for x in (self.code, self.location and f"at {self.location}") if x)
        subject = self.op or self.node  # the message may name it already
        text = f"{lead}: {self.message}" if lead and not (subject and subject in self.message) else self.message
        return f"{text} (ORT {tail})" if tail else text


def read_error(text: str) -> ReadError:
    """The readable part of an exporter or ORT error message, with the operator, node and dtype it names."""
    text = str(text).strip()
    location = None
    if m := _LOCATION.search(text):
        location = f"{m['file'].rsplit('/', 1)[-1]}:{m['line']}"
    code = None
    body = text
    if m := _ORT_STATUS.search(text):
        code, body = m["code"], m["rest"]
    if m := _ENFORCE.search(body):
        body = m["rest"]
    elif location and body is text and (where := _LOCATION.search(text)):  # an ORT_THROW: the signature ends
        body = _after_signature(text[where.end():])  # where the message starts
    body = " ".join(body.split())
    op = node = dtype = None
    for pattern in _SHAPES:
        if m := pattern.search(body):
            found = m.groupdict()
            op, node, dtype = found.get("op"), found.get("node") or None, found.get("dtype")
            break
    return ReadError(body or text, op, node, dtype, code, location)


def _after_signature(rest: str) -> str:
    """What follows a C++ function signature (balanced parentheses, then the message)."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
            if depth == 0 and i + 1 < len(rest) and rest[i + 1] == " ":
                tail = rest[i + 2:]
                if not tail.startswith(("const", "[with", "&", "*")):
                    return tail
    return rest


def readable(text: str) -> str:
    """`read_error(text).line()`: an error in one line, the readable part first."""
    return read_error(text).line()


def failure_stage(exc: BaseException) -> str | None:
    """Where inside ORTModule an exception came from, named from the deepest ORT frames of its traceback."""
    frames: list[traceback.FrameSummary] = []
    seen = set()
    first = exc
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        frames += traceback.extract_tb(link.__traceback__)
        link = link.__cause__ or link.__context__
    names = [(f.filename, f.name) for f in frames if "onnxruntime" in f.filename]
    for needle, stage in _ort.FAILURE_STAGES:
        hits = [(file, name) for file, name in names if needle in file or name == needle]
        if hits:
            if (node := _ort.failing_node(first)) is not None:
                return f"{stage} (inferring {node[1]} node {node[0]})"
            infer = [name for _, name in names if name.startswith("_infer_") and name not in _NOT_AN_OP]
            return stage + (f" (inferring a {infer[-1].removeprefix('_infer_')} node)" if infer else "")
    return None


_NOT_AN_OP = ("_infer_impl", "_infer_shapes")  # shape inference's own steps, not an operator's _infer_<op>


def root_message(exc: BaseException | None) -> str:
    """The innermost cause's first line: ORT wraps the real reason in several layers of exceptions (an
    exception raised `from None` is its own root)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None:
            break
        exc = nxt
    if exc is None:
        return ""
    text = str(exc).strip()
    if (inner := _embedded_error(text)) is not None:  # ORT quotes the exporter's whole traceback in its message
        return inner
    first = readable(text) if "onnxruntime" in text or "ONNXRuntimeError" in text else sentence(text)
    if (explained := _EXPLANATION.search(text)) is not None:  # torch 2.7+'s dynamo explains on a later line
        first = f"{first.rstrip(':')}: {explained[1].strip()}"
    return f"{type(exc).__name__}: {first}".strip().rstrip(":")


_EXPLANATION = re.compile(r"^\s+Explanation: (.+)$", re.M)
_PYTORCH_PLEA = re.compile(r"\s*Please feel free to request support or submit a pull request on PyTorch GitHub:?\s*\S*")
_QUOTED_ERROR = re.compile(r"^(?:[\w.]+\.)?(?P<type>\w*(?:Error|Exception)): (?P<message>.+)$")


def _embedded_error(text: str) -> str | None:
    """The last "SomeError: message" line of a traceback quoted inside an exception's message, if there is one."""
    if "Traceback (most recent call last)" not in text:
        return None
    found = [m for line in text.splitlines() if (m := _QUOTED_ERROR.match(line.strip()))]
    if not found:
        return None
    message = _PYTORCH_PLEA.sub("", found[-1]["message"]).strip()
    if "onnxruntime" in message or "ONNXRuntimeError" in message:
        message = readable(message)
    return f"{found[-1]['type']}: {message}"


def fallback_record(error: BaseException, step: int | None) -> dict[str, object]:
    """What a run records of ORTModule's fallback to PyTorch: where (the stage, and the step it happened by),
    why (the readable reason), and the operator, node and dtype ORT's message names."""
    reason = root_message(error)
    read = read_error(reason)
    return {"step": step, "stage": failure_stage(error) or "ORTModule", "reason": reason,
            "exception": type(error).__name__, "op": read.op, "node": read.node, "dtype": read.dtype}

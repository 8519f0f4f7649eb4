"""The expression language of metrics' `where` and `fields` (rule 10 in docs/semantics.md):
parsed and type-checked once (`compile_definitions`), evaluated by each layer natively (the
speed layer through generated Python, `pycode`; the batch layer through Spark columns)."""

from shared.expressions.constants import null_fields
from shared.expressions.definitions import Definitions, compile_definitions, split_path
from shared.expressions.evaluate import MISSING, from_json, read_path
from shared.expressions.parse import ExpressionError
from shared.expressions.pycode import Emitter, compile_node
from shared.expressions.syntax import Kind, Node, Scalar

__all__ = [
    "MISSING",
    "Definitions",
    "Emitter",
    "ExpressionError",
    "Kind",
    "Node",
    "Scalar",
    "compile_definitions",
    "compile_node",
    "from_json",
    "null_fields",
    "read_path",
    "split_path",
]

"""What is wrong with an expression sqlglot cannot parse, and what to write, in the config's
words rather than the parser's (its node classes, its tokenizer's state)."""

from __future__ import annotations

import re

_OPERATORS = {
    "GT": ">",
    "GTE": ">=",
    "LT": "<",
    "LTE": "<=",
    "EQ": "=",
    "NEQ": "<>",
    "And": "AND",
    "Or": "OR",
    "Add": "+",
    "Sub": "-",
    "Mul": "*",
    "Div": "/",
    "Mod": "%",
    "Like": "LIKE",
    "ILike": "ILIKE",
    "DPipe": "||",
    "Not": "NOT",
    "Neg": "-",
}
"""sqlglot's node names of the operators an expression may hold, as written."""
_MISSING = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")
"""sqlglot's error for a node lacking an operand: the operand, the node's class."""
_PROBLEMS = {
    "Expecting )": "a '(' is not closed: expected ')'",
    "Invalid expression / Unexpected token": (
        "unexpected text: two values need an operator between them (AND, OR, =, +, ...), "
        "or a ')' is one too many"
    ),
    "Expected END after CASE": "incomplete CASE: write CASE WHEN <condition> THEN <value> "
    "[ELSE <value>] END",
    "Expected TYPE after CAST": "incomplete CAST: write CAST(<value> AS BIGINT|DOUBLE|STRING|"
    "BOOLEAN)",
}


def parse_problem(description: str) -> str:
    """What is wrong with an expression sqlglot cannot parse, and what to write, in the
    config's words rather than the parser's (its node classes)."""
    if description in _PROBLEMS:
        return _PROBLEMS[description]
    missing = _MISSING.search(description)
    if missing is None:
        return f"cannot parse: {description}"
    node = missing.group(2)
    if node in _OPERATORS:
        return f"incomplete expression: expected a value after {_OPERATORS[node]!r}"
    if node == "Between":
        return "incomplete BETWEEN: write <value> BETWEEN <low> AND <high>"
    if node == "Column":
        return "incomplete field name: expected a name after '.'"
    return "incomplete function call: an argument is missing, or its ')' is"


def token_problem(text: str) -> str:
    """Why sqlglot's tokenizer refused `text`: most often a quote left open."""
    for quote, what in (("'", "string"), ('"', "quoted field name")):
        if text.count(quote) % 2:
            return f"a {what} is not closed: expected a closing {quote}"
    return "cannot read the text as an expression (a character no expression holds?)"

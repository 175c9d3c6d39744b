"""`calculator`: exact integer/decimal arithmetic on an expression (+ - * / // % ** and
parentheses), evaluated on its syntax tree, never with eval()."""

from __future__ import annotations

import ast
import operator

from dagrl.tools.base import Tool, register_tool

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPONENT = 64  # 9**9**9 would hang the worker thread


def evaluate(expr: str) -> int | float:
    """The value of an arithmetic expression; ValueError on anything else."""
    return _eval(ast.parse(expr.strip(), mode="eval").body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _OPS[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")


@register_tool("calculator")
def calculator_tool() -> Tool:
    def calculate(expression: str) -> str:
        value = evaluate(expression)
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    return Tool(
        "calculator",
        calculate,
        "Evaluate an arithmetic expression exactly.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 345+678"}},
            "required": ["expression"],
        },
    )

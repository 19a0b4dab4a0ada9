"""`calculator`: safe arithmetic by walking a parsed `ast`, never `eval`.

Only numbers, `+ - * / // % **` (and `^` as power), unary signs, parentheses, a few
constants and `math` functions are accepted. Sizes are bounded (expression length,
integer bits, exponents) so `9**9**9**9` is refused at once instead of hanging.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any, ClassVar

from orchestra.engine.tools.base import Tool, ToolContext, ToolError

MAX_EXPRESSION_LENGTH = 500
MAX_INT_BITS = 4096  # about 1233 decimal digits

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: float, ndigits: int = 0) -> float:
    if not isinstance(ndigits, int) or not 0 <= ndigits <= 15:
        raise ToolError("round() takes a whole number of digits between 0 and 15.")
    return round(x, ndigits) if ndigits else round(x)


# name: (function, minimum args, maximum args or None for any)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (math.log, 1, 2),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _check_size(value: Any) -> Any:
    if isinstance(value, complex):
        raise ToolError("The result is not a real number.")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError("The result is too large.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("The result is too large (or undefined).")
    return value


def _power(base: Any, exponent: Any) -> Any:
    """`base ** exponent`, refusing results too large to compute quickly."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_INT_BITS:
            raise ToolError("The result is too large.")
        return base**exponent
    try:
        return math.pow(base, exponent) if isinstance(base, float) else base**exponent
    except OverflowError:
        raise ToolError("The result is too large.") from None


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"Unsupported value: {node.value!r}.")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        return _binary(node)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ToolError(f"Unknown name: {node.id}.")
    if isinstance(node, ast.Call):
        return _call(node)
    raise ToolError(f"Unsupported syntax: {type(node).__name__}.")


def _binary(node: ast.BinOp) -> Any:
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow | ast.BitXor):
        return _check_size(_power(left, right))
    op = _BINARY.get(type(node.op))
    if op is None:
        raise ToolError(f"Unsupported operator: {type(node.op).__name__}.")
    if (
        isinstance(node.op, ast.Mult)
        and isinstance(left, int)
        and isinstance(right, int)
        and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1
    ):
        raise ToolError("The result is too large.")
    return _check_size(op(left, right))


def _call(node: ast.Call) -> Any:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
        raise ToolError(f"Unsupported function call. Available: {', '.join(FUNCTIONS)}.")
    fn, low, high = FUNCTIONS[node.func.id]
    if len(node.args) < low or (high is not None and len(node.args) > high):
        raise ToolError(f"Wrong number of arguments for {node.func.id}().")
    args = [_evaluate(a) for a in node.args]
    return _check_size(fn(*args))


def format_number(value: float) -> str:
    """Integers exactly; floats to 15 significant digits (so 0.1 + 0.2 gives 0.3)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".15g")
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result as text."""
    expression = expression.strip()
    if not expression:
        raise ToolError("The expression is empty.")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ToolError(f"The expression is longer than {MAX_EXPRESSION_LENGTH} characters.")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"Not a valid arithmetic expression: {expression}") from None
    try:
        return format_number(_evaluate(tree))
    except ZeroDivisionError:
        raise ToolError("Division by zero.") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        raise ToolError(f"Cannot compute {expression}: {err}") from None


class CalculatorTool(Tool):
    name = "calculator"
    description = (
        "Evaluate an arithmetic expression exactly. Supports numbers, + - * / // % and "
        "** (or ^) for powers, parentheses, the constants pi, e and tau, and the functions "
        + ", ".join(FUNCTIONS)
        + "."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": "The expression, e.g. (2 + 3) * sqrt(16) / 4",
            }
        },
        "required": ["expression"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return calculate(args["expression"])

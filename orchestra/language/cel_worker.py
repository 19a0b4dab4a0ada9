"""An expression worker process (`python -m orchestra.language.cel_worker MiB`).

Started by `sandbox.Sandbox`; evaluates one CEL expression at a time, read from stdin
as a length-prefixed JSON object `{source, values, max}`, and answers on stdout with
`{value}` or `{error}`; or checks a value against a JSON Schema (`{schema, value, root}`
→ `{value: violations}`). It runs at a lower priority (nice 10), so a worker busy until
its deadline takes CPU time from the server's requests only when they leave some. Its address space is capped at the given MiB, so a runaway
comprehension ends this process, never the server. It exits when stdin closes.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

HEAD = struct.Struct(">I")


def _cap_memory(mib: int) -> None:
    if mib > 0:
        limit = mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _answer(out: BinaryIO, message: dict[str, Any]) -> None:
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    out.write(HEAD.pack(len(body)) + body)
    out.flush()


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests until stdin closes."""
    from orchestra.language.expressions import ExpressionError, evaluate_values
    from orchestra.language.schemas import violations_anywhere

    out.write(b"R")
    out.flush()
    while True:
        head = inp.read(HEAD.size)
        if len(head) < HEAD.size:
            return
        request = json.loads(inp.read(HEAD.unpack(head)[0]))
        if "schema" in request:
            try:
                found = violations_anywhere(json.loads(request["schema"]), request["value"], request["root"])
            except MemoryError:
                sys.exit(3)
            _answer(out, {"value": found})
            continue
        source, limit = request["source"], int(request["max"])
        try:
            value = evaluate_values(source, request["values"])
            text = json.dumps({"value": value}, ensure_ascii=False, separators=(",", ":"))
            size = len(text.encode()) - len('{"value":}')
            if size > limit:
                _answer(out, {"error": f"gave {size} bytes of JSON; the limit is {limit} "
                                       "(ORCHESTRA_EXPRESSION_RESULT_MAX_BYTES)"})
                continue
            body = text.encode()
            out.write(HEAD.pack(len(body)) + body)
            out.flush()
        except ExpressionError as exc:
            _answer(out, {"error": exc.problem})
        except MemoryError:
            sys.exit(3)  # the parent reports the memory limit


def main() -> None:
    _cap_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    os.nice(10)  # a busy worker yields the CPU to the server's event loop
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing but answers on the protocol's pipe
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()

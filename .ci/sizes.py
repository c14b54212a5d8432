"""The size limits of the pack's code: no function over 60 lines, no module over 400 lines, and no
function over complexity 15 as radon counts it (each boolean operator a branch, which ruff's C90
does not count).

    python .ci/sizes.py        # prints each breach; exit status 1 when there is one
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("dgemma", "nodes", "runner", "mcp_server", "serve", "remote")
MAX_FUNCTION, MAX_MODULE, MAX_COMPLEXITY = 60, 400, 15


def breaches(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT)
    out = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE:
        out.append(f"{where}: {lines} lines (module limit {MAX_MODULE})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION:
                out.append(f"{where}:{node.lineno}: {node.name} is {length} lines (function limit {MAX_FUNCTION})")
    return out + too_complex(text, where)


def too_complex(text: str, where) -> list[str]:
    """Functions (methods and closures too) above MAX_COMPLEXITY, as `radon cc` scores them."""
    try:
        from radon.complexity import cc_visit
        from radon.visitors import Function
    except ImportError:
        sys.exit("sizes: the complexity check needs radon: pip install -r requirements-dev.txt")
    found, blocks = [], list(cc_visit(text))
    while blocks:
        block = blocks.pop()
        blocks += getattr(block, "closures", [])
        if isinstance(block, Function) and block.complexity > MAX_COMPLEXITY:
            found.append(f"{where}:{block.lineno}: {block.fullname} has complexity {block.complexity} "
                         f"(limit {MAX_COMPLEXITY})")
    return sorted(found)


def main() -> int:
    found = [b for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) for b in breaches(p)]
    print("\n".join(found) if found else
          f"sizes: every function <= {MAX_FUNCTION} lines and complexity <= {MAX_COMPLEXITY}, every module <= "
          f"{MAX_MODULE} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

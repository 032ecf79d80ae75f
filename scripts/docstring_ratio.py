"""Docstring lines per code line of Python files (issue 30 §5), measured with ast.

    python scripts/docstring_ratio.py lmprog/runtime lmprog/decoding   # folders or files
    python scripts/docstring_ratio.py --list 10 lmprog                  # + the 10 longest

Code lines: non-blank lines outside docstrings that are not comments.
"""

import argparse
import ast
from pathlib import Path

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def docstrings(tree: ast.Module) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of every module, class and function docstring."""
    found = []
    for node in [tree, *(n for n in ast.walk(tree) if isinstance(n, DEFS))]:
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            name = getattr(node, "name", "<module>")
            found.append((name, body[0].lineno, body[0].end_lineno or body[0].lineno))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--list", type=int, default=0, help="show the N longest docstrings")
    args = parser.parse_args()
    files = sorted(
        f for p in map(Path, args.paths) for f in ([p] if p.is_file() else p.rglob("*.py"))
    )
    doc = code = 0
    longest = []
    for path in files:
        text = path.read_text()
        inside: set[int] = set()
        for name, first, last in docstrings(ast.parse(text)):
            inside.update(range(first, last + 1))
            longest.append((last - first + 1, f"{path}:{first}", name))
        doc += len(inside)
        code += sum(
            1
            for i, line in enumerate(text.splitlines(), 1)
            if i not in inside and line.strip() and not line.lstrip().startswith("#")
        )
    longest.sort(reverse=True)
    print(
        f"{len(files)} files: {doc} docstring lines / {code} code lines = {doc / max(code, 1):.1%}; "
        f"docstrings over 30 lines: {sum(n > 30 for n, _, _ in longest)}, "
        f"over 10: {sum(n > 10 for n, _, _ in longest)}"
    )
    for n, where, name in longest[: args.list]:
        print(f"{n:4d}  {where}  {name}")


if __name__ == "__main__":
    main()

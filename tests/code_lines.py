"""Lines of code of the operator, the trainer and the client at a git revision: blank lines, comments
and docstrings not counted (issue 38 asks that refactors not grow it).

    .venv/bin/python tests/code_lines.py [REV] [--exclude PATH ...]
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize

SOURCES = ("operator/pets_operator", "src")
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(text: str) -> int:
    docs = docstring_lines(ast.parse(text))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in NOT_CODE:
            code.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docs)
    return len(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", nargs="?", default="HEAD")
    parser.add_argument("--exclude", nargs="*", default=[], help="files left out (paths in the repository)")
    args = parser.parse_args()
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", args.rev, "--", *SOURCES],
                            capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in listed if f.endswith(".py") and f not in args.exclude]
    total = sum(code_lines(subprocess.run(["git", "show", f"{args.rev}:{f}"], capture_output=True, text=True,
                                          check=True).stdout) for f in files)
    print(f"{args.rev}: {total} lines of code in {len(files)} files")


if __name__ == "__main__":
    main()

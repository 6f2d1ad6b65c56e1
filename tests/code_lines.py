"""Lines of code of the operator, the trainer and the client at a git revision: blank lines, comments
and docstrings not counted (issue 38 asks that refactors not grow it).

    .venv/bin/python tests/code_lines.py [REV] [--exclude PATH ...]
    .venv/bin/python tests/code_lines.py --commits A..B [--grep WORDS]

--commits gives each commit's own change, so that a refactor's commits can be summed apart from the
features landed between them.
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


def lines_at(rev: str, path: str) -> int:
    """The file's lines of code at rev; 0 where it does not exist there."""
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
    return code_lines(shown.stdout) if shown.returncode == 0 else 0


def commit_deltas(revs: str, grep: str | None) -> None:
    """Each commit's change in lines of code (its files only), and the sum of those listed."""
    git = ["git", "rev-list", "--reverse", revs] + ([f"--grep={grep}"] if grep else [])
    total = 0
    for rev in subprocess.run(git, capture_output=True, text=True, check=True).stdout.split():
        changed = subprocess.run(["git", "diff", "--name-only", f"{rev}~1", rev, "--", *SOURCES],
                                 capture_output=True, text=True, check=True).stdout.split()
        delta = sum(lines_at(rev, f) - lines_at(f"{rev}~1", f) for f in changed if f.endswith(".py"))
        subject = subprocess.run(["git", "log", "-1", "--format=%s", rev], capture_output=True, text=True,
                                 check=True).stdout.strip()
        total += delta
        if delta:
            print(f"{delta:+5d} {rev[:7]} {subject[:100]}")
    print(f"{total:+d} lines of code in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", nargs="?", default="HEAD")
    parser.add_argument("--exclude", nargs="*", default=[], help="files left out (paths in the repository)")
    parser.add_argument("--commits", metavar="A..B", help="each commit's change instead of a total")
    parser.add_argument("--grep", help="with --commits: only the commits whose message says this")
    args = parser.parse_args()
    if args.commits:
        commit_deltas(args.commits, args.grep)
        return
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", args.rev, "--", *SOURCES],
                            capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in listed if f.endswith(".py") and f not in args.exclude]
    total = sum(code_lines(subprocess.run(["git", "show", f"{args.rev}:{f}"], capture_output=True, text=True,
                                          check=True).stdout) for f in files)
    print(f"{args.rev}: {total} lines of code in {len(files)} files")


if __name__ == "__main__":
    main()

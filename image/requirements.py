"""Print the pip requirements of one image, read from the repository's pyproject.toml.

The wheelhouse (image/build.sh wheelhouse) is filled from these lines, so the image and the
project's own install (`pip install -e '.[trainer]'`) always agree on what the trainer needs.

Usage: python3 image/requirements.py trainer|operator --runtime|--build [PYPROJECT]

--runtime: the project's dependencies plus the image's extras (what the image's venv holds).
--build:   the build backend (build-system.requires), used inside the build to install our own
           package from source and left out of the final image.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

# The extras each image installs, on top of the project's base dependencies.
IMAGE_EXTRAS: dict[str, tuple[str, ...]] = {
    "trainer": ("trainer",),
    "operator": ("operator",),
}


def load(pyproject: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SystemExit(f"image/requirements.py: cannot read {pyproject}: {err}") from err


def runtime_requirements(image: str, pyproject: Path) -> list[str]:
    if image not in IMAGE_EXTRAS:
        raise SystemExit(
            f"image/requirements.py: unknown image {image!r}; expected one of {sorted(IMAGE_EXTRAS)}"
        )
    project = load(pyproject).get("project", {})
    lines: list[str] = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for extra in IMAGE_EXTRAS[image]:
        if extra not in extras:
            raise SystemExit(
                f"image/requirements.py: {pyproject}: [project.optional-dependencies] has no {extra!r}"
            )
        lines.extend(extras[extra])
    # Keep the order stable and drop exact duplicates (pyyaml, prometheus-client...).
    return list(dict.fromkeys(lines))


def build_requirements(pyproject: Path) -> list[str]:
    requires = load(pyproject).get("build-system", {}).get("requires")
    if not requires:
        raise SystemExit(f"image/requirements.py: {pyproject}: [build-system] requires is missing or empty")
    return list(requires)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[2] not in ("--runtime", "--build"):
        print(__doc__, file=sys.stderr)
        return 2
    pyproject = Path(argv[3]) if len(argv) == 4 else Path(__file__).resolve().parent.parent / "pyproject.toml"
    if argv[2] == "--runtime":
        lines = runtime_requirements(argv[1], pyproject)
    else:
        if argv[1] not in IMAGE_EXTRAS:
            raise SystemExit(
                f"image/requirements.py: unknown image {argv[1]!r}; expected one of {sorted(IMAGE_EXTRAS)}"
            )
        lines = build_requirements(pyproject)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

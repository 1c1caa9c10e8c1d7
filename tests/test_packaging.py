"""Every Python package folder in the source tree is listed in pyproject.toml, so installs ship it."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _found() -> set[str]:
    roots = {"klalm": ROOT / "src" / "klalm", "klalm.kernels": ROOT / "kernels", "klalm.configs": ROOT / "configs"}
    found = set()
    for prefix, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((prefix, *rel)))
    return found


def test_every_package_folder_is_declared():
    missing = _found() - _declared()
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_every_declared_package_exists():
    stale = _declared() - _found()
    assert not stale, f"declared in pyproject.toml but absent: {sorted(stale)}"

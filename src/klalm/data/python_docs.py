"""The offline corpus that ships with every CPython: the language reference plus standard-library docstrings.

- ``pydoc_data.topics.topics``: the Python language reference as plain English text (~0.47 MB), one document
  per topic, in sorted topic order.
- Standard-library docstrings, read with ``ast`` (nothing is imported, so no module side effects): one document
  per module (module docstring, then every public class/function docstring under its signature), modules in
  sorted path order; test suites, idlelib, turtledemo and site-packages are left out.

Both are distributed under the PSF License Agreement (Python Software Foundation). The corpus depends on the
Python version (the cache file name carries it); within one version the document order is fixed. The
validation split holds out documents by a CRC32 hash of their id, so it does not depend on the order.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sys
import sysconfig
import zlib
from collections.abc import Iterator
from pathlib import Path

from klalm.fileio import atomic_path

log = logging.getLogger(__name__)

EXCLUDED_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "turtledemo",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "_bundled",
        "lib2to3",
        "ensurepip",
    }
)


def _topic_documents() -> Iterator[dict[str, str]]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield {"id": f"topic:{key}", "text": topics[key].strip()}


def _signature(node: ast.AST) -> str:
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        return f"class {node.name}({bases})" if bases else f"class {node.name}"
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)})"


def _docstring_sections(body: list[ast.stmt], prefix: str) -> Iterator[str]:
    """Public class/function docstrings in source order, nested classes and methods included."""
    for node in body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("_") and not (node.name.startswith("__") and node.name.endswith("__")):
            continue
        doc = ast.get_docstring(node)
        if doc:
            yield f"{prefix}{_signature(node)}:\n{doc}"
        if isinstance(node, ast.ClassDef):
            yield from _docstring_sections(node.body, f"{prefix}{node.name}.")


def _module_document(path: Path, root: Path) -> dict[str, str] | None:
    module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError) as err:
        log.info("python_docs: skipping %s (%s)", path, type(err).__name__)
        return None
    parts = [f"Module {module}"]
    module_doc = ast.get_docstring(tree)
    if module_doc:
        parts.append(module_doc)
    parts.extend(_docstring_sections(tree.body, ""))
    if len(parts) == 1:
        return None
    return {"id": f"module:{module}", "text": "\n\n".join(parts)}


def _stdlib_documents() -> Iterator[dict[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("."))
        paths.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    for path in sorted(paths, key=lambda p: p.relative_to(root).parts):
        doc = _module_document(path, root)
        if doc is not None:
            yield doc


def build_python_docs(out_file: Path) -> int:
    """Extracts the corpus into a jsonl file (fields id, text), written atomically; returns the document count."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with atomic_path(out_file) as temporary, open(temporary, "w", encoding="utf-8") as f:
        for doc in (*_topic_documents(), *_stdlib_documents()):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            count += 1
    return count


def is_validation(doc_id: str, val_percent: int) -> bool:
    """Deterministic hold-out: a document is in the validation split if crc32(id) % 100 < val_percent."""
    return zlib.crc32(doc_id.encode("utf-8")) % 100 < val_percent


def python_docs_corpus(cache_dir: Path, split: str = "train", val_percent: int = 5) -> list[dict[str, str]]:
    """The documents of one split, built once into ``cache_dir`` and read from there afterwards.

    Args:
        cache_dir: cache folder; the corpus lives in ``python_docs-<python version>.jsonl`` inside it.
        split: "train" or "val".
        val_percent: percentage of documents (by id hash) in "val", 0-100.

    Returns:
        list of {"id", "text"} dicts in corpus order.
    """
    if split not in ("train", "val"):
        raise ValueError(f"python_docs split must be 'train' or 'val', got {split!r}")
    if not 0 <= val_percent <= 100:
        raise ValueError(f"python_docs val_percent must be in [0, 100], got {val_percent}")
    version = ".".join(map(str, sys.version_info[:3]))
    path = Path(cache_dir).expanduser() / f"python_docs-{version}.jsonl"
    if not path.exists():
        count = build_python_docs(path)
        log.info("python_docs: extracted %d documents into %s", count, path)
    with open(path, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    want_val = split == "val"
    return [d for d in docs if is_validation(d["id"], val_percent) == want_val]

"""MkDocs hook: a link from a page to a repository file outside docs/ works in the site.

The pages are read on GitHub as well as in the built site, so they link an example as
``[examples/fork.py](../examples/fork.py)`` and the policy as ``[SECURITY.md](../SECURITY.md)``.
Such a file is not under ``docs/``: this hook adds it to the site under ``repo/`` (a
Markdown file as a page outside the nav, anything else as it is) and points the link
there. A link whose target does not exist is left alone, for ``mkdocs build --strict``
to report. Links inside ``docs/`` are MkDocs' own business and are not touched.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

PREFIX = "repo"
# [text](target) or [text](target#anchor); the target has no scheme and no spaces
_LINK = re.compile(r"(?P<head>\]\()(?P<target>[^)\s#:]+)(?P<anchor>#[^)\s]*)?\)")


def _dirs(config: MkDocsConfig) -> tuple[Path, Path]:
    """The repository root (mkdocs.yml's folder) and the docs folder."""
    return Path(config.config_file_path).resolve().parent, Path(config.docs_dir).resolve()


def _repo_target(source: Path, target: str, root: Path, docs: Path) -> Path | None:
    """The existing repository file outside docs/ that ``target`` names from ``source``."""
    if target.startswith("/"):
        return None
    path = (source.parent / target).resolve()
    if not path.is_file() or not path.is_relative_to(root) or path.is_relative_to(docs):
        return None
    return path


def _links(text: str) -> Iterator[str]:
    for m in _LINK.finditer(text):
        yield m["target"]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every repository file a page links to (and those that file links to)."""
    root, docs = _dirs(config)
    todo = [Path(f.abs_src_path) for f in files.documentation_pages() if f.abs_src_path]
    added: set[Path] = set()
    while todo:
        source = todo.pop()
        for target in _links(source.read_text(encoding="utf-8")):
            path = _repo_target(source, target, root, docs)
            if path is None or path in added:
                continue
            added.add(path)
            uri = f"{PREFIX}/{path.relative_to(root).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            if path.suffix == ".md":
                todo.append(path)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **_: Any) -> str:
    """Point links at the site's copies: repo files under repo/, docs pages as pages."""
    root, docs = _dirs(config)
    if not page.file.abs_src_path:
        return markdown
    source = Path(page.file.abs_src_path).resolve()
    here = posixpath.dirname(page.file.src_uri)
    from_repo = not source.is_relative_to(docs)

    def rewrite(m: re.Match[str]) -> str:
        target = m["target"]
        path = _repo_target(source, target, root, docs)
        if path is not None:
            uri = f"{PREFIX}/{path.relative_to(root).as_posix()}"
        elif from_repo and not target.startswith("/"):  # a repo page linking into docs/
            inside = (source.parent / target).resolve()
            if not inside.is_relative_to(docs):
                return m[0]
            uri = inside.relative_to(docs).as_posix()
        else:
            return m[0]
        return f"{m['head']}{posixpath.relpath(uri, here or '.')}{m['anchor'] or ''})"

    return _LINK.sub(rewrite, markdown)

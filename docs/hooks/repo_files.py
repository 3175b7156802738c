"""MkDocs hook: links to repository files outside docs/ work in the site, and the site's
index shows the README's map.

The pages are read on GitHub as well as in the built site, so they link an example as
``[examples/fork.py](../examples/fork.py)`` and the policy as ``[SECURITY.md](../SECURITY.md)``.
Such a file is not under ``docs/``: this hook adds it to the site under ``repo/`` (a
Markdown file as a page outside the nav, anything else as it is) and points the link
there. A link whose target does not exist is left alone, for ``mkdocs build --strict``
to report. Links from one docs page to another are MkDocs' own business.

A line ``<!-- map: README.md -->`` in a page is replaced by the README's map (its table
that starts ``| capability | page | example |``), its links pointed at the site's pages
and copies, so the map is kept in one place.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

PREFIX = "repo"
MAP_MARKER = "<!-- map: README.md -->"
MAP_HEADER = "| capability | page | example |"
# [text](target) or [text](target#anchor); the target has no scheme and no spaces
_LINK = re.compile(r"(?P<head>\]\()(?P<target>[^)\s#:]+)(?P<anchor>#[^)\s]*)?\)")


def _dirs(config: MkDocsConfig) -> tuple[Path, Path]:
    """The repository root (mkdocs.yml's folder) and the docs folder."""
    return Path(config.config_file_path).resolve().parent, Path(config.docs_dir).resolve()


def _outside(source: Path, target: str, root: Path, docs: Path) -> Path | None:
    """The existing repository file outside docs/ that ``target`` names from ``source``."""
    if target.startswith("/"):
        return None
    path = (source.parent / target).resolve()
    if not path.is_file() or not path.is_relative_to(root) or path.is_relative_to(docs):
        return None
    return path


def readme_map(root: Path) -> str:
    """The README's map table."""
    lines = (root / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index(MAP_HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end]) + "\n"


def _sources(text: str, source: Path, root: Path) -> list[tuple[str, Path]]:
    """The pieces of a page's text, each with the file its links are relative to."""
    if MAP_MARKER not in text:
        return [(text, source)]
    return [(text, source), (readme_map(root), root / "README.md")]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every repository file a page links to (and those that file links to)."""
    root, docs = _dirs(config)
    todo = [Path(f.abs_src_path) for f in files.documentation_pages() if f.abs_src_path]
    added: set[Path] = set()
    while todo:
        page = todo.pop()
        for text, source in _sources(page.read_text(encoding="utf-8"), page, root):
            for m in _LINK.finditer(text):
                path = _outside(source, m["target"], root, docs)
                if path is None or path in added:
                    continue
                added.add(path)
                uri = f"{PREFIX}/{path.relative_to(root).as_posix()}"
                files.append(File.generated(config, uri, abs_src_path=str(path),
                                            inclusion=InclusionLevel.NOT_IN_NAV))
                if path.suffix == ".md":
                    todo.append(path)
    return files


def _point_links(text: str, source: Path, here: str, config: MkDocsConfig) -> str:
    """Links in ``text`` (relative to the file ``source``) made to work from the site
    page ``here`` (a src_uri): repo files to their copies, docs files to their pages."""
    root, docs = _dirs(config)
    base = posixpath.dirname(here) or "."

    def rewrite(m: re.Match[str]) -> str:
        target = m["target"]
        path = _outside(source, target, root, docs)
        if path is not None:
            uri = f"{PREFIX}/{path.relative_to(root).as_posix()}"
        elif not source.is_relative_to(docs) and not target.startswith("/"):
            inside = (source.parent / target).resolve()  # from outside docs/ into it
            if not inside.is_relative_to(docs):
                return m[0]
            uri = inside.relative_to(docs).as_posix()
        else:
            return m[0]
        return f"{m['head']}{posixpath.relpath(uri, base)}{m['anchor'] or ''})"

    return _LINK.sub(rewrite, text)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **_: Any) -> str:
    """Point links at the site's copies, and put the README's map in place."""
    if not page.file.abs_src_path:
        return markdown
    root, _docs = _dirs(config)
    source = Path(page.file.abs_src_path).resolve()
    text = _point_links(markdown, source, page.file.src_uri, config)
    if MAP_MARKER in text:
        table = _point_links(readme_map(root), root / "README.md", page.file.src_uri, config)
        text = text.replace(MAP_MARKER, table)
    return text

"""mkdocs hooks: the repository's `specs/` and `examples/` on the documentation site.

The guides in `docs/` link to `../specs/protocol.md`, `../examples/routing_hub.py` and the
like, which are files of the repository (and its links on a forge), not pages of a site built
from `docs/` alone. These hooks add them to the site (the specification's Markdown as pages,
everything else as files, and an index page for each folder the specification links to) and
rewrite those links to where the files are on the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: Folders of the repository published beside the guides, under the same name.
PUBLISHED = ("specs", "examples")
#: Source files a guide links to (`../synapse/...`): published as they are.
_SOURCE_LINK = re.compile(r"\]\(\.\./(synapse/[^)#\s]+)")
_FOLDER_LINK = re.compile(r"\]\(((?:schema|examples)/)\)")


def _add(files: Files, config: Any, path: Path) -> None:
    uri = path.relative_to(ROOT).as_posix()
    if files.get_file_from_path(uri) is None:
        files.append(
            File(
                uri,
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )


def on_files(files: Files, config: Any) -> Files:
    for folder in PUBLISHED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "node_modules" not in path.parts:
                _add(files, config, path)
    # An index page for each folder the specification links to as a whole.
    for folder in ("specs/schema", "specs/examples"):
        names = sorted(p.name for p in (ROOT / folder).iterdir() if p.is_file())
        listing = "\n".join(f"- [`{name}`]({name})" for name in names)
        title = folder.split("/")[-1]
        files.append(
            File.generated(config, f"{folder}/index.md", content=f"# {title}\n\n{listing}\n")
        )
    for guide in (ROOT / "docs").glob("*.md"):
        for target in _SOURCE_LINK.findall(guide.read_text("utf-8")):
            if (ROOT / target).is_file():
                _add(files, config, ROOT / target)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    uri = page.file.src_uri
    if uri.startswith("specs/"):
        # A link to a guide: the guides are at the root of the site.
        markdown = markdown.replace("](../docs/", "](../")
        return _FOLDER_LINK.sub(r"](\1index.md)", markdown)
    if "/" not in uri:  # a guide at the root of docs/
        for folder in (*PUBLISHED, "synapse"):
            markdown = markdown.replace(f"](../{folder}/", f"]({folder}/")
    return markdown

"""Make asv's published dashboard load with no network: its CDN scripts and styles, served from the folder.

``asv publish`` writes pages (``index.html``, ``error.html``) that load jQuery, flot and its plugins,
flot-orderbars, stupidtable, blueimp-md5 and bootstrap from CDNs (code.jquery.com,
cdnjs.cloudflare.com, cdn.jsdelivr.net). The benchmark machines and the places the results are read
from often have no internet, and there the page shows nothing but asv's "dependencies failed to
load" error. This module copies each of those files into ``HTML_DIR/vendor/PKG@VER/PATH`` and points
the tags at the copies::

    mrcnn-bench asv offline-html results/html [--cache .asv/vendor-cache]

Where the files come from: the npm registry, the one package source reachable from the machines
that publish (the CDNs are often not). Each URL maps to (npm package, version, file in its tarball):

* jsDelivr npm URLs (``cdn.jsdelivr.net/npm/PKG@VER/PATH``) map to themselves: jsDelivr serves the
  npm tarball's files as they are.
* cdnjs and code.jquery.com URLs go through the small explicit table :data:`CDN_TABLE`, and only it:
  an URL in neither form is an error, never a page left half online. Five of its entries are not the
  CDN's own file. flot 0.8.3 on npm has no ``.min.js`` files, so the unminified ``jquery.flot*.js``
  of the same release stand in. cdnjs's stupidtable 1.0.1 was never published on npm; the same
  project (joequery/Stupid-Table-Plugin, same ``$.fn.stupidtable`` API) is on npm as
  ``stupid-table-plugin``, whose only release there, 1.1.3, stands in.

Why it is safe to drop the tags' ``integrity`` hashes: each tarball is checked against the
registry's ``dist.integrity`` (sha512) before anything is taken from it, and where the vendored file
is meant to be byte for byte the CDN's (every entry but the stand-ins above) the tag's own
``integrity`` hash is checked against it too, before the tag is rewritten. ``crossorigin`` and
``referrerpolicy`` only concern cross-origin fetches and go with it; every other attribute
(``onerror`` included) is kept.

Tarballs and their registry records are cached (default ``.asv/vendor-cache``), so ``asv publish``
followed by this module needs the network only the first time. A stylesheet also brings the files
its relative ``url(...)``\\ s name (bootstrap's ``../fonts/glyphicons-*``), so its icons render too.

Running it twice changes nothing the second time: rewritten tags no longer point at a CDN.
:func:`external_references` lists whatever script or stylesheet still points outside the folder;
the command fails (exit 2) unless that list is empty after vendoring.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.publish.npm_registry import (
    REMOTE,
    Fetch,
    VendorError,
    css_dependencies,
    fetch_url,
    npm_tarball,
    package_files,
    safe_relative,
    sri_matches,
)

DEFAULT_CACHE = Path(".asv/vendor-cache")
VENDOR_DIR = "vendor"
# Attributes that only make sense for the CDN copy: its hash, and cross-origin fetch settings.
DROPPED_ATTRIBUTES = ("integrity", "crossorigin", "referrerpolicy")



@dataclass(frozen=True)
class NpmFile:
    """One file inside an npm package's tarball: what a CDN URL stands for.

    ``identical`` is True when the file is byte for byte what the CDN serves, so the tag's own
    ``integrity`` hash must match it; False for a stand-in (another build or release), whose
    difference ``note`` says.
    """

    package: str
    version: str
    path: str
    identical: bool = True
    note: str = ""


@dataclass(frozen=True)
class VendoredAsset:
    """One rewritten reference: which page and URL, the npm file that replaced it, where it lies now.

    ``extra_files`` are the files a stylesheet's ``url(...)``\\ s need (fonts); ``sri_checked`` says
    whether the tag's original ``integrity`` hash was verified against the local file.
    """

    html_file: Path
    url: str
    source: NpmFile
    local_file: Path
    new_url: str
    extra_files: tuple[Path, ...] = ()
    sri_checked: bool = False


def _flot(plugin: str) -> tuple[str, NpmFile]:
    name = f"jquery.flot{plugin}"
    return (f"https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/{name}.min.js",
            NpmFile("flot", "0.8.3", f"{name}.js", identical=False,
                    note="npm's flot 0.8.3 ships no .min.js; the unminified file of the same release"))


# The CDN URLs asv's pages use that are not jsDelivr npm URLs. Exact URLs (https), so that a new
# asv release with other versions fails here, loudly, until someone checks and adds them.
CDN_TABLE: dict[str, NpmFile] = {
    "https://code.jquery.com/jquery-3.3.1.min.js": NpmFile("jquery", "3.3.1", "dist/jquery.min.js"),
    **dict(_flot(p) for p in ("", ".time", ".selection", ".categories")),
    # stupidtable 1.0.1 (cdnjs) was never published on npm; the same project's package there is
    # stupid-table-plugin (joequery/Stupid-Table-Plugin), whose only release is 1.1.3, same $.fn.stupidtable API.
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": NpmFile(
        "stupid-table-plugin", "1.1.3", "stupidtable.min.js", identical=False,
        note="stupidtable 1.0.1 is not on npm; the same project's stupid-table-plugin 1.1.3"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": NpmFile(
        "blueimp-md5", "2.19.0", "js/md5.min.js"),
}

_PACKAGE = r"(?:@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*"
_VERSION = r"\d+\.\d+\.\d+(?:[-+][\w.-]+)?"  # exact releases only: a range would drift
_JSDELIVR_NPM = re.compile(rf"https://cdn\.jsdelivr\.net/npm/(?P<pkg>{_PACKAGE})@(?P<ver>{_VERSION})/(?P<path>[^?#]+)")
_HTTP = re.compile(r"^(?:https?:)?//", re.IGNORECASE)


def normalize(url: str) -> str:
    """``//host/x`` and ``http://host/x`` as ``https://host/x``: the form the table is keyed by."""
    return re.sub(r"^(?:https?:)?//", "https://", url.strip(), flags=re.IGNORECASE)


def npm_source(url: str) -> NpmFile | None:
    """The npm file a CDN URL stands for, or None when it is neither a jsDelivr npm URL nor in the table."""
    url = normalize(url)
    if url in CDN_TABLE:
        return CDN_TABLE[url]
    m = _JSDELIVR_NPM.fullmatch(url)
    if m:
        return NpmFile(m["pkg"], m["ver"], urllib.parse.unquote(m["path"]))
    return None


# --- finding the tags -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tag:
    start: int  # offset of '<' in the file's text
    text: str  # the start tag exactly as written
    attr: str  # "src" or "href"
    url: str


def _is_stylesheet(attrs: dict[str, str | None]) -> bool:
    return "stylesheet" in (attrs.get("rel") or "").lower().split()


class _TagFinder(HTMLParser):
    """Start tags of scripts with a ``src`` and stylesheet links, with their exact text and offset."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[_Tag] = []
        self._line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            attr = "src"
        elif tag == "link" and _is_stylesheet(values) and values.get("href"):
            attr = "href"
        else:
            return
        line, col = self.getpos()
        raw = self.get_starttag_text() or ""
        self.tags.append(_Tag(self._line_starts[line - 1] + col, raw, attr, (values[attr] or "").strip()))

    handle_startendtag = handle_starttag  # <link ... />


def _html_files(html_dir: Path) -> list[Path]:
    return sorted(p for p in html_dir.rglob("*.html") if p.is_file())


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:  # newline="": offsets and line ends kept as written
        return f.read()


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _tags(path: Path) -> list[_Tag]:
    return _TagFinder(_read(path)).tags


def _points_outside(html_file: Path, root: Path, url: str) -> bool:
    if url.lower().startswith("data:"):
        return False
    if REMOTE.match(url) or url.startswith("/"):  # another host, or the server's root: not this folder
        return True
    local = (html_file.parent / urllib.parse.unquote(re.split(r"[?#]", url, maxsplit=1)[0])).resolve()
    return not (local.is_file() and local.is_relative_to(root))


def external_references(html_dir: Path) -> list[tuple[Path, str]]:
    """(page, URL) of every script or stylesheet of every ``.html`` under ``html_dir`` that is not in it.

    Not in it: an absolute (``https://``, any scheme but ``data:``) or protocol-relative (``//``)
    URL, a path from the server's root, or a relative path to no file inside the folder. Only what
    the page loads counts; links the reader may follow (``<a href>``) do not.
    """
    root = Path(html_dir).resolve()
    return [(page, tag.url) for page in _html_files(Path(html_dir)) for tag in _tags(page)
            if _points_outside(page, root, tag.url)]


# --- rewriting a tag --------------------------------------------------------------------------------

_TAG_NAME = re.compile(r"<[^\s/>]+")
_ATTRIBUTE = re.compile(r"""(\s+)([^\s"'>/=]+)(?:(\s*=\s*)("[^"]*"|'[^']*'|[^\s"'=<>`]+))?""")


def _attributes(tag_text: str) -> tuple[str, list[re.Match[str]], str]:
    """A start tag as (``<name``, its attribute matches in order, the rest: ``>`` or ``/>``)."""
    head = _TAG_NAME.match(tag_text)
    if head is None:
        raise VendorError(f"not a start tag: {tag_text!r}")
    pos, found = head.end(), []
    while (m := _ATTRIBUTE.match(tag_text, pos)) is not None:
        found.append(m)
        pos = m.end()
    return head.group(), found, tag_text[pos:]


def _attribute_value(m: re.Match[str]) -> str:
    value = m.group(4) or ""
    return html.unescape(value[1:-1] if value[:1] in "\"'" and len(value) >= 2 else value)


def rewrite_tag(tag_text: str, attr: str, new_url: str) -> str:
    """``tag_text`` with ``attr`` set to ``new_url`` and :data:`DROPPED_ATTRIBUTES` removed; the rest as written."""
    head, found, tail = _attributes(tag_text)
    parts = [head]
    for m in found:
        name = m.group(2).lower()
        if name in DROPPED_ATTRIBUTES:
            continue
        if name == attr:
            quote = m.group(4)[0] if m.group(4) and m.group(4)[0] in "\"'" else '"'
            parts.append(f"{m.group(1)}{m.group(2)}{m.group(3) or '='}{quote}{html.escape(new_url)}{quote}")
        else:
            parts.append(m.group())
    return "".join(parts) + tail


def tag_integrity(tag_text: str) -> str:
    """The tag's ``integrity`` attribute ('' when it has none)."""
    return next((_attribute_value(m) for m in _attributes(tag_text)[1] if m.group(2).lower() == "integrity"), "")


# --- vendoring --------------------------------------------------------------------------------------


def _relative_url(target: Path, page: Path) -> str:
    return urllib.parse.quote(Path(os.path.relpath(target, page.parent)).as_posix(), safe="/@+")


def _remote_tags(html_dir: Path) -> Iterator[tuple[Path, str, list[tuple[_Tag, NpmFile]]]]:
    """Each page with its CDN tags and their npm files; :class:`VendorError` on the first unknown URL."""
    for page in _html_files(html_dir):
        text = _read(page)
        found = []
        for tag in _TagFinder(text).tags:
            if not _HTTP.match(tag.url):
                continue
            source = npm_source(tag.url)
            if source is None:
                raise VendorError(f"no npm source known for {tag.url} in {page}: add it to "
                                  "mrcnn_bench.publish.offline_html.CDN_TABLE (or use a cdn.jsdelivr.net/npm URL)")
            found.append((tag, source))
        yield page, text, found


def vendor_assets(html_dir: Path, cache_dir: Path = DEFAULT_CACHE, fetch: Fetch = fetch_url) -> list[VendoredAsset]:
    """Copy every CDN script and stylesheet of the pages under ``html_dir`` into it; point the tags there.

    Every page is checked (all URLs known) before any file is written, so an unknown URL leaves the
    folder as it was. Returns one :class:`VendoredAsset` per rewritten tag (none on a second run).
    Raises :class:`VendorError` on an unknown URL, a failed download or an integrity mismatch.
    """
    html_dir = Path(html_dir)
    pages = [(page, text, found) for page, text, found in _remote_tags(html_dir) if found]
    tarballs: dict[tuple[str, str], dict[str, bytes]] = {}
    written: dict[tuple[str, str, str], tuple[Path, tuple[Path, ...]]] = {}
    assets: list[VendoredAsset] = []
    for page, text, found in pages:
        edits = []
        for tag, source in found:
            key = (source.package, source.version)
            if key not in tarballs:
                tarballs[key] = package_files(npm_tarball(*key, Path(cache_dir), fetch), "@".join(key))
            files = tarballs[key]
            path = safe_relative(source.path, "file")
            if path not in files:
                raise VendorError(f"{path} is not in the npm package {source.package}@{source.version} "
                                  f"(for {tag.url} in {page})")
            sri = tag_integrity(tag.text)
            sri_checked = bool(sri) and source.identical
            if sri_checked and not sri_matches(files[path], sri):
                raise VendorError(f"integrity mismatch: {path} of npm {source.package}@{source.version} does not "
                                  f"match the integrity of {tag.url} in {page}")
            base = html_dir / VENDOR_DIR / f"{safe_relative(source.package, 'package')}@{source.version}"
            if (*key, path) not in written:
                extra = []
                if path.endswith(".css"):
                    for dep in css_dependencies(path, files[path]):
                        dep = safe_relative(dep, "stylesheet url")
                        if dep not in files:
                            raise VendorError(f"{path} of npm {source.package}@{source.version} needs {dep}, "
                                              "which its tarball lacks")
                        atomic_write(base / dep, files[dep])
                        extra.append(base / dep)
                atomic_write(base / path, files[path])
                written[(*key, path)] = (base / path, tuple(extra))
            local, extra_files = written[(*key, path)]
            new_url = _relative_url(local, page)
            edits.append((tag, rewrite_tag(tag.text, tag.attr, new_url)))
            assets.append(VendoredAsset(page, tag.url, source, local, new_url, extra_files, sri_checked))
        for tag, new_text in sorted(edits, key=lambda e: e[0].start, reverse=True):
            if text[tag.start:tag.start + len(tag.text)] != tag.text:
                raise VendorError(f"could not locate the tag {tag.text[:60]!r} in {page}")
            text = text[:tag.start] + new_text + text[tag.start + len(tag.text):]
        _write(page, text)
    return assets


def build_parser(prog: str = "mrcnn-bench asv offline-html") -> argparse.ArgumentParser:
    """``mrcnn-bench asv offline-html``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("html_dir", type=Path, help="the folder asv publish wrote (e.g. results/html)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help=f"npm tarballs and registry records, kept between runs (default: {DEFAULT_CACHE})")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv offline-html") -> int:
    """Vendor, then check nothing loads from outside; 0, or 2 with one line on stderr."""
    args = build_parser(prog).parse_args(argv)
    try:
        if not _html_files(args.html_dir):
            raise VendorError(f"no .html files under {args.html_dir} (run asv publish first)")
        assets = vendor_assets(args.html_dir, args.cache, fetch=fetch_url)  # looked up now: tests replace it
        left = external_references(args.html_dir)
        if left:
            listed = ", ".join(f"{page}: {url}" for page, url in left[:3])
            raise VendorError(f"{len(left)} script/stylesheet references still point outside {args.html_dir}: "
                              f"{listed}{', ...' if len(left) > 3 else ''}")
    except VendorError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if not assets:
        print(f"{prog}: no CDN references left in {args.html_dir}; no script or stylesheet loads from outside")
        return 0
    packages = sorted({f"{a.source.package}@{a.source.version}" for a in assets})
    checked = sum(a.sri_checked for a in assets)
    print(f"{prog}: {len(assets)} references rewritten to {args.html_dir / VENDOR_DIR} ({', '.join(packages)}); "
          f"{checked} of them also match the page's own integrity hash (the others are stand-ins, see the module "
          "docstring); no script or stylesheet loads from outside")
    return 0


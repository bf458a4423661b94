"""asv's dashboard with no network (mrcnn_bench.publish.offline_html): its CDN tags rewritten to files from npm
tarballs, checked against their integrity; unknown URLs and bad tarballs refused. No network here: a
fake fetch serves a registry built in tmp_path from asv's own page header."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
import tarfile
import urllib.error
from pathlib import Path

import asv
import pytest

from mrcnn_bench.publish import offline_html
from mrcnn_bench.publish.offline_html import (
    VendorError,
    external_references,
    npm_source,
    rewrite_tag,
    sri_matches,
    vendor_assets,
)

REPO = Path(__file__).resolve().parents[2]
ASV_WWW = Path(asv.__file__).parent / "www"


def _sri(data: bytes, algorithm: str = "sha512") -> str:
    return f"{algorithm}-{base64.b64encode(hashlib.new(algorithm, data).digest()).decode()}"


def _tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(f"package/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _page_urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(https?://[^"]+)"', page)


class FakeRegistry:
    """The npm registry for the packages a page's CDN URLs map to: fake files, real tarball layout."""

    def __init__(self, urls: list[str]):
        self.packages: dict[tuple[str, str], dict[str, bytes]] = {}
        for url in urls:
            src = npm_source(url)
            assert src is not None, url
            files = self.packages.setdefault((src.package, src.version), {"package.json": b"{}"})
            if src.path.endswith(".css"):  # like bootstrap: fonts next to the css folder
                files[src.path] = b".icon{src:url(../fonts/icons.woff?#x) format('woff'),url('../fonts/icons.ttf')}"
                base = src.path.rsplit("/", 2)[0]
                files[f"{base}/fonts/icons.woff"] = b"woff"
                files[f"{base}/fonts/icons.ttf"] = b"ttf"
            else:
                files[src.path] = f"/* {src.package}@{src.version} {src.path} */".encode()
        self.tarballs = {key: _tgz(files) for key, files in self.packages.items()}
        self.integrity = {key: _sri(data) for key, data in self.tarballs.items()}
        self.calls: list[str] = []

    def file(self, url: str) -> bytes:
        src = npm_source(url)
        return self.packages[(src.package, src.version)][src.path]

    def fetch(self, url: str) -> bytes:
        self.calls.append(url)
        for (name, version), data in self.tarballs.items():
            tarball = f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz"
            if url == f"https://registry.npmjs.org/{name}/{version}":
                return json.dumps({"name": name, "version": version, "dist": {
                    "tarball": tarball, "integrity": self.integrity[(name, version)]}}).encode()
            if url == tarball:
                return data
        raise urllib.error.URLError(f"no route to {url}")


def _asv_site(tmp_path: Path) -> tuple[Path, FakeRegistry]:
    """asv's www folder with index.html cut to asv's real <head> plus a small body; the tags' integrity
    hashes are those of the fake files (the real ones are the CDN's), everything else as asv writes it."""
    site = tmp_path / "html"
    shutil.copytree(ASV_WWW, site)
    real = (ASV_WWW / "index.html").read_text()
    head = real[:real.index("</head>") + len("</head>")]
    registry = FakeRegistry(_page_urls(head))
    assert len(registry.packages) >= 6  # jquery, flot, orderbars, stupidtable, md5, bootstrap

    def fake_hash(m: re.Match[str]) -> str:
        tag = m.group()
        url = re.search(r'(?:src|href)="(https?://[^"]+)"', tag)
        if url is None:
            return tag
        algorithm = re.search(r'integrity="(sha\d+)-', tag).group(1)
        return re.sub(r'integrity="[^"]*"', f'integrity="{_sri(registry.file(url.group(1)), algorithm)}"', tag)

    head = re.sub(r"<(?:script|link)\b[^>]*>", fake_hash, head)
    body = ('<body><a href="https://github.com/airspeed-velocity/asv/">asv</a>'
            '<a href="https://example.org/x.js">not loaded</a><div id="graph"></div></body></html>\n')
    (site / "index.html").write_text(head + "\n" + body)
    return site, registry


def test_asv_header_vendored_nothing_external_and_second_run_is_a_no_op(tmp_path):
    site, registry = _asv_site(tmp_path)
    cache = tmp_path / "cache"
    original = (site / "index.html").read_text()
    cdn_urls = set(_page_urls(original.split("</head>")[0]))
    assert {url for _, url in external_references(site)} == cdn_urls  # the body's <a href>s do not count

    assets = vendor_assets(site, cache, fetch=registry.fetch)

    assert external_references(site) == []
    assert {a.url for a in assets} == cdn_urls
    page = (site / "index.html").read_text()
    for a in assets:
        assert a.local_file.is_file() and a.local_file.is_relative_to(site / "vendor")
        assert a.local_file.read_bytes() == registry.file(a.url)
        assert a.local_file == site / "vendor" / f"{a.source.package}@{a.source.version}" / a.source.path
        assert f'"{a.new_url}"' in page
        assert a.sri_checked == a.source.identical  # asv's tags all carry a hash
    for dropped in ("integrity=", "crossorigin=", "referrerpolicy="):
        assert dropped not in page
    assert page.count('onerror="js_load_failure()"') == original.count('onerror="js_load_failure()"')
    assert 'src="asv.js"' in page.replace("\n            ", " ")  # asv's own tags untouched
    assert page.split("</head>")[1] == original.split("</head>")[1]
    css = next(a for a in assets if a.url.endswith(".css"))
    assert sorted(p.name for p in css.extra_files) == ["icons.ttf", "icons.woff"]
    assert all((css.local_file.parent / "../fonts" / p.name).resolve().is_file() for p in css.extra_files)
    stand_in = next(a for a in assets if "stupidtable" in a.url)
    assert (stand_in.source.package, stand_in.source.version) == ("stupid-table-plugin", "1.1.3")
    assert not stand_in.source.identical

    files = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    calls = len(registry.calls)
    assert vendor_assets(site, cache, fetch=registry.fetch) == []
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == files
    assert len(registry.calls) == calls

    # asv publish again (the CDN tags come back): the cache serves it, with no network at all.
    (site / "index.html").write_text(original)

    def offline(url: str) -> bytes:
        raise urllib.error.URLError("network is unreachable")

    assert len(vendor_assets(site, cache, fetch=offline)) == len(assets)
    assert (site / "index.html").read_text() == page


def test_pages_in_subfolders_get_relative_paths(tmp_path):
    site, registry = _asv_site(tmp_path)
    (site / "sub").mkdir()
    cdn_tags = re.findall(r'<(?:script|link)[^>]*"https://[^>]*>(?:</script>)?', (site / "index.html").read_text())
    (site / "sub" / "page.html").write_text(f"<html><head>{''.join(cdn_tags)}</head><body></body></html>")
    vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)
    assert external_references(site) == []
    assert '"../vendor/jquery@3.3.1/dist/jquery.min.js"' in (site / "sub" / "page.html").read_text()


def test_tarball_integrity_mismatch_fails_and_writes_nothing(tmp_path):
    site, registry = _asv_site(tmp_path)
    registry.integrity[("jquery", "3.3.1")] = _sri(b"another tarball")
    original = (site / "index.html").read_text()
    with pytest.raises(VendorError, match=r"integrity mismatch for jquery@3\.3\.1"):
        vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)
    assert (site / "index.html").read_text() == original
    assert not (tmp_path / "cache" / "jquery@3.3.1.tgz").exists()  # a bad download is never cached


def test_damaged_cache_fails_too(tmp_path):
    site, registry = _asv_site(tmp_path)
    original = (site / "index.html").read_text()
    vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)
    (tmp_path / "cache" / "jquery@3.3.1.tgz").write_bytes(b"damaged")
    (site / "index.html").write_text(original)
    with pytest.raises(VendorError, match=r"integrity mismatch for jquery@3\.3\.1: cached file"):
        vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)


def test_file_unlike_the_cdn_hash_fails(tmp_path):
    site, registry = _asv_site(tmp_path)
    page = (site / "index.html").read_text()
    url = "https://code.jquery.com/jquery-3.3.1.min.js"
    page = re.sub(r'(src="' + re.escape(url) + r'" integrity=")[^"]*"', r'\1' + _sri(b"x", "sha256") + '"', page)
    (site / "index.html").write_text(page)
    with pytest.raises(VendorError, match=r"does not match the integrity of " + re.escape(url)):
        vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)


def test_unknown_cdn_url_fails_naming_it_and_the_file(tmp_path, monkeypatch, capsys):
    site, registry = _asv_site(tmp_path)
    (site / "error.html").write_text('<html><head><script src="https://unpkg.com/lib@1.0.0/lib.js"></script>'
                                     "</head></html>")
    original = {p: p.read_bytes() for p in site.glob("*.html")}
    with pytest.raises(VendorError, match=r"https://unpkg\.com/lib@1\.0\.0/lib\.js in .*error\.html"):
        vendor_assets(site, tmp_path / "cache", fetch=registry.fetch)
    assert {p: p.read_bytes() for p in site.glob("*.html")} == original  # all checked before any write
    assert not (site / "vendor").exists()

    monkeypatch.setattr(offline_html, "fetch_url", registry.fetch)
    assert offline_html.main([str(site), "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "https://unpkg.com/lib@1.0.0/lib.js" in err and "error.html" in err
    assert "Traceback" not in err


def test_main_network_failure_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    site, _ = _asv_site(tmp_path)

    def offline(url: str) -> bytes:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(offline_html, "fetch_url", offline)
    assert offline_html.main([str(site), "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot fetch https://registry.npmjs.org/" in err


def test_main_succeeds_then_is_a_no_op(tmp_path, monkeypatch, capsys):
    site, registry = _asv_site(tmp_path)
    monkeypatch.setattr(offline_html, "fetch_url", registry.fetch)
    assert offline_html.main([str(site), "--cache", str(tmp_path / "cache")]) == 0
    assert "no script or stylesheet loads from outside" in capsys.readouterr().out
    assert offline_html.main([str(site), "--cache", str(tmp_path / "cache")]) == 0
    assert "no CDN references left" in capsys.readouterr().out


def test_external_references_counts_what_is_loaded_not_links(tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "here.js").write_text("")
    (tmp_path / "outside.js").write_text("")  # exists, but not inside the folder
    (site / "sub" / "a.html").write_text(
        '<a href="https://github.com/airspeed-velocity/asv/">asv</a>\n'
        '<link rel="alternate" type="application/atom+xml" href="https://example.org/feed.xml">\n'
        '<link rel="shortcut icon" href="swallow.ico">\n'
        '<script>var inline = 1;</script><script src="../here.js?v=1"></script>\n'
        '<script src="data:text/javascript,1"></script>\n'
        '<script src="//cdn.example.org/x.js"></script>\n'
        '<script src="missing.js"></script>\n'
        '<script src="../../outside.js"></script>\n'
        "<link href='HTTP://cdn.example.org/y.css' rel='Stylesheet'/>\n")
    found = [url for _, url in external_references(site)]
    assert found == ["//cdn.example.org/x.js", "missing.js", "../../outside.js", "HTTP://cdn.example.org/y.css"]


def test_rewrite_tag_keeps_other_attributes():
    tag = ('<script src="https://x/y.js" integrity="sha256-abc"\n   crossorigin=anonymous '
           "referrerpolicy='no-referrer' onerror=\"js_load_failure()\" defer>")
    assert rewrite_tag(tag, "src", "vendor/p@1.0.0/y.js") == \
        '<script src="vendor/p@1.0.0/y.js" onerror="js_load_failure()" defer>'
    link = "<link rel='stylesheet' href='https://x/b.css' integrity='sha256-abc' />"
    assert rewrite_tag(link, "href", "v/b.css") == "<link rel='stylesheet' href='v/b.css' />"


def test_url_table_and_jsdelivr_mapping():
    assert npm_source("https://cdn.jsdelivr.net/npm/@scope/pkg@1.2.3/dist/x.js") == \
        offline_html.NpmFile("@scope/pkg", "1.2.3", "dist/x.js")
    assert npm_source("//cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css").path == \
        "dist/css/bootstrap.min.css"
    assert npm_source("https://cdn.jsdelivr.net/npm/bootstrap@3/dist/js/bootstrap.min.js") is None  # a range
    assert npm_source("https://cdn.jsdelivr.net/gh/user/repo@1.0.0/x.js") is None
    flot = npm_source("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js")
    assert (flot.package, flot.version, flot.path, flot.identical) == ("flot", "0.8.3", "jquery.flot.time.js", False)
    assert npm_source("http://code.jquery.com/jquery-3.3.1.min.js").path == "dist/jquery.min.js"
    real = (ASV_WWW / "index.html").read_text()
    for url in _page_urls(real.split("</head>")[0]):  # whatever this asv release loads
        assert npm_source(url) is not None, url


def test_sri_matches_uses_the_strongest_algorithm():
    data = b"abc"
    assert sri_matches(data, _sri(data))
    assert sri_matches(data, f"{_sri(b'x', 'sha256')} {_sri(data, 'sha384')}")
    assert not sri_matches(data, f"{_sri(data, 'sha256')} {_sri(b'x', 'sha512')}")
    assert not sri_matches(data, "") and not sri_matches(data, "md5-abc")


def test_published_dashboard_loads_nothing_from_outside():
    """The dashboard `make asv-publish` built here, if any: results/html is generated, not committed."""
    html_dir = REPO / "results" / "html"
    if not (html_dir / "index.html").is_file():
        pytest.skip("results/html is not built here (generated, not committed): run `make asv-publish` first")
    assert external_references(html_dir) == []

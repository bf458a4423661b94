"""Screenshots of the published asv dashboard in headless Chromium with no network: proof that it renders.

    mrcnn-bench asv screenshots [--html-dir results/html] [--out results/asv/screenshots]

Serves ``--html-dir`` over http on 127.0.0.1 (a free port, in a thread: the pages load their JSON
with XHR, which Chromium refuses over ``file://``), then runs Chromium headless with every host
but 127.0.0.1 made unresolvable (``--host-resolver-rules``), the way a machine with no internet
sees the page. Anything still loaded from a CDN fails there, and asv then sends the browser to its
error page, so the screenshots show whether the folder stands alone (see
:mod:`mrcnn_bench.publish.offline_html`). ``--virtual-time-budget`` lets the scripts, XHRs and the graph
drawing finish before the capture without a fixed sleep.

``--report DIR`` instead takes the pages ``mrcnn-bench report`` wrote to DIR (its index and each
run's page) at 1400 px wide, the width at which a report table must still show every column.

Writes into ``--out``: ``index.png`` (the benchmark grid), ``graph.png`` (the first benchmark of
``index.json``, or ``--benchmark``, at the URL of the benchmark grid's links plus ``--param``),
``regressions.png``, ``index.dom.html`` and ``graph.dom.html`` (the DOMs after the scripts ran) and
``commands.txt`` (the exact command lines); ``--pages graph`` (or any subset holding the index or
the graph) takes only those, so that a second folder of graphs does not repeat the index. Exits 1
if a DOM shows asv's "dependencies failed to load" error page, the index lists no benchmark (the
scripts did not run), or the graph page drew no series (its parameters select nothing); 2 if there
is nothing to serve, no Chromium, or a bad option.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Every host unresolvable but the local server: the page sees a machine with no internet.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
         "--window-size=1400,1000", "--virtual-time-budget=15000"]
CHROMIUM_TIMEOUT_S = 180
# The dashboard pages a run can take (--pages); the index or the graph shows whether the scripts ran.
PAGES = ("index", "graph", "regressions", "changes")  # changes: regression_report's page
# What the DOM holds when a dependency failed: asv's error.html (its onerror handlers redirect
# there), and the wording this check was asked for, should a later asv show it inline.
FAILURE_MARKERS = ("JavaScript dependencies failed to load", "dependencies of airspeed velocity failed to load",
                   "Can not determine continental origin of swallow")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the browser left mid-file (a redirect)
            super().handle_error(request, client_address)


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` over http on 127.0.0.1, a free port, in a daemon thread; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _encode(value: str) -> str:
    """JavaScript's ``encodeURIComponent``, which asv's ``format_hash_string`` uses."""
    return urllib.parse.quote(value, safe="-_.!~*'()")


def graph_hash(index: dict, name: str, chosen: dict[str, str] | None = None) -> str:
    """The hash of ``name``'s graph page: ``#<name>?`` then ``key=value`` pairs joined by ``&``.

    ``p-<param>`` with the first value of each benchmark parameter, then ``chosen`` (``branch``,
    ``machine``, ``p-case``, ...), which replaces a value by key or adds a parameter. Machine and
    environment parameters are left out unless chosen, as in the benchmark grid's links, so the
    page selects every value of them and draws every machine's series. (asv's Benchmark list pins
    each to its first value instead, which draws nothing where machines disagree, e.g. one
    registered without its CPU fields.) Values are escaped as asv's ``format_hash_string`` does;
    the name is not, as in asv.js.
    """
    benchmark = index["benchmarks"][name]
    params = [(f"p-{param}", values[0]) for param, values in
              zip(benchmark.get("param_names", []), benchmark.get("params", []))]
    params = [(k, (chosen or {}).get(k, v)) for k, v in params]
    params += [(k, v) for k, v in (chosen or {}).items() if k not in dict(params)]
    return f"#{name}?" + "&".join(f"{_encode(k)}={_encode('[none]' if v is None else str(v))}" for k, v in params)


def drew_series(dom: str) -> bool:
    """Whether a graph page's DOM shows a plotted series: flot writes axis tick labels only for data."""
    return "tickLabel" in dom


def not_rendered(doms: dict[str, str], first: str, graphed: str) -> str | None:
    """Why the dashboard did not render, from the DOMs taken (``index`` and/or ``graph``), or None."""
    for page, dom in doms.items():
        failed = [m for m in FAILURE_MARKERS if m in dom]
        if failed:
            return f"the {page} page's DOM shows {failed[0]!r}"
    if "index" in doms and f'href="#{first}"' not in doms["index"]:  # summarygrid.js links every benchmark
        return f"the benchmark grid does not list {first}"
    if "graph" in doms and not drew_series(doms["graph"]):
        return f"the graph page of {graphed} drew no series (check --param against index.json)"
    return None


def find_chromium(name: str | None) -> str:
    for candidate in (name,) if name else CHROMIUM_NAMES:
        path = shutil.which(candidate)
        if path:
            return path
    raise SystemExit(f"mrcnn-bench asv screenshots: no Chromium found ({name or ', '.join(CHROMIUM_NAMES)}); "
                     "on Debian: apt-get install chromium")


def report_screenshots(folder: Path, out: Path, chromium: str, prog: str = "mrcnn-bench asv screenshots") -> int:
    """``mrcnn-bench report``'s pages (``index.html`` and every run's page) at 1400 px, no network."""
    pages = sorted(p.name for p in folder.glob("*.html"))
    if "index.html" not in pages:
        print(f"{prog}: no index.html in {folder} (run mrcnn-bench report ... --out {folder})",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    commands = []
    with serve(folder) as base:
        for page in pages:
            command = [chromium, *FLAGS, f"--screenshot={out / page.replace('.html', '.png')}", base + page]
            commands.append(shlex.join(command))
            subprocess.run(command, capture_output=True, timeout=CHROMIUM_TIMEOUT_S, check=True)
            print(f"{prog}: {out / page.replace('.html', '.png')}")
    (out / "commands.txt").write_text("\n".join(commands) + "\n")
    return 0


def build_parser(prog: str = "mrcnn-bench asv screenshots") -> argparse.ArgumentParser:
    """``mrcnn-bench asv screenshots``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="instead: screenshots of mrcnn-bench report's pages in DIR (index and each run)")
    parser.add_argument("--html-dir", type=Path, default=Path("results/html"), help="default: results/html")
    parser.add_argument("--out", type=Path, default=Path("results/asv/screenshots"),
                        help="default: results/asv/screenshots")
    parser.add_argument("--benchmark", default=None,
                        help="the benchmark of graph.png (default: the first in index.json)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a graph parameter as asv's URL names it, e.g. branch=asv-scratch or "
                             "p-case=\"'static/eager'\" (asv quotes a string parameter's value; unquoted, it "
                             "selects nothing)")
    parser.add_argument("--pages", default=",".join(PAGES),
                        help="the pages to take, a comma list of " + ", ".join(PAGES)
                        + " holding index or graph (default: all of them, %(default)s)")
    parser.add_argument("--chromium", default=None, help="the browser binary (default: the first of "
                        + ", ".join(CHROMIUM_NAMES) + " on PATH)")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv screenshots") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.report is not None:
        try:
            return report_screenshots(args.report, args.out, find_chromium(args.chromium), prog)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    index_json = args.html_dir / "index.json"
    if not (args.html_dir / "index.html").is_file() or not index_json.is_file():
        print(f"{prog}: no index.html and index.json in {args.html_dir} (run make asv-publish)",
              file=sys.stderr)
        return 2
    try:
        chromium = find_chromium(args.chromium)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    try:
        index = json.loads(index_json.read_text())
    except ValueError as e:  # not the file asv publish writes
        print(f"{prog}: {index_json} is not JSON ({e})", file=sys.stderr)
        return 2
    if not isinstance(index, dict) or not index.get("benchmarks"):
        print(f"{prog}: {index_json} lists no benchmarks", file=sys.stderr)
        return 2
    first = next(iter(index["benchmarks"]))
    graphed = args.benchmark or first
    bad = [p for p in args.param if "=" not in p]
    if bad:
        print(f"{prog}: --param {bad[0]!r} is not KEY=VALUE", file=sys.stderr)
        return 2
    chosen = dict(p.split("=", 1) for p in args.param)
    taken = [p.strip() for p in args.pages.split(",") if p.strip()]
    if set(taken) - set(PAGES) or not {"index", "graph"} & set(taken):
        print(f"{prog}: --pages {args.pages!r}: a comma list of {', '.join(PAGES)} "
              "holding index or graph (the pages whose DOM shows whether the scripts ran)", file=sys.stderr)
        return 2
    if graphed not in index["benchmarks"]:
        print(f"{prog}: no benchmark {graphed} in {index_json}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []

    def chromium_run(*extra: str) -> str:
        command = [chromium, *FLAGS, *extra]
        commands.append(shlex.join(command))
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return done.stdout

    doms: dict[str, str] = {}
    try:
        with serve(args.html_dir) as base:
            urls = {"index": "index.html", "graph": "index.html" + graph_hash(index, graphed, chosen),
                    "regressions": "index.html#regressions"
                    + (f"?branch={_encode(chosen['branch'])}" if "branch" in chosen else ""),
                    "changes": "changes.html"}
            pages = {name: urls[name] for name in PAGES if name in taken
                     and (name != "changes" or (args.html_dir / "changes.html").is_file())}
            for name, page in pages.items():
                chromium_run(f"--screenshot={args.out / (name + '.png')}", base + page)
            for name in ("index", "graph"):
                if name in pages:
                    doms[name] = chromium_run("--dump-dom", base + pages[name])
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    finally:
        # The port changes with each run; the commands are kept as run, for the record.
        (args.out / "commands.txt").write_text("\n".join(commands) + "\n")
    for name, dom in doms.items():
        (args.out / f"{name}.dom.html").write_text(dom)
    for name in pages:
        print(f"{prog}: {args.out / (name + '.png')}")
    why = not_rendered(doms, first, graphed)
    if why:
        seen = ", ".join(str(args.out / f"{name}.dom.html") for name in doms)
        print(f"{prog}: the dashboard did not render: {why} (see {seen})", file=sys.stderr)
        return 1
    seen_ok = {"index": f"the grid lists {first} and the other benchmarks",
               "graph": f"the graph of {graphed} drew its series"}
    print("dashboard_screenshots: rendered with no network; " + ", and ".join(seen_ok[name] for name in doms))
    return 0


"""The documentation: the README a newcomer reads on a screen or two, and the MkDocs site built strictly (a broken
link, anchor or API reference fails the build) and opened in headless Chromium as a person would."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

# On one xdist worker (`make test` runs two): its module fixture builds the site once.
pytestmark = pytest.mark.xdist_group("docs")

DOCS = REPO / "docs"


def build_site(source: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the project at `source` into `site`."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not our output
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(source / "mkdocs.yml"),
                           "-d", str(site)], cwd=source, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build_site(REPO, out)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_readme_fits_two_screens_and_links_only_to_pages_that_exist():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make report" in readme and "make test" in readme
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not re.match(r"\w+://", link)]
    assert local and all((REPO / link).exists() for link in local), [x for x in local if not (REPO / x).exists()]


def test_every_recipe_is_in_one_family_page_in_its_declared_order():
    from tfperf.cli import recipe_declarations

    found = [d.name for d in recipe_declarations()]
    listed = []
    for page in sorted((DOCS / "recipes").glob("*.md")):
        listed += re.findall(r"^\| `recipes/(\w+)\.py` \|", page.read_text(), flags=re.M)
    assert sorted(listed) == sorted(found)  # each recipe once
    order = {name: i for i, name in enumerate(found)}
    for page in (DOCS / "recipes").glob("*.md"):
        names = re.findall(r"^\| `recipes/(\w+)\.py` \|", page.read_text(), flags=re.M)
        assert names == sorted(names, key=order.get), page.name


def test_the_librarys_table_names_every_module_of_each_package_it_lists():
    page = (DOCS / "reference" / "index.md").read_text()
    for row in re.findall(r"^\| `(tfperf\.\w+)` \| (.*) \|$", page, flags=re.M):
        package, text = row
        modules = {p.stem for p in (REPO / package.replace(".", "/")).glob("*.py") if p.stem != "__init__"}
        assert modules and modules == modules & set(re.findall(r"`(\w+)`", text)), (package, modules - set(
            re.findall(r"`(\w+)`", text)))
    cluster = {p.stem for p in (REPO / "tfperf" / "cluster").glob("*.py") if p.stem not in ("__init__", "errors")}
    assert all(f"`{m}`" in page for m in cluster), cluster


def test_every_command_has_its_line_and_its_page():
    import argparse

    from tfperf.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    index = (DOCS / "commands" / "index.md").read_text()
    for name in commands:
        assert f"`{name}`" in index or f"tfperf {name}" in index, name
    questions = (DOCS / "questions.md").read_text()
    for name in ("watch", "doctor", "export", "inspect", "load", "serve", "compare"):
        assert f"tfperf {name}" in questions, name


def test_a_broken_link_fails_the_strict_build(tmp_path):
    copy = tmp_path / "project"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy)
    (copy / "tfperf").symlink_to(REPO / "tfperf")  # the API pages read the package's source
    page = copy / "docs" / "install.md"
    page.write_text(page.read_text() + "\nSee [the missing page](nowhere.md).\n")
    built = build_site(copy, tmp_path / "site")
    assert built.returncode != 0 and "nowhere.md" in built.stderr


def test_the_site_opens_in_a_browser_with_its_pages_and_the_api(site, browser, tmp_path):
    browser.events.clear()
    browser.open((site / "index.html").as_uri())
    seen = browser.evaluate("""(() => ({
        title: document.title, text: document.body.innerText,
        nav: Array.from(document.querySelectorAll('nav a'), a => a.textContent.trim()),
        broken_images: Array.from(document.images).filter(i => !i.complete || !i.naturalWidth).length}))()""")
    shot = browser.screenshot(tmp_path / "site.png").read_bytes()
    # Material's search runs in a web worker, which a page opened from the disk may not start: its words only.
    errors = [e for e in browser.errors() if "worker" not in e.lower()]
    assert errors == [] and seen["broken_images"] == 0, errors
    assert "tfperf doctor model.keras --quick" in seen["text"] and "What people come for" in seen["text"]
    assert {"Your question, the command", "Install", "tfperf doctor", "tfperf.measure"} <= set(seen["nav"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    # The API reference is generated from the docstrings: Timer and its measure() are there, with their words.
    browser.events.clear()  # open() waits for this page's load event, not the first one's
    browser.open((site / "reference" / "measure.html").as_uri())
    api = browser.evaluate("document.body.innerText")
    assert "Timer" in api and "measure" in api and "Measurement" in api

"""report.md as report.html: one self-contained file a browser opens without a server or a network (charts
inline), findings first, every other section folded, tables sortable by a click on their header.

Reports carry text from models nobody here wrote (layer and model names in the doctor's), so the HTML made
from the Markdown keeps only the tags and attributes a report uses: anything else shows as text."""

from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser
from pathlib import Path

from tfperf.records.jsonl import atomic_write_text

# What the Markdown of a report turns into, and the attributes each may keep.
ALLOWED = {
    "h1": (), "h2": (), "h3": (), "h4": (), "p": (), "br": (), "hr": (), "blockquote": (),
    "ul": (), "ol": (), "li": (), "strong": (), "em": (), "code": (), "pre": (),
    "table": (), "thead": (), "tbody": (), "tr": (), "th": ("style",), "td": ("style",),
    "a": ("href",), "img": ("src", "alt"), "details": (), "summary": (),
}
VOID = {"br", "hr", "img"}

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1150px; margin: 1.5em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { display: inline; font-size: 1.25em; } h3 { font-size: 1.05em; margin-top: 1.4em; }
details.section { border-top: 1px solid #ddd; padding: .5em 0; }
details.section > summary { cursor: pointer; }
section > h2 { display: block; }
table { border-collapse: collapse; margin: .6em 0; font-size: 13px; display: block; max-width: 100%; overflow-x: auto; }
td { overflow-wrap: break-word; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; } th[aria-sort="descending"]::after { content: " \\25BC"; }
code { background: #f4f4f4; padding: 0 3px; } img { max-width: 100%; }
"""

# Sort a table by the clicked column (numbers by value, text alphabetically; a second click reverses), and
# open the folded section a link or the address points to.
SCRIPT = """
function cellKey(cell) {
  const text = cell.textContent.trim();
  const number = text.replace(/,/g, '').match(/^-?\\d+(\\.\\d+)?(e[-+]?\\d+)?/i);
  return number ? [0, parseFloat(number[0]), text] : [1, 0, text.toLowerCase()];
}
function sortBy(th) {
  const table = th.closest('table'), body = table.tBodies[0], column = th.cellIndex;
  const ascending = th.getAttribute('aria-sort') !== 'ascending';
  table.querySelectorAll('th').forEach(h => h.removeAttribute('aria-sort'));
  th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = cellKey(a.cells[column]), y = cellKey(b.cells[column]);
    const order = x[0] - y[0] || (x[0] === 0 ? x[1] - y[1] : x[2].localeCompare(y[2]));
    return ascending ? order : -order;
  });
  rows.forEach(row => body.appendChild(row));
}
function openTarget() {
  const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target && target.tagName === 'DETAILS') { target.open = true; target.scrollIntoView(); }
}
document.querySelectorAll('th').forEach(th => th.addEventListener('click', () => sortBy(th)));
window.addEventListener('hashchange', openTarget);
openTarget();
"""


class _Cleaner(HTMLParser):
    """Rebuilds HTML keeping only ALLOWED tags and attributes; links only within the page, images only
    as inlined data; everything else becomes text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED:
            self.out.append(html.escape(self.get_starttag_text() or ""))
            return
        kept = []
        for name, value in attrs:
            value = value or ""
            if name not in ALLOWED[tag] or (name == "href" and not value.startswith("#")) or \
                    (name == "src" and not value.startswith("data:image/png;base64,")) or \
                    (name == "style" and not re.fullmatch(r"text-align: ?(left|right|center);?", value)):
                continue
            kept.append(f' {name}="{html.escape(value)}"')
        self.out.append(f"<{tag}{''.join(kept)}>")

    def handle_endtag(self, tag: str) -> None:
        if tag not in VOID:  # Markdown writes <img ... />: the parser reports an end it does not have
            self.out.append(f"</{tag}>" if tag in ALLOWED else html.escape(f"</{tag}>"))

    def handle_data(self, data: str) -> None:
        self.out.append(html.escape(data, quote=False))


def clean(markup: str) -> str:
    """`markup` with only the tags and attributes a report uses (see ALLOWED)."""
    cleaner = _Cleaner()
    cleaner.feed(markup)
    cleaner.close()
    return "".join(cleaner.out)


def inline_images(markup: str, folder: Path) -> str:
    """Each <img src="relative.png"> inside `folder` replaced by the image's bytes as a data: URI."""
    root = folder.resolve()

    def embed(match: re.Match) -> str:
        path = (folder / html.unescape(match.group(2))).resolve()
        if root not in path.parents or path.suffix.lower() != ".png" or not path.is_file():
            return match.group(0)  # not one of the report's charts: the cleaner drops it
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'{match.group(1)}data:image/png;base64,{data}"'

    return re.sub(r'(<img[^>]*?\bsrc=")([^"]+)"', embed, markup)


def section_id(heading: str) -> str:
    """The id a section's heading gets, the anchor Markdown viewers give it ('mnist_hvd', 'what-this-run-found')."""
    return re.sub(r"[^a-z0-9_-]+", "-", heading.strip().lower()).strip("-") or "section"


def to_html(markdown_text: str, folder: Path) -> str:
    """A whole page from a report's Markdown: its level-2 sections folded but the first (the findings) and
    any report of one part, charts inline."""
    import markdown

    def render(text: str) -> str:
        converted = markdown.markdown(text, extensions=["tables", "fenced_code", "md_in_html"])
        return clean(inline_images(converted, folder))

    head, *sections = re.split(r"^## ", markdown_text, flags=re.MULTILINE)
    title = re.search(r"^# (.+)$", head, flags=re.MULTILINE)
    body = [render(head)]
    for k, section in enumerate(sections):
        heading, _, rest = section.partition("\n")
        sid = section_id(heading)
        if k == 0 or len(sections) <= 2:  # the findings, or a report of one part (the doctor's)
            body.append(f'<section id="{sid}"><h2>{html.escape(heading)}</h2>{render(rest)}</section>')
        else:
            body.append(f'<details class="section" id="{sid}"><summary><h2>{html.escape(heading)}</h2></summary>'
                        f"{render(rest)}</details>")
    page_title = html.escape(title.group(1) if title else "tfperf report")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{page_title}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) +
            f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def write_html(report_md: Path | str) -> Path:
    """report.html beside report.md, made from it."""
    report_md = Path(report_md)
    path = report_md.with_suffix(".html")
    atomic_write_text(path, to_html(report_md.read_text(), report_md.parent))
    return path

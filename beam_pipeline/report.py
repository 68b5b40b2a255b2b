"""One self-contained HTML page about a dataset (``inspect OUTPUT --report report.html``; docs/leakage.md).

No network, no script: the charts are inline SVG drawn by matplotlib, the thumbnails inline JPEGs. Exact numbers
come from dataset.json; what needs the records (image sizes, formats, boxes, mask shares, the contact strips) comes
from ``sample`` records read by position (contact_sheet.sample: a fixed number whatever the dataset's size), and
says so. Rejects and near-duplicate pairs are streamed from their files until the page has what it shows, and the
few records the pairs need are found by one pass over index.jsonl that stops once it has them.

    counts = write_report(output, info, "report.html")
"""

from __future__ import annotations

import base64
import collections
import fractions
import hashlib
import html
import io
import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import examples, metadata
from .annotations import objects
from .contact_sheet import sample
from .index import INDEX_JSONL, read_index
from .inspection import _read_at
from .storage import open_lines
from .vocab.dataset_info import DatasetInfo

SAMPLE = 400  # records read for what dataset.json does not hold
PAIRS = 12  # near-duplicate pairs shown side by side (across splits first)
STRIP = 8  # thumbnails per class
CLASSES = 30  # classes in the strips and the chart
EXAMPLES = 3  # example names per reject reason
THUMB = 112
NO_LABEL = "(no label)"  # an unlabelled record's strip

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.name,th.name{text-align:left}.note{color:#666;font-size:12px}
.strip img,.pair img{border:1px solid #ccc;margin:2px;vertical-align:top}.pair{display:inline-block;margin:6px 12px}
.warn{color:#a40}
"""


def write_report(
    output: str, info: DatasetInfo, dest: str, *, n: int = SAMPLE, seed: int = 0, shown_as: str | None = None
) -> dict[str, int]:
    """Writes the page to ``dest`` (local or gs://); returns what it holds: sampled records, pairs shown.
    ``shown_as``: the folder the page names, when ``output`` is where the dataset is read now (a run's staging
    folder, before it is published there)."""
    page, counts = build_report(output, info, n=n, seed=seed, shown_as=shown_as)
    with FileSystems.create(dest, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        fh.write(page.encode("utf-8"))
    return counts


def build_report(
    output: str, info: DatasetInfo, *, n: int = SAMPLE, seed: int = 0, shown_as: str | None = None
) -> tuple[str, dict[str, int]]:
    picks = sample(output, info, n, seed, None, keep=_Digests()) if info.examples else []
    pairs = _pairs(output, info)
    parts = [
        f"<h1>{_e(info.name)}</h1>",
        _overview(shown_as or output, info),
        _changes(info),
        _splits(info),
        _sizes(picks, info),
        _formats(picks, info),
        _rejects(output, info),
        _near(output, info, pairs),
        _strips(picks, info),
        _objects(picks, info),
        _masks(picks),
    ]
    body = "\n".join(p for p in parts if p)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(info.name)}: dataset report</title><style>{_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
    return page, {"sampled": len(picks), "groups": len(pairs)}


class _Digests:
    """What the page needs of each sampled record, kept in its place as it is read (400 records of 20 MB images
    would be 8 GB): the image's size and stored format, its labels, boxes and their classes, its mask's pixels
    per class id, and a thumbnail while one of its classes has fewer than STRIP (decoding 400 large images for
    three strips of 8 would be most of the page's time)."""

    def __init__(self) -> None:
        self._thumbs: collections.Counter[str] = collections.Counter()

    def __call__(self, ex: Mapping[str, list[Any]]) -> dict[str, Any]:
        from PIL import Image

        data = ex[examples.ENCODED][0]
        try:
            with Image.open(io.BytesIO(data)) as img:
                size: tuple[int, int] | None = img.size
        except Exception:  # noqa: BLE001 - a record whose image Pillow cannot open is left out of the size charts
            size = None
        labels = [b.decode("utf-8", "replace") for b in ex.get(examples.LABEL_TEXT, [])]
        wanted = [name for name in labels or [NO_LABEL] if self._thumbs[name] < STRIP]
        self._thumbs.update(wanted)
        digest: dict[str, Any] = {
            "size": size,
            "format": bytes((ex.get(examples.FORMAT) or [b"?"])[0]).decode("ascii", "replace"),
            "labels": labels,
            "thumb": _thumb(data) if wanted else None,  # "" for an image Pillow cannot draw
            "mask": _mask_counts(ex),
        }
        for key in (objects.XMIN, objects.XMAX, objects.YMIN, objects.YMAX, objects.CLASS_TEXT):
            if key in ex:
                digest[key] = list(ex[key])
        return digest


def _mask_counts(ex: Mapping[str, list[Any]]) -> dict[int, int] | None:
    """A record's mask: pixels per class id; None without one, {} for one Pillow cannot read."""
    from .annotations.masks import SEGMENTATION_ENCODED

    if not ex.get(SEGMENTATION_ENCODED):
        return None
    import numpy as np
    from PIL import Image

    try:
        values, n = np.unique(np.asarray(Image.open(io.BytesIO(ex[SEGMENTATION_ENCODED][0]))), return_counts=True)
    except Exception:  # noqa: BLE001 - a mask Pillow cannot read is left out of the shares
        return {}
    return dict(zip(values.tolist(), n.tolist(), strict=True))


# ---- sections -----------------------------------------------------------------------------------------


def _overview(output: str, info: DatasetInfo) -> str:
    made = ", ".join(f"{k} {v}" for k, v in info.versions.items())
    return (
        f'<p id="overview" data-examples="{info.examples}" data-bytes="{info.bytes}" data-status="{_e(info.status)}">'
        f"{info.examples:,} examples, {info.bytes / 1e6:,.1f} MB of {_e(info.format)} shards in {_e(output)}; "
        f"status {_e(info.status)}"
        f'</p><p class="note">made with {_e(made)}</p>'
    )


def _splits(info: DatasetInfo) -> str:
    splits = list(info.splits)
    totals: collections.Counter[str] = collections.Counter()
    for s in info.splits.values():
        totals.update(s.labels or {})
    labels = [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]
    head = "".join(f'<th data-split="{_e(s)}">{_e(s)}</th>' for s in splits)
    rows = [
        f'<tr data-label="{_e(label)}"><td class="name">{_e(label)}</td>'
        + "".join(
            f'<td data-split="{_e(s)}" data-count="{(info.splits[s].labels or {}).get(label, 0)}">'
            f"{(info.splits[s].labels or {}).get(label, 0):,}</td>"
            for s in splits
        )
        + "</tr>"
        for label in labels
    ]
    total = "".join(
        f'<td data-split="{_e(s)}" data-examples="{info.splits[s].examples}">{info.splits[s].examples:,}</td>'
        for s in splits
    )
    table = (
        f'<table id="split-classes"><tr><th class="name">class</th>{head}</tr>{"".join(rows)}'
        f'<tr class="total"><th class="name">examples</th>{total}</tr></table>'
    )
    chart = ""
    if labels:
        top = labels[:CLASSES]
        chart = _svg_bars(
            top, {s: [(info.splits[s].labels or {}).get(k, 0) for k in top] for s in splits}, "images per class"
        )
    more = (
        f'<p class="note">the chart shows the {CLASSES} largest of {len(labels)} classes</p>'
        if len(labels) > CLASSES
        else ""
    )
    return f'<section id="splits"><h2>Splits and classes</h2>{table}{chart}{more}</section>'


def _sizes(picks: Sequence[Mapping[str, Any]], info: DatasetInfo) -> str:
    sizes = [tuple(ex["size"]) for ex in picks if ex["size"]]
    sides = [min(w, h) for w, h in sizes]
    ratios = [round(w / h, 2) for w, h in sizes]
    exact = (info.image_sizes or {}).get("shorter_side") or {}
    buckets = "".join(
        f'<tr data-bucket="{_e(k)}" data-count="{n}"><td class="name">{_e(k)}</td><td>{n:,}</td></tr>'
        for k, n in exact.items()
    )
    table = (
        '<p>every record, by shorter side (pixels):</p><table id="size-buckets"><tr><th class="name">shorter side'
        f"</th><th>records</th></tr>{buckets}</table>"
        if buckets
        else ""
    )
    if not sides:
        return f'<section id="sizes"><h2>Image sizes</h2>{table}</section>' if table else ""
    note = _sampled(len(picks), info.examples)
    sampled = "sampled " if len(picks) < info.examples else ""
    n = f"{len(sizes):,} {sampled}images"
    if len(set(sizes)) == 1:  # one size: a sentence, not two one-bar charts
        ((w, h),) = set(sizes)
        said = f"all {n} are" if len(sizes) > 1 else f"the one {sampled}image is"
        said += f" {w}×{h} px (aspect ratio {_ratio(sizes)})"
        return (
            f'<section id="sizes"><h2>Image sizes</h2><p data-sampled="{len(picks)}" data-size="{w}x{h}">{said}; '
            f"{note}</p>{table}</section>"
        )
    if len(set(sides)) == 1:  # 240×320 and 320×240: one shorter side, two aspect ratios
        facts, chart = [f"every shorter side is {sides[0]} px"], ""
    else:
        median = statistics.median(sides)
        facts = [f"median shorter side {median:g} px, from {min(sides)} to {max(sides)} px"]
        chart = _svg_hist(sides, "shorter side (pixels)")
    if len(set(ratios)) == 1:
        facts.append(f"all {n} have aspect ratio {_ratio(sizes)}")
    else:
        chart += _svg_hist(ratios, "aspect ratio (width / height)")
    return (
        f'<section id="sizes"><h2>Image sizes</h2><p data-sampled="{len(picks)}">{", ".join(facts)}; '
        f"{note}</p>{chart}{table}</section>"
    )


def _formats(picks: Sequence[Mapping[str, Any]], info: DatasetInfo) -> str:
    seen = collections.Counter(ex["format"] for ex in picks)
    rows = "".join(f'<tr><td class="name">{_e(k)}</td><td>{v:,}</td></tr>' for k, v in seen.most_common())
    conv = "".join(
        f'<tr data-converted="{_e(k)}"><td class="name">{_e(k)}</td><td>{v:,}</td></tr>'
        for k, v in info.converted.items()
    )
    converted = (
        '<p>converted to PNG or JPEG (every record):</p><table id="converted">'
        f'<tr><th class="name">from</th><th>images</th></tr>{conv}</table>'
        if conv
        else "<p>no image was converted: every record stores its file's bytes</p>"
    )
    return (
        f'<section id="formats"><h2>Formats</h2><table><tr><th class="name">stored as</th><th>records</th></tr>'
        f'{rows}</table><p class="note">{_sampled(len(picks), info.examples)}</p>{converted}</section>'
    )


def _rejects(output: str, info: DatasetInfo) -> str:
    by_reason = info.rejects.by_reason
    if not by_reason:
        return '<section id="rejects"><h2>Rejects</h2><p data-rejects="0">none</p></section>'
    names: dict[str, list[str]] = {r: [] for r in by_reason}
    path = FileSystems.join(output, metadata.REJECTS_JSONL)
    if FileSystems.exists(path):
        with open_lines(path) as fh:
            for raw in fh:
                if all(len(v) >= min(EXAMPLES, by_reason[r]) for r, v in names.items()):
                    break  # every reason has its examples: the rest of the file is not read
                try:
                    row = json.loads(raw)
                except ValueError:
                    continue
                got = names.get(row.get("reason"))
                if got is not None and len(got) < EXAMPLES:
                    got.append(str(row.get("path")))
    rows = "".join(
        f'<tr data-reason="{_e(r)}" data-count="{n}"><td class="name">{_e(r)}</td><td>{n:,}</td>'
        f'<td class="name">{_e(", ".join(names[r]))}</td></tr>'
        for r, n in by_reason.items()
    )
    return (
        f'<section id="rejects"><h2>Rejects</h2><p data-rejects="{info.rejects.total}">{info.rejects.total:,} inputs '
        f'rejected (rejects.jsonl)</p><table><tr><th class="name">reason</th><th>inputs</th>'
        f'<th class="name">for example</th></tr>{rows}</table></section>'
    )


def _pairs(output: str, info: DatasetInfo) -> list[dict[str, Any]]:
    """Up to PAIRS groups to show, the surest first, those across splits first among equals (an older run's
    pairs as groups of two). The file is streamed with PAIRS groups in memory, and left once it holds PAIRS
    exact groups across splits (nothing can come before them)."""
    from .near_duplicates import LEVELS, groups_of_file

    if not info.near_duplicates:
        return []
    path = FileSystems.join(output, metadata.NEAR_DUPLICATES_JSONL)
    if not FileSystems.exists(path):
        return []
    best: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    with open_lines(path) as fh:
        for n, group in enumerate(groups_of_file(json.loads(raw) for raw in fh if raw.strip())):
            rank = (-LEVELS.index(group.get("confidence", "likely")), -int(len(group["splits"]) > 1), n)
            if len(best) < PAIRS or rank < best[-1][0]:
                best = sorted([*best, (rank, group)], key=lambda kv: kv[0])[:PAIRS]
            if len(best) == PAIRS and best[-1][0][:2] == (-(len(LEVELS) - 1), -1):
                break
    return [group for _, group in best]


def _near(output: str, info: DatasetInfo, groups: Sequence[Mapping[str, Any]]) -> str:
    from .images.phash import CONFIRM_NAME
    from .near_duplicates import block_lines

    near = info.near_duplicates
    if not near:
        off = "<p>not searched (--near-duplicates off)</p>"
        return f'<section id="near-duplicates"><h2>Near-duplicates</h2>{off}</section>'
    text, across_counts = block_lines(near)
    counts = (near.get("groups") if near.get("format") else near.get("pairs")) or {}
    unit = "groups" if near.get("format") else "pairs"
    rows = "".join(
        f'<tr data-key="{_e(k)}" data-count="{v}"><td class="name">{_e(k)}</td><td>{v:,}</td></tr>'
        for k, v in counts.items()
    )
    wanted = {p for group in groups for p in _shown_paths(group)}
    thumbs = _thumbs_by_path(output, wanted)
    shown = "".join(_group_html(group, thumbs) for group in groups)
    across = near.get("across_splits", 0)
    warn = ' class="warn"' if across else ""
    how = f"pHash ({_e(str(near.get('hash')))}) within {near.get('max_distance')} bits"
    if near.get("format"):
        how += f", confirmed by {_e(str(near.get('confirm', CONFIRM_NAME)))}"
    if not counts:
        hashed = near.get("images_hashed", 0)
        return (
            '<section id="near-duplicates"><h2>Near-duplicates</h2>'
            f'<p data-across="0">No near-duplicates: no two of the {hashed:,} images hashed look alike ({how}).'
            "</p></section>"
        )
    return (
        '<section id="near-duplicates"><h2>Near-duplicates</h2>'
        f'<p{warn} data-across="{across}">{_e(text)} ({how})</p>'
        f'<table><tr><th class="name">splits</th><th>{unit}</th></tr>{rows}</table>'
        f"<p>The surest first, up to {PAIRS}:</p>{shown}</section>"
    )


def _shown_paths(group: Mapping[str, Any]) -> list[str]:
    """The images of a group the page shows: its closest tie's two, then its other listed images, up to 4."""
    ties = group.get("ties") or []
    first = [ties[0]["a"], ties[0]["b"]] if ties else []
    rest = [p for p in group["group"] if p not in first]
    return (first + rest)[:4]


def _group_html(group: Mapping[str, Any], thumbs: Mapping[str, Any]) -> str:
    ties = group.get("ties") or []
    closest = f", closest {ties[0]['distance']} bits" if ties else ""
    splits = ", ".join(f"{k} {n}" for k, n in group["splits"].items())
    images = "".join(_img(thumbs.get(p), p) for p in _shown_paths(group))
    return (
        f'<div class="pair" data-images="{group["images"]}" data-confidence="{_e(group.get("confidence", ""))}">'
        f'{images}<br><span class="note">{group["images"]:,} images ({_e(splits)}) · '
        f"{_e(group.get('confidence', ''))}{closest} · {_e(group['group'][0])}</span></div>"
    )


def _strips(picks: Sequence[Mapping[str, Any]], info: DatasetInfo) -> str:
    by_class: dict[str, list[str]] = collections.defaultdict(list)
    for ex in picks:
        for name in ex["labels"] or [NO_LABEL]:
            if len(by_class[name]) < STRIP and ex["thumb"] is not None:
                by_class[name].append(ex["thumb"])
    if not by_class:
        return ""
    rows = "".join(
        f'<div class="strip" data-label="{_e(k)}"><b>{_e(k)}</b><br>' + "".join(_img(url, k) for url in v) + "</div>"
        for k, v in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:CLASSES]
    )
    note = _sampled(len(picks), info.examples)
    return f'<section id="strips"><h2>A strip per class</h2><p class="note">{note}</p>{rows}</section>'


def _objects(picks: Sequence[Mapping[str, Any]], info: DatasetInfo) -> str:
    if info.categories is None or info.objects is None:
        return ""
    per_image = [len(ex.get(objects.XMIN, [])) for ex in picks]
    sizes = [
        round(((x1 - x0) * (y1 - y0)) ** 0.5, 3)
        for ex in picks
        for x0, x1, y0, y1 in zip(
            ex.get(objects.XMIN, []),
            ex.get(objects.XMAX, []),
            ex.get(objects.YMIN, []),
            ex.get(objects.YMAX, []),
            strict=False,
        )
    ]
    classes = collections.Counter(c for ex in picks for c in ex.get(objects.CLASS_TEXT, []))
    names = [c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c) for c, _ in classes.most_common(CLASSES)]
    chart = (
        _svg_bars(names, {"objects": [n for _, n in classes.most_common(CLASSES)]}, "objects per class (sampled)")
        if names
        else ""
    )
    return (
        f'<section id="objects"><h2>Objects</h2><p data-kept="{info.objects.kept}">{info.objects.kept:,} objects kept, '
        f"{info.objects.rejects.total:,} rejected</p>{chart}"
        + (_svg_hist(per_image, "boxes per image") if per_image else "")
        + (_svg_hist(sizes, "box size (square root of its area, share of the image)") if sizes else "")
        + f'<p class="note">{_sampled(len(picks), info.examples)}</p></section>'
    )


def _masks(picks: Sequence[Mapping[str, Any]]) -> str:
    masks = [ex["mask"] for ex in picks if ex["mask"] is not None]
    if not masks:
        return ""
    counts: collections.Counter[int] = collections.Counter()
    for found in masks:
        counts.update(found)
    total = sum(counts.values()) or 1  # every sampled mask unreadable: an empty table
    rows = "".join(f"<tr><td>{k}</td><td>{100 * v / total:.1f} %</td></tr>" for k, v in sorted(counts.items()))
    return (
        f'<section id="masks"><h2>Mask pixels per class</h2><table><tr><th>class id</th><th>pixels</th></tr>{rows}'
        f'</table><p class="note">from {len(masks)} sampled masks</p></section>'
    )


def _changes(info: DatasetInfo) -> str:
    """An --incremental-from run's night, near the top: the notes of dataset.json's ``changes`` (those the summary
    prints) and the listed files against the previous dataset (its ``incremental``), the first dropped files
    named (dataset.json's ``dropped_first``)."""
    changes, inc = info.changes, info.incremental
    if not changes and inc is None:
        return ""
    notes = ""
    if changes:
        notes = "".join(f"<li>{_e(n)}</li>" for n in changes.get("notes") or [])
        notes = f"<ul>{notes or '<li>nothing moved past the share</li>'}</ul>"
    files = ""
    if inc is not None:
        counts = ", ".join(f"{k} {getattr(inc, k):,}" for k in ("unchanged", "added", "changed", "dropped"))
        named = ", ".join(_e(p) for p in inc.dropped_first)
        rest = inc.dropped - len(inc.dropped_first)
        where = (
            f"; the other {rest:,} are the records of {_e(inc.source)}/index.jsonl that this index.jsonl does not list"
            if rest > 0
            else ""
        )
        gone = (
            f'<p class="note" data-dropped-named="{len(inc.dropped_first)}">dropped (records of the previous '
            f"dataset whose file was not listed this time): {named or 'not named by this version'}{where}</p>"
            if inc.dropped
            else ""
        )
        files = (
            f'<p data-dropped="{inc.dropped}">listed files against {_e(inc.source)}: {counts}; '
            f"{inc.reused:,} records reused, {inc.converted:,} converted</p>{gone}"
        )
    return f'<section id="changes"><h2>Since the previous night</h2>{notes}{files}</section>'


# ---- pieces -------------------------------------------------------------------------------------------


def _thumbs_by_path(output: str, wanted: set[str]) -> dict[str, str]:
    """Thumbnails (data URLs) of the records of ``wanted`` paths: index.jsonl read until it has them all."""
    found: dict[str, tuple[str, int]] = {}
    path = FileSystems.join(output, INDEX_JSONL)
    if not wanted or not FileSystems.exists(path):
        return {}
    for entry in read_index(path):
        if entry.get("path") in wanted and entry["path"] not in found:
            found[entry["path"]] = (entry["shard"], int(entry["record"]))
            if len(found) == len(wanted):
                break
    by_shard: dict[str, dict[int, str]] = collections.defaultdict(dict)
    for p, (shard, i) in found.items():
        by_shard[shard][i] = p
    out = {}
    for shard, wanted_here in by_shard.items():
        for i, record in _read_at(FileSystems.join(output, shard), set(wanted_here)):
            out[wanted_here[i]] = _thumb(examples.parse_example(record)[examples.ENCODED][0])
    return out


def _thumb(data: bytes) -> str:
    from PIL import Image, ImageOps

    try:
        img = Image.open(io.BytesIO(data))
        img.seek(0)
        img.draft("RGB", (THUMB, THUMB))  # a JPEG decoded at the smallest DCT scale still THUMB a side or more
        small = ImageOps.contain(img.convert("RGB"), (THUMB, THUMB))
    except Exception:  # noqa: BLE001 - a record Pillow cannot draw shows no thumbnail
        return ""
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(url: str | None, alt: str) -> str:
    return f'<img src="{url}" alt="{_e(alt)}" width="{THUMB}">' if url else f'<span class="note">[{_e(alt)}]</span>'


def _ratio(sizes: Sequence[tuple[int, int]]) -> str:
    """The aspect ratio (width / height) the ``sizes`` share once rounded to 2 places: ``4:3`` when they are all
    exactly that and it is a ratio of small numbers, else the rounded number."""
    exact = {fractions.Fraction(w, h) for w, h in sizes}
    if len(exact) == 1:
        (f,) = exact
        if f.denominator <= 32 and f.numerator <= 32:
            return f"{f.numerator}:{f.denominator}"
    w, h = sizes[0]
    return f"{round(w / h, 2):g}"


def _sampled(n: int, total: int) -> str:
    return f"sampled: {n:,} of {total:,} records" if n < total else f"all {total:,} records"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


# The same data gives the same page (clip-path ids are otherwise random), and a class named "$x$" is text,
# not mathtext (which refuses some names and would stop the report).
_RC = {"svg.hashsalt": "beam_pipeline report", "text.parse_math": False}


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    # no date, creator or RDF block: the same data gives the same page
    fig.savefig(
        buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None, "Format": None, "Type": None}
    )
    plt.close(fig)
    text = buf.getvalue()
    return _own_ids(text[text.index("<svg") :])  # the XML declaration and DOCTYPE do not belong inside HTML


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(url\(#|href="#)([^)"]+)')


def _own_ids(svg: str) -> str:
    """The chart's element ids (figure_1, patch_1, glyph and clip-path ids: the same in every chart matplotlib
    draws) prefixed with a hash of the chart, and every reference to them: ids unique in the page, as HTML
    wants, and a chart's clip path or glyph is never another chart's of the same name."""
    prefix = "c" + hashlib.sha256(svg.encode("utf-8")).hexdigest()[:8] + "-"
    svg = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    return _REF.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", svg)


def _svg_bars(names: Sequence[str], series: Mapping[str, Sequence[int]], title: str) -> str:
    import matplotlib

    with matplotlib.rc_context(_RC):
        return _svg(_bars_figure(names, series, title))


def _bars_figure(names: Sequence[str], series: Mapping[str, Sequence[int]], title: str) -> Any:
    """Horizontal stacked bars, one colour per series; the legend (more than one series) stands right of the
    axes, never over a bar (outside the figure: _svg's bbox_inches="tight" widens the drawing to hold it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    legend = len(series) > 1
    fig, ax = plt.subplots(figsize=(7, 0.25 * len(names) + 1))
    left = [0] * len(names)
    for name, values in series.items():
        ax.barh(range(len(names)), values, left=left, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(range(len(names)), [n[:24] for n in names])
    ax.invert_yaxis()
    ax.set_title(title)
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, frameon=False)
    return fig


def _svg_hist(values: Iterable[float], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(5, 2.4))
        ax.hist(list(values), bins=20)
        ax.set_title(title)
        return _svg(fig)

"""``inspect OUTPUT --report FILE.html`` (report.py): one self-contained page, loaded in a real browser.

The browser is Debian's Chromium, headless (scripts/test.sh installs it as root; the test says how to get it
otherwise). The page must load with no console message, draw something (the screenshot is not one colour),
and the numbers read back from the DOM Chromium built must equal dataset.json's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from .conftest import BUCKET, run_cli
from .test_near_duplicates import QUICK, leaky_folder

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Numbers(HTMLParser):
    """The data-* attributes of a page, element by element."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[dict[str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = {k: v or "" for k, v in attrs}
        if any(k.startswith("data-") for k in found):
            self.elements.append(found)


def numbers(page: str) -> Numbers:
    parser = Numbers()
    parser.feed(page)
    return parser


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "Chromium is not installed: scripts/test.sh installs Debian's chromium (apt-get install chromium)"
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("report")
    leaky_folder(base / "in")
    (base / "in" / "cats" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    out = base / "out"
    r = run_cli("convert", "--input", str(base / "in"), "--output", str(out), *QUICK)
    assert r.returncode == 0, r.stderr
    return out


def check_against_dataset_json(found: Numbers, info: dict) -> None:
    by = list(found.elements)
    overview = next(e for e in by if "data-examples" in e and "data-bytes" in e)
    assert int(overview["data-examples"]) == info["examples"]
    cells = {(e["data-split"], label): int(e["data-count"]) for e, label in _cells(by)}
    for split, s in info["splits"].items():
        for label, n in s["labels"].items():
            assert cells[(split, label)] == n
        total = next(e for e in by if e.get("data-split") == split and "data-examples" in e)
        assert int(total["data-examples"]) == s["examples"]
    reasons = {e["data-reason"]: int(e["data-count"]) for e in by if "data-reason" in e}
    assert reasons == info["rejects"]["by_reason"]
    groups = {e["data-key"]: int(e["data-count"]) for e in by if "data-key" in e}
    assert groups == info["near_duplicates"]["groups"]
    across = next(e for e in by if "data-across" in e)
    assert int(across["data-across"]) == info["near_duplicates"]["across_splits"]
    buckets = {e["data-bucket"]: int(e["data-count"]) for e in by if "data-bucket" in e}
    assert buckets == info["image_sizes"]["shorter_side"]


def _cells(elements: list[dict[str, str]]):
    label = None
    for e in elements:
        if "data-label" in e and "data-split" not in e and e.get("class") != "strip":
            label = e["data-label"]
        elif "data-count" in e and "data-split" in e and label is not None:
            yield e, label


@pytest.mark.e2e
def test_the_report_is_one_file_whose_numbers_are_dataset_json(dataset, tmp_path):
    page_file = tmp_path / "report.html"
    r = run_cli("inspect", str(dataset), "--report", str(page_file))
    assert r.returncode == 0, r.stderr
    assert f"-> {page_file}" in r.stdout
    page = page_file.read_text()
    # self-contained: nothing to fetch (XML namespace names are names, not fetched), no script
    assert not re.search(r"""(src|href|xlink:href)\s*=\s*["']?(https?:|//)|url\(\s*["']?(https?:|//)|@import""", page)
    assert "<metadata>" not in page and "<dc:date>" not in page
    parsed = numbers(page)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    pairs = re.findall(r'<div class="pair"[^>]*>(.*?)</div>', page, re.S)
    assert pairs and all(p.count("data:image/jpeg;base64,") == 2 for p in pairs)  # both images of each group
    strips = re.findall(r'<div class="strip"[^>]*>(.*?)</div>', page, re.S)
    assert strips and all("data:image/jpeg;base64," in p for p in strips)
    assert parsed.tags.count("svg") >= 3  # the class chart, sizes and aspect ratios
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # unique in the page, as HTML wants: each chart's own
    assert set(re.findall(r'(?:url\(#|href="#)([^)"]+)', page)) <= set(ids)  # every reference finds its element
    check_against_dataset_json(parsed, json.loads((dataset / "dataset.json").read_text()))
    again = tmp_path / "again.html"
    assert run_cli("inspect", str(dataset), "--report", str(again)).returncode == 0
    assert again.read_bytes() == page_file.read_bytes()  # the same data, the same page


@pytest.mark.e2e
def test_chromium_loads_the_report_without_a_console_message_and_draws_it(dataset, tmp_path):
    page_file = tmp_path / "report.html"
    assert run_cli("inspect", str(dataset), "--report", str(page_file)).returncode == 0
    # the check can fail: a page that logs an error shows up in Chromium's log
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><body><script>console.error('control')</script></body></html>")
    logged = chromium("--dump-dom", control.as_uri(), profile=tmp_path / "profile-control")
    assert any("CONSOLE" in line and "control" in line for line in logged.stderr.splitlines()), logged.stderr[-2000:]
    url = page_file.as_uri()
    dom = chromium("--dump-dom", url, profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    check_against_dataset_json(numbers(dom.stdout), json.loads((dataset / "dataset.json").read_text()))

    shot = tmp_path / "shot.png"
    r = chromium("--window-size=1200,1600", f"--screenshot={shot}", url, profile=tmp_path / "profile-shot")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    from PIL import Image

    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # not blank: text, charts and thumbnails


@pytest.mark.e2e
@pytest.mark.smoke
def test_convert_report_publishes_the_page_with_the_dataset_and_a_later_run_without_it_removes_it(dataset, tmp_path):
    out = tmp_path / "out"
    r = run_cli("convert", "--input", str(dataset.parent / "in"), "--output", str(out), *QUICK, "--report")
    assert r.returncode == 0, r.stderr
    page = (out / "report.html").read_bytes()
    info = json.loads((out / "dataset.json").read_text())
    assert info["report"] == {"file": "report.html", "sampled": info["examples"], "groups": 6}
    assert (
        f"report       {info['examples']:>8} sampled records, 6 near-duplicate groups shown -> report.html" in r.stdout
    )
    check_against_dataset_json(numbers(page.decode()), info)
    # the page read from the staging folder is the one inspect draws of the published dataset (it names the output)
    again = tmp_path / "inspected.html"
    assert run_cli("inspect", str(out), "--report", str(again), "--seed", str(info["seed"])).returncode == 0
    assert again.read_bytes() == page
    assert run_cli("inspect", str(out), "--verify").returncode == 0
    # report.html is the tool's own file: --overwrite replaces the dataset, and a run without --report removes the
    # page, which would describe the old data
    r = run_cli("convert", "--input", str(dataset.parent / "in"), "--output", str(out), *QUICK, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert not (out / "report.html").exists() and (out / "_SUCCESS").exists()


@pytest.mark.e2e
def test_a_page_that_cannot_be_drawn_is_named_and_the_dataset_publishes(dataset, tmp_path, monkeypatch):
    """The page is a view of the dataset, not part of it: its failure is said, and an earlier run's page (of
    other data) goes."""
    from beam_pipeline import report

    out = tmp_path / "out"
    args = ("convert", "--input", str(dataset.parent / "in"), "--output", str(out), *QUICK, "--report")
    assert run_cli(*args).returncode == 0
    assert (out / "report.html").exists()

    def cut_short(_output, _info, dest, **_kwargs):  # half a page written, then the disk is full
        Path(dest).write_text("<!DOCTYPE html><html><body>half")
        raise OSError("no space left on device")

    monkeypatch.setattr(report, "write_report", cut_short)
    r = run_cli(*args, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert "report       not written (OSError: no space left on device)" in r.stdout
    info = json.loads((out / "dataset.json").read_text())
    assert info["report"] == {"file": None, "error": "OSError: no space left on device"}
    assert not (out / "report.html").exists() and (out / "_SUCCESS").exists()


@pytest.mark.e2e
def test_the_report_of_a_gs_output_is_written_to_gs(dataset, gcs, tmp_path):
    """inspect --report into the bucket, and convert --report's page, published there with the dataset."""
    bucket_dir = f"gs://{BUCKET}/report-test"
    r = run_cli("convert", "--input", str(dataset.parent / "in"), "--output", bucket_dir, *QUICK, "--report")
    assert r.returncode == 0, r.stderr
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(f"{bucket_dir}/dataset.json") as fh:
        info = json.loads(fh.read())
    r = run_cli("inspect", bucket_dir, "--report", f"{bucket_dir}/inspected.html", "--seed", str(info["seed"]))
    assert r.returncode == 0, r.stderr
    with FileSystems.open(f"{bucket_dir}/inspected.html") as fh:
        page = fh.read().decode("utf-8")
    with FileSystems.open(f"{bucket_dir}/report.html") as fh:
        published = fh.read().decode("utf-8")
    assert published == page
    check_against_dataset_json(numbers(page), info)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "flags",
    [("--compression", "gzip"), ("--labels-from", "none")],
    ids=["gzip-shards-and-a-dollar-class", "unlabelled"],
)
def test_the_report_of_other_datasets(tmp_path, flags):
    from .imagegen import encode, photo_like

    for label in ("$x$", "<b>"):
        (tmp_path / "in" / label).mkdir(parents=True)
        for i in range(6):
            (tmp_path / "in" / label / f"{i}.jpg").write_bytes(encode(photo_like(300 + i, 64, 48), "JPEG"))
    out = tmp_path / "out"
    r = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(out), *QUICK, *flags)
    assert r.returncode == 0, r.stderr
    page_file = tmp_path / "report.html"
    r = run_cli("inspect", str(out), "--report", str(page_file))
    assert r.returncode == 0, r.stderr
    page = page_file.read_text()
    assert page.count("<b>") == page.count("</b>")  # the class named "<b>" is text, never markup
    if "--labels-from" not in flags:
        assert "&lt;b&gt;" in page and "$x$" in page
    info = json.loads((out / "dataset.json").read_text())
    overview = next(e for e in numbers(page).elements if "data-bytes" in e)
    assert int(overview["data-examples"]) == info["examples"] == 12
    assert re.findall(r'<div class="strip"', page)


# ---- the page's pieces, in process (no browser, no dataset on disk) ----------------------------------------


def _info(**extra):
    from beam_pipeline.vocab.dataset_info import DatasetInfo

    return DatasetInfo.from_json({"name": "x", "splits": {}, **extra})


@pytest.mark.unit
def test_the_class_chart_legend_stands_beside_the_bars_never_over_them():
    import matplotlib.pyplot as plt

    from beam_pipeline import report

    names = [f"class {i}" for i in range(12)]
    series = {s: [100 - 5 * i for i in range(12)] for s in ("train", "validation", "test")}
    fig = report._bars_figure(names, series, "images per class")
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.x0 >= axes.x1  # right of the axes: no bar under it
    finally:
        plt.close(fig)
    width = lambda svg: float(re.search(r'<svg[^>]*\bwidth="([\d.]+)pt"', svg).group(1))
    one = report._svg_bars(names, {"train": series["train"]}, "images per class")
    assert width(report._svg_bars(names, series, "images per class")) > width(one)  # the legend is in the drawing


@pytest.mark.unit
@pytest.mark.parametrize(
    "sizes,examples,said,charts",
    [
        ([(64, 48)] * 5, 5, "all 5 images are 64×48 px (aspect ratio 4:3); all 5 records", 0),
        ([(64, 48)] * 5, 100, "all 5 sampled images are 64×48 px (aspect ratio 4:3); sampled: 5 of 100 records", 0),
        ([(64, 48)], 1, "the one image is 64×48 px (aspect ratio 4:3)", 0),
        ([(64, 48), (128, 96)], 2, "all 2 images have aspect ratio 4:3", 1),
        ([(48, 64), (64, 48)], 2, "every shorter side is 48 px", 1),
        ([(64, 48), (100, 100)], 2, "median shorter side 74 px, from 48 to 100 px", 2),
    ],
    ids=["one-size", "one-size-sampled", "one-image", "one-ratio", "one-shorter-side", "varied"],
)
def test_one_image_size_is_a_sentence_not_a_one_bar_chart(sizes, examples, said, charts):
    from beam_pipeline import report

    section = report._sizes([{"size": s} for s in sizes], _info(examples=examples))
    assert said in section
    assert section.count("<svg") == charts


@pytest.mark.unit
def test_a_nights_changes_stand_near_the_top_and_say_what_was_dropped(tmp_path):
    from beam_pipeline import report

    info = _info(
        examples=0,
        incremental={
            "from": "/data/monday",
            "reused": 9,
            "converted": 2,
            "unchanged": 9,
            "added": 2,
            "dropped": 13,
            "dropped_first": [f"cats/{i:02d}.jpg" for i in range(10)],
        },
        changes={"notes": ["class cats is new", "reject rate 1.0% -> 5.0%"]},
    )
    page, _ = report.build_report(str(tmp_path), info)
    assert page.index('id="changes"') < page.index('id="splits"') < page.index('id="rejects"')
    section = page[page.index('<section id="changes"') :]
    section = section[: section.index("</section>")]
    assert "<li>class cats is new</li><li>reject rate 1.0% -&gt; 5.0%</li>" in section
    assert 'data-dropped="13"' in section and "unchanged 9, added 2, changed 0, dropped 13" in section
    assert "cats/00.jpg, cats/01.jpg" in section and "cats/09.jpg" in section  # the first ten named
    assert "the other 3 are the records of /data/monday/index.jsonl" in section
    assert report.build_report(str(tmp_path), info)[0] == page  # the same data, the same bytes
    quiet = report.build_report(str(tmp_path), _info(examples=0, incremental={"from": "/data/monday"}))[0]
    assert 'data-dropped="0"' in quiet and "dropped (" not in quiet
    assert 'id="changes"' not in report.build_report(str(tmp_path), _info(examples=0))[0]


@pytest.mark.unit
def test_no_near_duplicates_is_said_plainly_and_the_surest_groups_come_first(tmp_path):
    import json

    from beam_pipeline import near_duplicates as nd
    from beam_pipeline import report

    empty = nd.summary_block(10, {}, hashed=180, unhashed=0, large_runs=0)
    page, _ = report.build_report(str(tmp_path), _info(examples=0, near_duplicates=empty))
    assert "No near-duplicates: no two of the 180 images hashed look alike" in page
    assert 'class="pair"' not in page

    def group(first: str, confidence: str, splits: dict[str, int]) -> dict:
        return {"group": [first, first + "x"], "images": 2, "splits": splits, "confidence": confidence, "ties": []}

    lines = [
        group("a.jpg", "likely", {"test": 1, "train": 1}),
        group("b.jpg", "sure", {"train": 2}),
        group("c.jpg", "sure", {"test": 1, "train": 1}),
        group("d.jpg", "exact", {"train": 2}),
    ]
    (tmp_path / "near_duplicates.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [nd.header_line(10), *lines]))
    counts = {"groups": {"train": 2, "train+test": 2}, "images": 8, "confidence": {"exact": 1, "sure": 2}}
    block = nd.summary_block(10, counts, hashed=8, unhashed=0, large_runs=0)
    info = _info(examples=0, near_duplicates=block)
    shown = [g["group"][0] for g in report._pairs(str(tmp_path), info)]
    assert shown == ["d.jpg", "c.jpg", "b.jpg", "a.jpg"]  # exact, then sure across splits, sure, likely

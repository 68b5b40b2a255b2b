"""Looking at a sample of a dataset's records: reading them by position (index.jsonl and the .idx files, or
a scan), and drawing them, boxes and masks included, on one contact sheet (``inspect --contact-sheet``).

    examples = sample(output, info, n=16, seed=0, split=None)
"""

from __future__ import annotations

import bisect
import io
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import examples
from .annotations import objects
from .errors import UsageError
from .examples import parse_example
from .inspection import _BOXES, _read_at
from .vocab.dataset_info import DatasetInfo

WIDTH = 80


def sample(
    output: str, info: DatasetInfo, n: int, seed: int, split: str | None, keep: Callable[[dict], Any] | None = None
) -> list[Any]:
    """n records chosen at random (seeded) over the split(s), parsed (or what ``keep`` makes of each parsed
    record, as it is read: a caller that needs a thumbnail and a few features holds those, never n images); a
    shard is read up to the last record chosen in it, the others' bytes skipped by seeking
    (``inspection._read_at``).

    The records are numbered across the shards and n numbers drawn from that range (no list of every record:
    10 M records would take ~1 GB before anything is drawn), each found in its shard by the shards' counts.
    """
    shards = [shard for name, s in info.splits.items() if not split or name == split for shard in s.shards]
    ends = list(itertools.accumulate(shard.records for shard in shards))  # records up to each shard's end
    total = ends[-1] if ends else 0
    chosen = []
    for number in random.Random(seed).sample(range(total), min(n, total)):
        at = bisect.bisect_right(ends, number)
        chosen.append((shards[at], number - (ends[at - 1] if at else 0)))
    by_shard: dict[str, set[int]] = {}
    for shard, i in chosen:
        by_shard.setdefault(shard.file, set()).add(i)
    records = {}
    for file, indexes in sorted(by_shard.items()):
        for i, record in _read_at(FileSystems.join(output, file), indexes):
            parsed = parse_example(record)
            records[(file, i)] = keep(parsed) if keep else parsed
    return [records[(shard.file, i)] for shard, i in chosen if (shard.file, i) in records]


# Box and mask-outline colours, one per class id (id modulo the list): bright, told apart on photos.
PALETTE = (
    (255, 0, 0),
    (0, 200, 0),
    (0, 90, 255),
    (255, 160, 0),
    (200, 0, 255),
    (0, 220, 220),
    (255, 0, 140),
    (150, 255, 0),
)


def object_colour(label: int) -> tuple[int, int, int]:
    """The colour a contact sheet draws class id ``label``'s boxes and mask outlines in."""
    return PALETTE[label % len(PALETTE)]


def _draw_objects(sheet: Any, ex: dict[str, list[Any]], left: int, top: int, size: tuple[int, int]) -> None:
    """Draws a record's boxes, mask outlines and class names onto its thumbnail at (left, top) of ``size``.

    Boxes are normalized, so they scale to the thumbnail as they are; masks
    are resized with nearest neighbour and outlined (the mask minus its
    3x3 erosion), so the object stays visible under its outline.
    """
    from PIL import Image, ImageChops, ImageDraw, ImageFilter

    width, height = size
    draw = ImageDraw.Draw(sheet)
    boxes = list(zip(*(ex.get(k, []) for k in _BOXES), strict=False))
    labels = ex.get(objects.CLASS_LABEL, [])
    texts = ex.get(objects.CLASS_TEXT, [])
    for i, png in enumerate(ex.get(objects.MASK, [])):
        colour = object_colour(labels[i] if i < len(labels) else 0)
        try:
            mask = Image.open(io.BytesIO(png)).convert("L").resize(size, Image.NEAREST).point(lambda v: 255 * (v > 0))
        except Exception:  # noqa: BLE001 - a mask that cannot be read is not drawn (--verify names it)
            continue
        outline = ImageChops.subtract(mask, mask.filter(ImageFilter.MinFilter(3)))  # the mask's inner edge
        sheet.paste(colour, (left, top), outline)
    for i, (xmin, ymin, xmax, ymax) in enumerate(boxes):
        colour = object_colour(labels[i] if i < len(labels) else 0)
        x0, y0 = left + round(xmin * width), top + round(ymin * height)
        x1, y1 = max(x0, left + round(xmax * width) - 1), max(y0, top + round(ymax * height) - 1)
        draw.rectangle((x0, y0, x1, y1), outline=colour)
        if i < len(texts):
            draw.text((x0 + 2, y0 + 1), texts[i].decode("utf-8", "replace")[:12], fill=colour)


def contact_sheet(
    output: str,
    info: DatasetInfo,
    path: str,
    n: int = 64,
    seed: int = 0,
    split: str | None = None,
    tile: int = 128,
) -> int:
    """A PNG grid of n random examples (about √n columns), label text under each. Returns tiles drawn.

    A detection record shows its boxes and mask outlines, in one colour per
    class, with the class name at the box's corner; its caption counts its objects.
    """
    from PIL import Image, ImageDraw, ImageOps

    picks = sample(output, info, n, seed, split)
    if not picks:
        raise UsageError(f"{output}: no records to show")
    cols = math.ceil(math.sqrt(len(picks)))
    rows = math.ceil(len(picks) / cols)
    caption = 16
    sheet = Image.new("RGB", (cols * tile, rows * (tile + caption)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, ex in enumerate(picks):
        x, y = (k % cols) * tile, (k // cols) * (tile + caption)
        try:
            img = Image.open(io.BytesIO(ex[examples.ENCODED][0]))
            img.seek(0)
            thumb = ImageOps.contain(img.convert("RGB"), (tile - 4, tile - 4))
            left, top = x + (tile - thumb.width) // 2, y + (tile - thumb.height) // 2
            sheet.paste(thumb, (left, top))
            _draw_objects(sheet, ex, left, top, thumb.size)
        except Exception:  # noqa: BLE001 - a tile that cannot be drawn stays blank, marked
            draw.line((x, y, x + tile, y + tile), fill="red")
        text = b", ".join(ex.get(examples.LABEL_TEXT, [])).decode("utf-8", "replace") or "(no label)"
        if objects.SOURCE_ID in ex:  # a detection record: no image label, some objects
            count = len(ex.get(objects.XMIN, []))
            text = f"{count} object{'' if count == 1 else 's'}"
        draw.text((x + 3, y + tile + 2), text[: max(4, tile // 6)], fill="black")  # ~6 px a character
    buf = io.BytesIO()
    sheet.save(buf, "PNG")
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        fh.write(buf.getvalue())
    return len(picks)

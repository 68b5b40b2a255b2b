"""``--keep-last N``: after a dated run published, delete earlier dates' folders beyond the N newest complete ones.

Each night of a dated ``--output`` (``.../{date}``) is a full copy of the
dataset, so without retention the disk or bucket fills. Only what is surely
this tool's and surely finished with goes:

    outcome = keep_last("gs://b/ds/{date}", "2026-11-22", 7, protect=[previous])

- the N newest complete dated folders (``_SUCCESS``; this run's is one) stay;
- a folder of a date on or after ``run_date``, or whose name is no date, is never looked at;
- a complete folder beyond them goes, and so does a failed or killed one
  (no ``_SUCCESS``) older than the oldest kept one; a failed one newer than
  that stays (a re-run of its date resumes from it);
- never a folder in ``protect`` (this run's ``--incremental-from``), one
  holding a file this tool does not write, or one with a scratch folder
  younger than three days (a run may be writing there);
- never a folder whose output lease (lease.py) a live run holds: retention
  takes the folder's lease itself before deleting (a dead holder's is taken
  over), so a re-run of that date starting meanwhile is refused rather than
  publish into a folder whose files are being deleted.

``_SUCCESS`` is deleted first: a deletion cut short leaves a folder that no
``--incremental-from latest`` takes, and the next run's retention removes
it as a failed one. Everything goes through Beam ``FileSystems`` (local, gs://).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from apache_beam.io.filesystems import FileSystems

from . import index, lease, metadata, resume, storage
from .config import DATE_FIELD, ConvertConfig, Layout, is_date
from .run.files import stale_tmp_dirs
from .run.publish import PUBLISHED_DIRS, PUBLISHED_FILES
from .storage import delete_files

_LOG = logging.getLogger(__name__)
# {date} as a glob (Beam's match has character classes; every file system lists by prefix).
DATE_GLOB = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"

LIVE = "a run is writing in it"
BASE = "this run's --incremental-from"


@dataclass
class Outcome:
    """What one retention pass did: folders deleted, folders left (with why), deletions that failed."""

    deleted: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self, template: str) -> dict[str, object]:
        return {"template": template, "deleted": self.deleted, "left": self.left, "errors": self.errors}


def _folder_re(template: str) -> re.Pattern[str]:
    """``template``'s folders, {date} captured (the same date wherever {date} appears), then a file under it."""
    first, *rest = template.rstrip("/").split(DATE_FIELD)
    dated = re.escape(first) + "(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})" + "(?P=date)".join(re.escape(p) for p in rest)
    return re.compile(dated + "(?:/(?P<rel>.+))?")


def date_of(template: str, folder: str) -> str | None:
    """The date in ``folder`` if it is one of ``template``'s dated folders, else None."""
    found = _folder_re(template).fullmatch(folder.rstrip("/"))
    return found["date"] if found and not found["rel"] and is_date(found["date"]) else None


def dated_files(template: str) -> dict[str, list[str]]:
    """{date: [paths relative to its folder]} for every file under a dated folder of ``template``."""
    pattern = template.rstrip("/").replace(DATE_FIELD, DATE_GLOB) + "/**"
    matcher = _folder_re(template)
    out: dict[str, list[str]] = {}
    for m in FileSystems.match([pattern])[0].metadata_list:
        found = matcher.fullmatch(m.path)
        if found and found["rel"] and is_date(found["date"]):
            out.setdefault(found["date"], []).append(found["rel"])
    return out


def is_own(rel: str) -> bool:
    """A path (relative to a dated folder) of a file a run of this tool writes there."""
    top = rel.split("/", 1)[0]
    if top.startswith(metadata.TMP_PREFIX) or rel == lease.LEASE:
        return True
    if top == index.IDX_DIR:
        return metadata.is_idx_file(rel)
    if "/" in rel:
        return top in PUBLISHED_DIRS
    return rel == metadata.SUCCESS or rel in PUBLISHED_FILES or metadata.is_shard_file(rel)


def _live(folder: str, now: float | None) -> bool:
    """Whether ``folder`` holds a scratch folder younger than the stale age (a run may still write there)."""
    scratch = set(resume.scratch_folders(folder))
    return bool(scratch - set(stale_tmp_dirs(folder, now=now)))


def keep_last(
    template: str, run_date: str, n: int, protect: Iterable[str] = (), *, now: float | None = None
) -> Outcome:
    """Deletes earlier dates' folders of ``template`` beyond the ``n`` newest complete ones (see the module)."""
    template = template.rstrip("/")
    protected = {p.rstrip("/") for p in protect if p}
    files = dated_files(template)
    complete = sorted((d for d, rels in files.items() if metadata.SUCCESS in rels), reverse=True)
    kept = set(complete[:n])
    oldest_kept = min(kept) if kept else None
    outcome = Outcome()
    for date in sorted(files, reverse=True):
        if date >= run_date or date in kept:
            continue
        if date not in complete and oldest_kept is not None and date > oldest_kept:
            continue  # a failed night newer than the kept ones: a re-run of that date resumes from it
        folder = template.replace(DATE_FIELD, date)
        foreign = sorted(rel for rel in files[date] if not is_own(rel))
        if folder in protected:
            outcome.left.append((folder, BASE))
        elif foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            outcome.left.append((folder, f"holds files this tool did not write ({shown})"))
        elif _live(folder, now):
            outcome.left.append((folder, LIVE))
        else:
            try:
                if not _delete(folder):
                    outcome.left.append((folder, LIVE))
                    continue
            except Exception as e:  # noqa: BLE001 - the dataset is published; say what is left, go on
                outcome.errors.append(f"could not delete {folder}: {str(e).strip().splitlines()[-1]}")
                continue
            outcome.deleted.append(folder)
    return outcome


def _delete(folder: str) -> bool:
    """``_SUCCESS`` first (a cut-short deletion leaves an incomplete folder), then every other file of this tool's;
    under the folder's lease, so no run writes there meanwhile. False (nothing deleted) when a live run holds it."""
    try:
        with lease.held(folder, "keep-last-" + uuid.uuid4().hex[:8]):
            prefix = folder.rstrip("/") + "/"
            found = [m.path[len(prefix) :] for m in FileSystems.match([prefix + "**"])[0].metadata_list]  # listed anew
            rels = [rel for rel in found if is_own(rel) and rel != lease.LEASE]
            ordered = sorted(rels, key=lambda rel: (rel != metadata.SUCCESS, rel))
            delete_files([prefix + rel for rel in ordered])
    except lease.LeaseHeld:
        return False
    storage.remove_empty_dirs(folder)
    return True


def apply(cfg: ConvertConfig, layout: Layout) -> Outcome | None:
    """Retention for a run that published (``--keep-last``), logged; None when it was not asked for."""
    if not cfg.keep_last or not cfg.output_template or not cfg.run_date:
        return None
    template = _absolute(cfg.output_template)
    outcome = keep_last(template, cfg.run_date, cfg.keep_last, protect=[layout.previous or ""])
    for folder in outcome.deleted:
        _LOG.info("--keep-last %d: deleted %s", cfg.keep_last, folder)
    for folder, why in outcome.left:
        _LOG.warning("--keep-last %d: left %s: %s", cfg.keep_last, folder, why)
    for problem in outcome.errors:
        _LOG.warning("--keep-last %d: %s", cfg.keep_last, problem)
    return outcome


def _absolute(path: str) -> str:
    return storage.normalize(path)

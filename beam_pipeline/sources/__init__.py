"""Sources: where a run's images come from, listed inside the job.

- ``listing``: ``ListInputs``, the composite every run starts with (a folder,
  a glob or a manifest → refs, rejects, skips);
- ``folders``: a folder or glob listed in the job, fanned out over its
  subfolders, odd local entries as rejects;
- ``manifest``: CSV and JSONL manifests, one row per file, column types;
- ``rules``: relative paths, skipped names, splits and labels: what makes a
  listed file a ``Ref`` or a reject.

The annotation sources (COCO, Pascal VOC, manifest objects, label maps) are
``beam_pipeline.annotations``, joined to the listed refs by the pipeline.
"""

"""The ground floor: words every stage shares, importing nothing of the project.

- ``reasons``: every reject reason code as one table (code, what it means, the
  stage that emits it, the file it is written to); docs/bad-input.md's table is
  generated from it (``scripts/gen_docs_tables.py``).
- ``refs``: ``Ref``, one listed input image before its bytes are read, and the
  reject rows stages pass on (``reject``, ``file_reject``);
- ``records``: typed records that cross stages (``ShardResult``, one written
  shard, from the writer to finalize and the resume marker);
- ``dataset_info``: ``DatasetInfo``, ``dataset.json`` as a typed record, with
  its sub-records (a split and its shards, rejects, objects, incremental).

Anything here is imported by listing, the image check, the writer, the index,
resume and the annotation sources alike; nothing here imports them, so a module
needing a reason's name no longer imports the image decoder to get it.
"""

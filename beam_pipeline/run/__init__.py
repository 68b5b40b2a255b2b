"""The run lifecycle: from a command line's settings to a published dataset, or a one-line refusal.

A run goes through these steps, each a module of this package:

- ``preflight``: the input, manifest, annotation sources, labels file and
  output are checked before anything runs (``prepare``), the output is
  claimed (the lease, ``beam_pipeline.lease``) and the run's ``Layout`` made;
- ``previous``: the dataset an incremental run reuses (``--incremental-from``,
  ``latest``);
- ``workers``: the options and packages the workers get (Dataflow checks,
  GCS credentials, requirements);
- ``convert``: the pipeline itself (``run_convert``, ``run_plan``);
- ``finalize``: the job's last step, naming the shards and writing
  ``dataset.json``;
- ``poststeps``: TFT analysis and TFDS metadata on the staging folder;
- ``publish``: the one protocol that makes a run visible in the output;
- ``outcome``: whether a run may publish, and what the user is told.

``local`` holds the launching process's own things (the live progress
line, the temporary folder); ``common`` the small words every step uses.

    from beam_pipeline.run.convert import run_convert
    info = run_convert(cfg, beam_args)    # dataset.json's record (a DatasetInfo)
"""

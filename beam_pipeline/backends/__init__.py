"""Storage backends behind ``beam_pipeline.storage``: ``local`` (this machine's file system) and ``gcs`` (every GCS
client of the project is made there). Callers use ``storage``; these import nothing of the project."""

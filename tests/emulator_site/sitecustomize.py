"""Put on PYTHONPATH by the multi-process emulator test: every interpreter it starts imports this.

multi_processing workers are fresh interpreters that get no pipeline options
from the local runner, and each would spend ~25 s in Beam's credential
lookup (retried with back-off) before falling back to an anonymous client.
Against the emulator no credentials are needed, so each process takes the
fallback at once, as the launcher does for its own process. Test support
only: nothing in the package imports it.
"""

import os

if os.environ.get("STORAGE_EMULATOR_HOST"):
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()

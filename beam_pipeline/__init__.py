"""beam_pipeline: image collections to training-ready TFRecord datasets with Apache Beam.

Run ``python -m beam_pipeline convert --input ./photos --output ./out``; see README.md.
"""

__version__ = "0.1.0"

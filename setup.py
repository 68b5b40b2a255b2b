"""Packaging for beam_pipeline.

The same file serves ``pip install .`` locally and ``--setup_file ./setup.py``
on Dataflow workers.

    pip install .                       # convert, plan, inspect (no TensorFlow)
    pip install '.[all]'                # + tensorflow-transform analysis, TFDS loading
    pip install 'beam_pipeline[reader] @ git+<repo-url>'   # a training env: reader.load only

The base install is the converter: Apache Beam, Pillow, PyYAML, NumPy and
google-cloud-storage. The conversion itself imports neither TensorFlow nor
tensorflow-transform, so they are extras: ``transform`` carries TFT 1.21 and
its exact TensorFlow 2.21 pin; ``reader`` only asks for a TensorFlow 2.x in
the range the reader is checked with (scripts/check_reader_compat.sh), so a
training environment keeps its own TF. requirements/constraints.txt holds the
exact set the tests run with.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "beam_pipeline" / "__init__.py").read_text()).group(1)

REQUIRES = [
    "apache-beam[gcp]>=2.77.0,<3",
    "google-cloud-storage>=2.18,<4",
    "pillow>=10.4",
    "pyyaml>=6.0",
    "numpy>=1.26",
]
TRANSFORM = ["tensorflow>=2.21,<2.22", "tensorflow-transform>=1.21,<1.22"]
TFDS = ["tensorflow-datasets>=4.9.9,<5"]
READER = ["tensorflow>=2.16,<3"]
TEST_TOOLS = ["pytest>=8", "gcp-storage-emulator>=2024.8", "psutil>=5.9", "ruff>=0.6"]

setup(
    name="beam_pipeline",
    version=VERSION,
    description="Image folders, buckets and manifests to sharded, shuffled TFRecord datasets with Apache Beam",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["beam_pipeline", "beam_pipeline.*"]),
    python_requires=">=3.10,<3.14",
    install_requires=REQUIRES,
    extras_require={
        "transform": TRANSFORM,
        "tfds": TFDS,
        "reader": READER,
        "all": TRANSFORM + TFDS,
        "test": TRANSFORM + TFDS + TEST_TOOLS,
    },
    entry_points={"console_scripts": ["beam-pipeline=beam_pipeline.cli:console_main"]},
    license="Apache-2.0",
    classifiers=["Programming Language :: Python :: 3"],
)

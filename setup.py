"""Packaging for beam_pipeline: one install per role, each keeping the user's environment.

    pip install .                    # reader: reader.load beside your TensorFlow 2.16-2.x (no Beam, no GCP clients)
    pip install '.[tfds]'            # + tensorflow-datasets, at versions that fit the installed TF and protobuf
    pip install '.[convert]'         # the converter: convert, plan, inspect (Apache Beam[gcp], Pillow, ...)
    pip install '.[transform]'       # the converter + the tensorflow-transform analysis (pins TensorFlow 2.21)
    pip install '.[array_record]'    # + --format array_record, and the reader's Grain source (CPython 3.11+)
    pip install 'beam_pipeline[tfds] @ git+<repo-url>'   # the same from a repository, e.g. in a training env

The base install asks for TensorFlow only as a range, so pip keeps a training
environment's TF and, through TF's own requirements, its protobuf (pip honours
an installed package's requirements only when the package is part of the
resolution: that is why the reader names TensorFlow). Beam's GCP clients need
protobuf >= 6.33, which TF <= 2.19 refuses, so Beam is the ``convert`` extra.
tensorflow-transform 1.21 pins TensorFlow 2.21.x exactly, so it is the
``transform`` extra; without it ``convert`` skips the analysis and says so.
scripts/check_install_matrix.sh installs each role beside TF 2.16, 2.19 and
2.21. The same file serves ``--setup_file ./setup.py`` on Dataflow: workers
install it without extras, and the launcher (``with_worker_requirements``) or
configs/dataflow-requirements.txt adds the converter's. requirements/constraints.txt
holds the exact set the tests run with (``.[test]``: every extra).
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "beam_pipeline" / "__init__.py").read_text()).group(1)

READER = ["tensorflow>=2.16,<3"]  # checked with 2.16.2, 2.19.1 and 2.21.0 (scripts/check_install_matrix.sh)
TFDS = ["tensorflow-datasets>=4.9.9,<5"]
# tensorflow-metadata >= 1.18 is generated with protobuf 6.31 and refuses an older runtime at import
# (VersionError), though its metadata allows protobuf >= 4.25: beside TF <= 2.19 (protobuf < 6) pip would
# pick it. 1.17.3 imports with protobuf 4.25 to 7.x. tensorflow-transform needs >= 1.21 (and protobuf 6),
# so the cap is only in the [tfds] extra.
TFDS_METADATA = ["tensorflow-metadata>=1.17.3,<1.18"]
# The converter's lower bounds are the releases requirements/constraints.txt pins (scripts/test.sh tests them);
# the newest the ranges admit is what .ci/run's newest lane installs and tests (scripts/test_newest.sh). Nothing
# between or below is claimed: docs/versions.md. A cap goes here only below a release known to break the tool.
CONVERTER = [
    "apache-beam[gcp]>=2.77.0,<3",
    "google-cloud-storage>=3.17.1,<4",
    "pillow>=12.3",
    "pyyaml>=6.0.3",
    "numpy>=2.4.6",
    "ijson>=3.6,<4",  # --coco: the COCO JSON streamed (a multi-GB file is never loaded whole)
    "pycocotools>=2.0.11",  # --coco: instance masks from polygons and RLE
    # the near-duplicate search's spanning forest and groups (near_duplicates.py: scipy.sparse.csgraph)
    "scipy>=1.17.1,<2",
    "matplotlib>=3.11.2,<4",  # inspect --report: the charts as inline SVG
]
TRANSFORM = ["tensorflow>=2.21,<2.22", "tensorflow-transform>=1.21,<1.22"]
# --format array_record: the ArrayRecord library writes and reads the shards, and with Pillow and numpy is all the
# reader's random-access source needs (no TensorFlow). 0.8.6 is the release the tests pin; on CPython 3.10 the
# newest wheel is 0.8.1, untested here, so the extra installs nothing there and --format array_record says so.
ARRAY_RECORD = [
    "array-record>=0.8.6; python_version >= '3.11'",
    "pillow>=12.3",
    "numpy>=2.4.6; python_version >= '3.11'",
]
# tfrecord: a reader of the output's .idx files (DALI's format), checked by the tests;
# mkdocs: scripts/test.sh builds the docs site with --strict, so a broken link fails the tests
TEST_TOOLS = [
    "pytest>=8",
    "pytest-xdist>=3.6",  # scripts/test.sh runs the tests on every core (-n auto, a test file per worker)
    "gcp-storage-emulator>=2024.8",
    "psutil>=5.9",
    "ruff>=0.6",
    "tfrecord>=1.14",
    "mkdocs>=1.6,<2",
    # the pHash is computed here as imagehash's is (images/phash.py): a test and the recall benchmark compare
    "imagehash>=4.3.2,<5",
    # Grain reads the ArrayRecord output in the tests, as a JAX training loop does (docs/grain.md)
    "grain>=0.2.18; python_version >= '3.11'",
]

setup(
    name="beam_pipeline",
    version=VERSION,
    description="Image folders, buckets and manifests to sharded, shuffled TFRecord datasets with Apache Beam",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["beam_pipeline", "beam_pipeline.*"]),
    package_dir={"": "."},
    python_requires=">=3.10,<3.14",
    install_requires=READER,
    extras_require={
        "tfds": TFDS + TFDS_METADATA,
        "convert": CONVERTER,
        "transform": CONVERTER + TRANSFORM,
        # everything in one environment (TF 2.21): TFT brings tensorflow-metadata 1.21 and protobuf 6
        "all": CONVERTER + TRANSFORM + TFDS + ARRAY_RECORD,
        "array_record": ARRAY_RECORD,
        "reader": [],  # an older name: the base install is the reader
        "test": CONVERTER + TRANSFORM + TFDS + ARRAY_RECORD + TEST_TOOLS,
    },
    entry_points={"console_scripts": ["beam-pipeline=beam_pipeline.cli:console_main"]},
    license="Apache-2.0",
    classifiers=["Programming Language :: Python :: 3"],
)

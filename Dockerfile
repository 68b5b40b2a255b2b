# Worker image for Dataflow that doubles as the Flex Template launcher.
# TensorFlow + TFT are too big to pip-install on every worker start, so they
# are baked in here. Build and push with scripts/dataflow/build_template.sh.
# The Beam SDK base image must match the pinned apache-beam (requirements/constraints.txt).
ARG BEAM_VERSION=2.77.0
ARG PYTHON_VERSION=3.11
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base:latest AS launcher
FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}

COPY --from=launcher /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher

WORKDIR /template
COPY requirements/constraints.txt requirements/constraints.txt
COPY setup.py README.md ./
COPY beam_pipeline beam_pipeline
# The converter and the TFT analysis (the "transform" extra = [convert] + tensorflow-transform; the
# base install alone is the reader side), and ArrayRecord for --format array_record, at the tested versions.
RUN pip install --no-cache-dir -c requirements/constraints.txt ".[transform,array_record]"

ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/beam_pipeline/flex_main.py
ENV FLEX_TEMPLATE_PYTHON_SETUP_FILE=/template/setup.py
# Workers already have everything: do not pip install on start.
ENV PIP_NO_DEPS=True

ENTRYPOINT ["/opt/apache/beam/boot"]

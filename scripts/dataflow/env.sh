# Sourced by the scripts here: the names one release's image and template have.
# VERSION: the package version; IMAGE: the Dockerfile's image (the Flex Template launcher and the workers'
# sdk_container_image); TEMPLATE: the Flex Template file. Needs GCP_PROJECT, GCP_REGION, GCS_BUCKET.
VERSION="$(python3 -c 'import re;print(re.search(r"__version__ = \"([^\"]+)\"", open("beam_pipeline/__init__.py").read()).group(1))')"
REPOSITORY="${AR_REPOSITORY:-beam-pipeline}"
IMAGE="${GCP_REGION}-docker.pkg.dev/${GCP_PROJECT}/${REPOSITORY}/beam-pipeline:${VERSION}"
TEMPLATE="gs://${GCS_BUCKET}/beam_pipeline/templates/convert-${VERSION}.json"

#!/usr/bin/env bash
# Builds the worker/launcher image with Cloud Build and registers the Flex Template.
# Needs: gcloud (authenticated), and GCP_PROJECT, GCP_REGION, GCS_BUCKET set.
#   scripts/dataflow/build_template.sh            # tag: the package version
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GCP_PROJECT:?set GCP_PROJECT}" "${GCP_REGION:?set GCP_REGION}" "${GCS_BUCKET:?set GCS_BUCKET}"
VERSION="$(python3 -c 'import re;print(re.search(r"__version__ = \"([^\"]+)\"", open("beam_pipeline/__init__.py").read()).group(1))')"
REPOSITORY="${AR_REPOSITORY:-beam-pipeline}"
IMAGE="${GCP_REGION}-docker.pkg.dev/${GCP_PROJECT}/${REPOSITORY}/beam-pipeline:${VERSION}"
TEMPLATE="gs://${GCS_BUCKET}/beam_pipeline/templates/convert-${VERSION}.json"

gcloud artifacts repositories describe "$REPOSITORY" --location "$GCP_REGION" --project "$GCP_PROJECT" >/dev/null 2>&1 \
  || gcloud artifacts repositories create "$REPOSITORY" --repository-format docker --location "$GCP_REGION" --project "$GCP_PROJECT"
gcloud builds submit --project "$GCP_PROJECT" --tag "$IMAGE" .
gcloud dataflow flex-template build "$TEMPLATE" \
  --project "$GCP_PROJECT" --image "$IMAGE" --sdk-language PYTHON --metadata-file templates/metadata.json
echo "image:    $IMAGE"
echo "template: $TEMPLATE"

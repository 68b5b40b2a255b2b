#!/usr/bin/env bash
# Builds the worker/launcher image with Cloud Build and registers the Flex Template. The image is also the
# workers' sdk_container_image: run_template.sh, schedule.sh and the Airflow DAG pass it at launch (a Flex
# Template file cannot hold it), so workers install nothing when they start.
# Needs: gcloud (authenticated), and GCP_PROJECT, GCP_REGION, GCS_BUCKET set.
#   scripts/dataflow/build_template.sh            # tag: the package version
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GCP_PROJECT:?set GCP_PROJECT}" "${GCP_REGION:?set GCP_REGION}" "${GCS_BUCKET:?set GCS_BUCKET}"
source scripts/dataflow/env.sh

gcloud artifacts repositories describe "$REPOSITORY" --location "$GCP_REGION" --project "$GCP_PROJECT" >/dev/null 2>&1 \
  || gcloud artifacts repositories create "$REPOSITORY" --repository-format docker --location "$GCP_REGION" --project "$GCP_PROJECT"
gcloud builds submit --project "$GCP_PROJECT" --tag "$IMAGE" .
gcloud dataflow flex-template build "$TEMPLATE" \
  --project "$GCP_PROJECT" --image "$IMAGE" --sdk-language PYTHON --metadata-file templates/metadata.json
echo "image:    $IMAGE"
echo "template: $TEMPLATE"
echo "launch with --parameters sdk_container_image=$IMAGE (run_template.sh does); for convert --config configs/dataflow.yaml: export WORKER_IMAGE=$IMAGE"

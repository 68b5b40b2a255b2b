#!/usr/bin/env bash
# Launches one run of the Flex Template (what the scheduler does every night), its workers in the template's
# image (sdk_container_image: they install nothing at start). With {date} in OUTPUT
# it builds on the newest complete dataset of a date before RUN_DATE (incremental_from=latest), if any.
# A night fails (no _SUCCESS) when more than 5 % of its inputs are rejected, once they are more than 10
# rejects or more than half the inputs (max_reject_fraction, reject_allowance: convert's defaults).
#   scripts/dataflow/run_template.sh gs://my-bucket/photos gs://my-bucket/datasets/photos/{date} photos [YYYY-MM-DD]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GCP_PROJECT:?set GCP_PROJECT}" "${GCP_REGION:?set GCP_REGION}" "${GCS_BUCKET:?set GCS_BUCKET}"
INPUT="$1" OUTPUT="$2" NAME="$3" RUN_DATE="${4:-$(date -u +%F)}"
source scripts/dataflow/env.sh
JOB="$(echo "${NAME}-${RUN_DATE}" | tr '[:upper:]_' '[:lower:]-')"
INCREMENTAL=""
if [[ "$OUTPUT" == *"{date}"* ]]; then INCREMENTAL=",incremental_from=latest"; fi
gcloud dataflow flex-template run "$JOB" \
  --project "$GCP_PROJECT" --region "$GCP_REGION" --template-file-gcs-location "$TEMPLATE" \
  --temp-location "gs://${GCS_BUCKET}/beam_pipeline/tmp" \
  --parameters "input=${INPUT},output=${OUTPUT},name=${NAME},run_date=${RUN_DATE},overwrite=true,max_reject_fraction=0.05,reject_allowance=10,sdk_container_image=${IMAGE}${INCREMENTAL}"

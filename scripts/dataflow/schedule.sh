#!/usr/bin/env bash
# Creates (or updates) a Cloud Scheduler job that launches the Flex Template every night at 02:00 UTC.
# The output is partitioned by run date: OUTPUT should contain {date}; a re-run of a date replaces it safely.
#   scripts/dataflow/schedule.sh gs://my-bucket/photos 'gs://my-bucket/datasets/photos/{date}' photos
# Needs a service account allowed to launch Dataflow jobs: SCHEDULER_SA=name@project.iam.gserviceaccount.com
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GCP_PROJECT:?}" "${GCP_REGION:?}" "${GCS_BUCKET:?}" "${SCHEDULER_SA:?set SCHEDULER_SA}"
INPUT="$1" OUTPUT="$2" NAME="$3" SCHEDULE="${SCHEDULE:-0 2 * * *}"
source scripts/dataflow/env.sh
# Cloud Scheduler cannot compute dates: run_date is left out, so the job uses
# today's date (UTC) for {date} and for its job name. With {date} in OUTPUT,
# incremental_from=latest builds on the newest complete earlier date's dataset
# (the first night, or after only failed nights: a full run). KEEP_LAST=N (with {date})
# deletes earlier nights beyond the N newest complete ones once a night is published.
INCREMENTAL=""
if [[ "$OUTPUT" == *"{date}"* ]]; then INCREMENTAL=', "incremental_from": "latest"'; fi
if [[ -n "${KEEP_LAST:-}" ]]; then INCREMENTAL="${INCREMENTAL}, \"keep_last\": \"${KEEP_LAST}\""; fi
BODY=$(cat <<JSON
{"launchParameter": {"jobName": "$(echo "$NAME" | tr '[:upper:]_' '[:lower:]-')-nightly",
  "containerSpecGcsPath": "$TEMPLATE",
  "parameters": {"input": "$INPUT", "output": "$OUTPUT", "name": "$NAME", "overwrite": "true", "max_reject_fraction": "0.05", "reject_allowance": "10", "sdk_container_image": "$IMAGE"${INCREMENTAL}},
  "environment": {"tempLocation": "gs://${GCS_BUCKET}/beam_pipeline/tmp"}}}
JSON
)
URI="https://dataflow.googleapis.com/v1b3/projects/${GCP_PROJECT}/locations/${GCP_REGION}/flexTemplates:launch"
if gcloud scheduler jobs describe "beam-pipeline-${NAME}" --location "$GCP_REGION" --project "$GCP_PROJECT" >/dev/null 2>&1; then
  verb=update
else
  verb=create
fi
gcloud scheduler jobs "$verb" http "beam-pipeline-${NAME}" --project "$GCP_PROJECT" --location "$GCP_REGION" \
  --schedule "$SCHEDULE" --time-zone UTC --http-method POST --uri "$URI" \
  --oauth-service-account-email "$SCHEDULER_SA" --headers "Content-Type=application/json" --message-body "$BODY"

"""Airflow DAG: convert the day's images with the beam_pipeline Flex Template, then wait for _SUCCESS.

Run it in your Airflow environment (apache-airflow + apache-airflow-providers-google),
not in beam_pipeline's: the Google provider's pins conflict with tfx-bsl's.
Set the Airflow variables gcp_project, gcp_region, gcs_bucket, beam_pipeline_template and beam_pipeline_image
(the image scripts/dataflow/build_template.sh prints: the workers run in it and install nothing at start).
"""

from __future__ import annotations

import datetime

from airflow import DAG
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor

NAME = "photos"  # the dataset name is explicit in scheduled runs: shard names never depend on a folder

with DAG(
    dag_id="beam_pipeline_photos",
    schedule="0 2 * * *",
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["beam_pipeline"],
) as dag:
    bucket = "{{ var.value.gcs_bucket }}"
    convert = DataflowStartFlexTemplateOperator(
        task_id="convert",
        project_id="{{ var.value.gcp_project }}",
        location="{{ var.value.gcp_region }}",
        wait_until_finished=True,
        body={
            "launchParameter": {
                "jobName": f"{NAME}-{{{{ ds }}}}",
                "containerSpecGcsPath": "{{ var.value.beam_pipeline_template }}",
                "parameters": {
                    "input": f"gs://{bucket}/incoming/{NAME}",
                    "output": f"gs://{bucket}/datasets/{NAME}/{{date}}",
                    "run_date": "{{ ds }}",
                    "name": NAME,
                    "overwrite": "true",
                    "max_reject_fraction": "0.05",
                    "reject_allowance": "10",
                    "sdk_container_image": "{{ var.value.beam_pipeline_image }}",
                    # the newest complete earlier date's dataset; the first night converts everything
                    "incremental_from": "latest",
                },
                "environment": {"tempLocation": f"gs://{bucket}/beam_pipeline/tmp"},
            }
        },
    )
    published = GCSObjectExistenceSensor(
        task_id="published",
        bucket=bucket,
        object=f"datasets/{NAME}/{{{{ ds }}}}/_SUCCESS",
        timeout=6 * 3600,
    )
    convert >> published

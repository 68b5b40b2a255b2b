"""gs:// input and output against a real GCS protocol server (gcp-storage-emulator on loopback)."""

from __future__ import annotations

from pathlib import Path

from .conftest import BUCKET, convert, load_info, run_cli
from .imagegen import broken_bytes, image_bytes, write


def test_gs_input_and_output_match_a_local_run(gcs, tmp_path):
    root = tmp_path / "photos"
    for i in range(12):
        label = ["cat", "dog"][i % 2]
        write(
            str(root / label / f"{i} img.{['jpg', 'png'][i % 3 == 0]}"),
            image_bytes(["jpeg", "png"][i % 3 == 0], seed=i),
        )
    write(str(root / "cat" / "broken.jpg"), broken_bytes("truncated"))
    bucket = gcs.bucket(BUCKET)
    for path in root.rglob("*"):
        if path.is_file():
            bucket.blob(f"in/{path.relative_to(root)}").upload_from_filename(str(path))

    args = ["--name", "pets", "--seed", "5", "--split-ratios", "train=0.5,test=0.5", "--target-shard-mb", "0.004",
            "--max-reject-fraction", "0.1"]  # fmt: skip
    local = tmp_path / "local"
    convert("--input", str(root), "--output", str(local), *args, transform=True)
    convert("--input", f"gs://{BUCKET}/in", "--output", f"gs://{BUCKET}/out", "--no_auth", *args, transform=True)

    remote = {b.name[len("out/") :]: b for b in gcs.list_blobs(BUCKET, prefix="out/")}
    info = load_info(local)
    shard_files = [s["file"] for split in info["splits"].values() for s in split["shards"]]
    assert len(shard_files) > 2
    for name in shard_files:
        assert remote[name].download_as_bytes() == (local / name).read_bytes(), name
    for name in ("_SUCCESS", "dataset.json", "labels.txt", "rejects.jsonl", "transform_fn/saved_model.pb"):
        assert name in remote, name
    assert any(n.startswith("transformed_metadata/") for n in remote)
    assert any(n.startswith("transform_fn/assets/") for n in remote)
    assert not any(n.startswith(".beam_pipeline-tmp-") for n in remote)
    assert b"truncated" in remote["rejects.jsonl"].download_as_bytes()
    remote_labels = remote["labels.txt"].download_as_bytes()
    assert remote_labels == Path(local / "labels.txt").read_bytes()

    # inspect works on the bucket too: summary, full verification, contact sheet written back to gs://
    result = run_cli(
        "inspect", f"gs://{BUCKET}/out", "--verify", "--contact-sheet", f"gs://{BUCKET}/sheet.png", "--n", "4"
    )
    assert result.returncode == 0, result.stderr
    assert "verified 12 records" in result.stdout
    assert gcs.bucket(BUCKET).blob("sheet.png").download_as_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

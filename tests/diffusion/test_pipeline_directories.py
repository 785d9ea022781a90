"""Pipeline directories as users have them: a hub cache (``models--org--name`` with ``snapshots/<commit>/`` whose
files link into ``blobs/``), given as the repo folder or the snapshot, and Stable Diffusion's own model_index.json,
which lists a safety checker and a feature extractor the export leaves out (never imported nor loaded). A link out
of the cache, or a linked folder, is refused before anything is read."""
import hashlib
import json
import os
from pathlib import Path

import pytest

from cann_export.errors import LoadError

COMMIT = "c" * 40


def hub_cache(source: Path, repo: Path) -> Path:
    """``source``'s files laid out as huggingface_hub's cache does; the snapshot directory."""
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in sorted(p for p in source.rglob("*") if p.is_file()):
        data = f.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        rel = f.relative_to(source)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink("../" * (len(rel.parts) + 1) + f"blobs/{digest}", snap / rel)
    return snap


def with_safety_checker(directory: Path) -> Path:
    """model_index.json as a Stable Diffusion 1.x snapshot writes it: its safety checker and feature extractor."""
    index = json.loads((directory / "model_index.json").read_text())
    index.update(safety_checker=["stable_diffusion", "StableDiffusionSafetyChecker"],
                 feature_extractor=["transformers", "CLIPImageProcessor"], requires_safety_checker=True)
    (directory / "model_index.json").write_text(json.dumps(index))
    return directory


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    from helpers.tiny_diffusion import save, sd_pipeline

    return with_safety_checker(save(sd_pipeline(), tmp_path_factory.mktemp("sd") / "sd-dir"))


def test_a_hub_cache_repo_folder_and_its_snapshot_are_pipeline_directories(sd_dir, tmp_path):
    from cann_export.diffusion.directory import is_pipeline_directory, pipeline_directory, read_index

    repo = tmp_path / "models--org--tiny-sd"
    snap = hub_cache(sd_dir, repo)
    assert is_pipeline_directory(repo) and is_pipeline_directory(snap)
    assert pipeline_directory(repo)[0] == snap
    cls, parts = read_index(repo)
    assert cls == "StableDiffusionPipeline"
    assert "safety_checker" not in parts and "feature_extractor" not in parts  # left out, never loaded


@pytest.mark.parametrize("doctor", ["file_out", "folder_link"])
def test_a_link_out_of_the_cache_or_a_linked_folder_is_refused_unread(sd_dir, tmp_path, doctor):
    from cann_export.diffusion.directory import read_index

    snap = hub_cache(sd_dir, tmp_path / "models--org--tiny-sd")
    if doctor == "file_out":
        secret = tmp_path / "secret.json"
        secret.write_text("{}")
        (snap / "tokenizer" / "tokenizer_config.json").unlink()
        os.symlink(secret, snap / "tokenizer" / "tokenizer_config.json")
        match = "tokenizer_config.json links outside the model directory"
    else:
        elsewhere = tmp_path / "scheduler-elsewhere"
        (snap / "scheduler").rename(elsewhere)
        os.symlink(elsewhere, snap / "scheduler")
        match = "scheduler/ is a linked folder"
    with pytest.raises(LoadError, match=match):
        read_index(snap)


@pytest.mark.slow
def test_a_hub_cached_stable_diffusion_exports_with_no_flags_and_runs_back(sd_dir, tmp_path):
    import numpy as np
    import torch
    from click.testing import CliRunner
    from diffusers import StableDiffusionPipeline

    import cann_export
    from cann_export.cli.main import cli

    repo = tmp_path / "models--org--tiny-sd"
    hub_cache(sd_dir, repo)
    res = CliRunner().invoke(cli, [str(repo), "-o", str(tmp_path / "bundle")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert cann_export.validate(tmp_path / "bundle")["passed"] is True
    pipe = StableDiffusionPipeline.from_pretrained(sd_dir, safety_checker=None, feature_extractor=None,
                                                   local_files_only=True)
    call = {"prompt": "a cat", "num_inference_steps": 2, "output_type": "np"}
    got = cann_export.load(tmp_path / "bundle")(generator=torch.Generator().manual_seed(3), **call).images
    want = pipe(generator=torch.Generator().manual_seed(3), **call).images
    np.testing.assert_allclose(got, want, atol=1e-4)

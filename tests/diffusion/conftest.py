"""The tiny StableDiffusionPipeline bundle the export and run-back tests share (one export per worker)."""
import pytest


@pytest.fixture(scope="session")
def sd(tmp_path_factory):
    import cann_export
    from helpers.tiny_diffusion import sd_pipeline

    root = tmp_path_factory.mktemp("sd")
    pipe = sd_pipeline()
    result = cann_export.export(pipe, root / "sd_bundle")
    assert result.ok, result.to_dict()
    return pipe, root

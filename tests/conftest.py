import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"


def load_script(rel: str):
    """A script of the repo (benchmarks/, tools/) as a module, for its functions."""
    import importlib.util

    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    if not has_cuda():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture
def project(tmp_path):
    """A scratch project folder: pipelines/ and links to the repo's templates and profiles."""
    (tmp_path / "pipelines").mkdir()
    for d in ("kernel_templates", "hw_profiles"):
        os.symlink(ROOT / d, tmp_path / d)
    return tmp_path


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    # One compile cache for the whole session, away from the user's ~/.cache.
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pipe-cache"))


def pipe_cmd() -> list[str]:
    exe = shutil.which("pipe")
    return [exe] if exe else [sys.executable, "-m", "runner.cli"]

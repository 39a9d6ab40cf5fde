"""``dynspec real prepare``: the model dir ``dynspec proof --model real`` serves, on the tiny GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("gguf")

from patcher.errors import ModelInvalid, ModelMissing  # noqa: E402
from patcher.proof import launch  # noqa: E402
from patcher.proof.errors import ProofUsageError  # noqa: E402
from patcher.proof.run import load_real  # noqa: E402
from patcher.real import prepare  # noqa: E402

from .test_convert import hf_weights, vocabulary, write_gguf  # noqa: E402
from .test_heads import head_config, write_head  # noqa: E402


def test_prepare_makes_the_dir_the_proof_reads(tmp_path: Path) -> None:
    gguf_file = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    vocab = len(vocabulary()[0])
    head = write_head(
        tmp_path / "head", head_config(vocab_size=vocab, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 1]})
    )
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"id": "a", "input_ids": [1, 5, 6]}]}))
    info = prepare.prepare(tmp_path / "model", gguf_file, head, prompts)
    assert info["name"].startswith("SmolLM2-135M-Instruct (tiny.gguf)")
    name, ids, digests, paths = load_real(tmp_path / "model")
    assert paths is None  # converted and copied here: the digests say what ran
    assert name == info["name"] and ids == [[1, 5, 6]]
    assert digests == {"gguf": info["gguf_sha256"], "head": info["head_sha256"]} and len(digests["head"]) == 64
    target, draft = launch.real_dirs(tmp_path / "model")
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert len(model["gguf_sha256"]) == 64 and len(model["head_sha256"]) == 64


def test_prepare_refuses_a_head_for_another_target(tmp_path: Path) -> None:
    gguf_file = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    head = write_head(tmp_path / "head", head_config(vocab_size=49152))
    with pytest.raises(ModelInvalid, match="vocab_size 49152 does not match the target's 267"):
        prepare.prepare(tmp_path / "model", gguf_file, head, None)
    assert not (tmp_path / "model" / "draft").exists()


def test_a_dir_without_a_head_gets_one_installed(tmp_path: Path) -> None:
    """The GPU way: prepare converts the target with no head (the proof refuses the dir), the head is
    trained there from OUT/target and installed; a head for another target is refused, the dir kept."""
    gguf_file = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    vocab = len(vocabulary()[0])
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"id": "a", "input_ids": [1, 5, 6]}]}))
    info = prepare.prepare(tmp_path / "model", gguf_file, None, prompts)
    assert info["head_sha256"] is None and not (tmp_path / "model" / "draft").exists()
    with pytest.raises(ProofUsageError, match="no config.json in .*draft"):
        load_real(tmp_path / "model")
    wrong = write_head(tmp_path / "wrong", head_config(vocab_size=49152))
    with pytest.raises(ModelInvalid, match="vocab_size 49152"):
        prepare.install_head(tmp_path / "model", wrong)
    assert not (tmp_path / "model" / "draft").exists()
    head = write_head(
        tmp_path / "head", head_config(vocab_size=vocab, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 1]})
    )
    done = prepare.install_head(tmp_path / "model", head)
    assert len(done["head_sha256"]) == 64
    assert load_real(tmp_path / "model")[1] == [[1, 5, 6]]
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert model["head_sha256"] == done["head_sha256"] and len(model["gguf_sha256"]) == 64
    with pytest.raises(ModelMissing):
        prepare.install_head(tmp_path / "elsewhere", head)

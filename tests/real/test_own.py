"""``dynspec real own``: a model dir for ``dynspec proof --model real`` of the user's own target and
EAGLE-3 head, linked, not copied. Every refusal leaves OUT as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.errors import ModelInvalid, ModelMissing
from patcher.proof import launch
from patcher.proof.run import load_real
from patcher.real import prepare

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 300}
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "vocab_size": 300, "draft_vocab_size": 32}


def model(path: Path, config: Any) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def prompts(path: Path, rows: list[list[int]]) -> Path:
    path.write_text(json.dumps({"prompts": [{"id": f"p{i}", "input_ids": ids} for i, ids in enumerate(rows)]}))
    return path


def listing(root: Path) -> dict[str, str]:
    """What is under ``root`` (links by where they point, files by their text), to see it unchanged."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): f"-> {p.readlink()}" if p.is_symlink() else p.read_text() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def weights(tmp_path: Path) -> tuple[Path, Path, Path]:
    return (
        model(tmp_path / "Llama-8B", LLAMA),
        model(tmp_path / "EAGLE3-8B", EAGLE3),
        prompts(tmp_path / "prompts.json", [[1, 2, 3], [4, 5]]),
    )


def test_the_layout_is_the_one_the_proof_reads() -> None:
    assert (prepare.TARGET, prepare.DRAFT, prepare.PROMPTS, prepare.INFO) == (
        launch.REAL_TARGET,
        launch.REAL_DRAFT,
        launch.REAL_PROMPTS,
        launch.REAL_INFO,
    )


def test_own_links_the_weights_and_the_proof_reads_the_dir(tmp_path, weights) -> None:
    target, head, prompts_file = weights
    done = prepare.own(tmp_path / "mine", target, head, prompts_file)
    assert done == {"name": "Llama-8B + EAGLE3-8B", "target": str(target), "head": str(head)}
    name, ids, digests = load_real(tmp_path / "mine")
    assert (name, ids, digests) == ("Llama-8B + EAGLE3-8B", [[1, 2, 3], [4, 5]], {"gguf": None, "head": None})
    served_target, served_draft = launch.real_dirs(tmp_path / "mine")
    assert served_target.is_symlink() and served_target.resolve() == target
    assert served_draft.is_symlink() and served_draft.resolve() == head
    info = json.loads((tmp_path / "mine" / "model.json").read_text())
    assert info["own"] is True and info["head_architectures"] == ["LlamaForCausalLMEagle3"]


def test_a_second_own_replaces_its_links_and_leaves_nothing_beside_them(tmp_path, weights) -> None:
    target, head, prompts_file = weights
    prepare.own(tmp_path / "mine", target, head, prompts_file)
    other = model(tmp_path / "Eagle3-other", {**EAGLE3, "architectures": ["Eagle3DeepseekV2ForCausalLM"]})
    prepare.own(tmp_path / "mine", target, other, prompts_file, name="mine, other head")
    assert (tmp_path / "mine" / "draft").resolve() == other
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["draft", "model.json", "prompts.json", "target"]
    assert load_real(tmp_path / "mine")[0] == "mine, other head"


@pytest.mark.parametrize(
    ("head_config", "error", "says"),
    [
        ({**EAGLE3, "architectures": ["LlamaForCausalLM"]}, ModelInvalid, "name no EAGLE-3 draft class"),
        ({**EAGLE3, "architectures": "LlamaForCausalLMEagle3"}, ModelInvalid, "name no EAGLE-3 draft class"),
        ({**EAGLE3, "vocab_size": 128256}, ModelInvalid, "vocab_size 128256 does not match the target's 300"),
        (["not", "an", "object"], ModelInvalid, "not a JSON object"),
        (None, ModelMissing, "no such file .HEAD: an EAGLE-3 draft model dir"),
    ],
    ids=["not-eagle3", "architectures-not-a-list", "other-vocabulary", "config-a-list", "no-config"],
)
def test_a_head_that_cannot_serve_the_target_is_refused_and_out_untouched(
    tmp_path, weights, head_config, error, says
) -> None:
    target, _, prompts_file = weights
    head = tmp_path / "head"
    head.mkdir()
    if head_config is not None:
        (head / "config.json").write_text(json.dumps(head_config))
    with pytest.raises(error, match=says):
        prepare.own(tmp_path / "mine", target, head, prompts_file)
    assert not (tmp_path / "mine").exists()


def test_out_that_is_not_owns_to_replace_is_refused_as_it_is(tmp_path, weights) -> None:
    """A `dynspec real prepare` dir (a real target/), a dir inside the weights, a file: never written."""
    target, head, prompts_file = weights
    prepared = tmp_path / "prepared"
    model(prepared / "target", LLAMA)
    (prepared / "model.json").write_text("{}")
    before = listing(prepared)
    with pytest.raises(ModelInvalid, match="target: not a link of `dynspec real own`"):
        prepare.own(prepared, target, head, prompts_file)
    assert listing(prepared) == before
    before = listing(target)
    for inside in (target, target / "proof"):
        with pytest.raises(ModelInvalid, match="inside .*Llama-8B"):
            prepare.own(inside, target, head, prompts_file)
    assert listing(target) == before
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ModelInvalid, match="a-file: not a directory"):
        prepare.own(tmp_path / "a-file", target, head, prompts_file)


def test_prompts_without_prompts_are_refused_before_anything_is_written(tmp_path, weights) -> None:
    target, head, _ = weights
    with pytest.raises(ModelInvalid, match="no prompts"):
        prepare.own(tmp_path / "mine", target, head, prompts(tmp_path / "empty.json", []))
    with pytest.raises(ModelMissing, match="nothing.json: no such file"):
        prepare.own(tmp_path / "mine", target, head, tmp_path / "nothing.json")
    assert not (tmp_path / "mine").exists()


def test_the_command_prints_what_it_made_and_refuses_in_one_line(tmp_path, weights) -> None:
    target, head, prompts_file = weights
    runner = CliRunner()
    out = tmp_path / "mine"
    done = runner.invoke(main, ["real", "own", str(target), str(head), str(out), "--prompts", str(prompts_file)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["target"] == str(target)
    refused = runner.invoke(
        main, ["real", "own", str(target), str(target), str(tmp_path / "b"), "--prompts", str(prompts_file)]
    )
    assert refused.exit_code == 12
    assert refused.output.strip().count("\n") == 0 and "name no EAGLE-3 draft class" in refused.output
    assert not (tmp_path / "b").exists()

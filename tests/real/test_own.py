"""``dynspec real own``: a model dir for ``dynspec proof --model real`` of the user's own target and
EAGLE-3 head, linked, not copied. Every refusal leaves OUT as it was."""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.errors import ModelInvalid, ModelMissing, UsageError
from patcher.proof import launch
from patcher.proof.run import load_real
from patcher.real import fetch, prepare
from patcher.real import prompts as real_prompts

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
    assert load_real(tmp_path / "mine") == (
        "Llama-8B + EAGLE3-8B",
        [[1, 2, 3], [4, 5]],
        {"gguf": None, "head": None},
        {"target": str(target), "head": str(head)},
    )
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
        ({**EAGLE3, "hidden_size": 8192}, ModelInvalid, "hidden_size 8192 does not match the target's 64"),
        ({**EAGLE3, "target_hidden_size": 8192}, ModelInvalid, "hidden_size 8192 does not match the target's 64"),
        (["not", "an", "object"], ModelInvalid, "not a JSON object"),
        (None, ModelMissing, "no such file .HEAD: an EAGLE-3 draft model dir"),
    ],
    ids=[
        "not-eagle3",
        "architectures-not-a-list",
        "other-vocabulary",
        "other-hidden-size",
        "other-target-hidden-size",
        "config-a-list",
        "no-config",
    ],
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


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda out: model(out / "target", LLAMA) and (out / "model.json").write_text("{}"),
            "not made by `dynspec real own`",
        ),
        (lambda out: model(out, {}) and None, "holds config.json, which `dynspec real own` did not make"),
        (
            lambda out: out.mkdir() or (out / "model.json").write_text('{"own": false}'),
            "not made by `dynspec real own`",
        ),
        (lambda out: out.write_text("x"), "not a directory"),
        (lambda out: out.mkdir() or (out / ".target.new").mkdir(), "holds .target.new, which"),
        (lambda out: out.symlink_to(out.with_name("nowhere")), "a link to nothing"),
    ],
    ids=[
        "a-prepare-dir",
        "someone-elses-dir",
        "model-json-not-owns",
        "a-file",
        "a-staging-name-a-dir",
        "a-dangling-link",
    ],
)
def test_an_out_that_is_not_owns_to_replace_is_refused_and_left_as_it_was(tmp_path, weights, make, says) -> None:
    target, head, prompts_file = weights
    out = tmp_path / "out"
    make(out)
    before = listing(out) if out.is_dir() else None
    with pytest.raises(UsageError, match=says):
        prepare.own(out, target, head, prompts_file)
    assert (listing(out) if out.is_dir() else None) == before


@pytest.mark.parametrize("where", ["target", "target/proof", "head", "head/proof"])
def test_an_out_inside_the_weights_is_refused_and_nothing_lands_there(tmp_path, weights, where) -> None:
    target, head, prompts_file = weights
    root = {"target": target, "head": head}[where.split("/")[0]]
    before = listing(root)
    with pytest.raises(UsageError, match=f"inside .*{root.name}"):
        prepare.own(
            tmp_path / where.replace("target", target.name).replace("head", head.name), target, head, prompts_file
        )
    assert listing(root) == before


def test_what_an_interrupted_own_left_is_replaced_by_the_next(tmp_path, weights) -> None:
    target, head, prompts_file = weights
    out = tmp_path / "mine"
    out.mkdir()
    (out / ".model.json.new").write_text("half")
    (out / ".draft.new").symlink_to(tmp_path)
    prepare.own(out, target, head, prompts_file)
    assert sorted(p.name for p in out.iterdir()) == ["draft", "model.json", "prompts.json", "target"]
    assert (out / "draft").resolve() == head


def test_a_rerun_that_reads_the_prompts_it_wrote_replaces_everything_together(tmp_path, weights) -> None:
    """``--prompts OUT/prompts.json`` with another head: read before anything is replaced."""
    target, head, prompts_file = weights
    prepare.own(tmp_path / "mine", target, head, prompts_file)
    other = model(tmp_path / "other", EAGLE3)
    prepare.own(tmp_path / "mine", target, other, tmp_path / "mine" / "prompts.json")
    info = json.loads((tmp_path / "mine" / "model.json").read_text())
    assert info["head"] == str(other) and (tmp_path / "mine" / "draft").resolve() == other
    assert load_real(tmp_path / "mine")[1] == [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([], "no prompts"),
        ([[1, 2], []], "prompt 1 is not a list of token ids"),
        ([[1, "2"]], "prompt 0 is not a list of token ids"),
        ([[1, 300]], "prompt 0 has token 300, past the target's vocabulary .300.: tokenized for another model"),
    ],
    ids=["none", "an-empty-one", "not-ids", "another-vocabulary"],
)
def test_prompts_the_proof_could_not_send_are_refused_before_anything_is_written(tmp_path, weights, rows, says):
    target, head, _ = weights
    with pytest.raises(ModelInvalid, match=says):
        prepare.own(tmp_path / "mine", target, head, prompts(tmp_path / "p.json", rows))
    (tmp_path / "q.json").write_text(json.dumps({"prompts": [{"id": "a"}]}))
    with pytest.raises(ModelInvalid, match="not a prompts.json"):
        prepare.own(tmp_path / "mine", target, head, tmp_path / "q.json")
    assert not (tmp_path / "mine").exists()


def test_prompts_missing_are_refused_before_anything_is_written(tmp_path, weights) -> None:
    target, head, _ = weights
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


class ChatTokenizer:
    """What ``own_prompts`` asks of transformers' tokenizer: a chat template that wraps a user turn,
    and ids that show whether the special tokens (a BOS, 1) were added."""

    chat_template = "<user>{content}</user><bot>"

    @classmethod
    def from_pretrained(cls, path: str) -> ChatTokenizer:
        cls.path = path
        return cls()

    def apply_chat_template(self, turn: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt and turn[0]["role"] == "user"
        return self.chat_template.format(content=turn[0]["content"])

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [1] * add_special_tokens + [2 + len(word) for word in text.split()]}


def test_own_prompts_go_through_the_targets_chat_template(tmp_path, weights, monkeypatch) -> None:
    """Requests through the target's template (no BOS added over it), code heads bare with its BOS;
    the held-out split is the one `dynspec real prompts` holds out (by id)."""
    code = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):"} for i in range(20)]
    requests = [{"index": i, "query": f"Write note {i}"} for i in range(20)]
    files = {fetch.HUMANEVAL: tmp_path / "he.jsonl.gz", fetch.WRITINGBENCH: tmp_path / "wb.jsonl"}
    with gzip.open(files[fetch.HUMANEVAL], "wt") as f:
        f.write("\n".join(json.dumps(r) for r in code))
    files[fetch.WRITINGBENCH].write_text("\n".join(json.dumps(r) for r in requests))
    monkeypatch.setattr(fetch, "extracted", lambda artifact: files[artifact])
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=ChatTokenizer))
    target, head, _ = weights
    prepare.own(tmp_path / "mine", target, head, None)
    written = json.loads((tmp_path / "mine" / "prompts.json").read_text())
    rows = {row["id"]: row["input_ids"] for row in written["prompts"]}
    everything = real_prompts.humaneval(files[fetch.HUMANEVAL]) + real_prompts.writingbench(files[fetch.WRITINGBENCH])
    assert set(rows) == {p.id for p in real_prompts.split(everything)[1]} and rows
    for id_, ids in rows.items():
        n = int(id_.rsplit("/", 1)[1])
        if id_.startswith("writingbench/"):  # "<user>Write note N</user><bot>": 3 words, no BOS
            assert ids == [2 + len("<user>Write"), 2 + len("note"), 2 + len(f"{n}</user><bot>")]
        else:
            assert ids == [1, 2 + len("def"), 2 + len(f"f{n}(x):")]
    assert ChatTokenizer.path == str(target)


def test_a_target_without_a_chat_template_is_refused_before_anything_is_written(tmp_path, weights, monkeypatch):
    class Plain(ChatTokenizer):
        chat_template = None

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=Plain))
    target, head, _ = weights
    with pytest.raises(ModelInvalid, match="no chat template .give --prompts"):
        prepare.own(tmp_path / "mine", target, head, None)
    assert not (tmp_path / "mine").exists()


def test_the_default_name_of_a_hugging_face_cache_snapshot_is_the_repos(tmp_path) -> None:
    snapshots = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots"
    target = model(snapshots / "0e9e39f249a16976918f6564b8830bc894c89659", LLAMA)
    head = model(tmp_path / "hub" / "models--yuhuili--EAGLE3-LLaMA3.1-Instruct-8B" / "snapshots" / "ab12", EAGLE3)
    done = prepare.own(tmp_path / "mine", target, head, prompts(tmp_path / "p.json", [[1]]))
    assert done["name"] == "meta-llama/Llama-3.1-8B-Instruct + yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"

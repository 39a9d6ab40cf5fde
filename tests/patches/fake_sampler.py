"""The target's ``Sampler`` as ``dynspec_v2.DecodeSample`` calls it, for the runtime tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class SixParameterSampler:
    """Called as 0.5.4 - 0.5.23's ``Sampler.forward`` is, with the six parameters
    ``DecodeSample.PARAMETERS`` names (``DecodeSample.of`` reads them). Each call is recorded;
    a subclass's ``draw`` makes the tokens from the logits it is handed, as the real one does,
    after writing into them (the real sampler scales and softmaxes them in place)."""

    def __init__(self) -> None:
        self.calls: list[SimpleNamespace] = []

    def forward(
        self,
        logits_output: Any,
        sampling_info: Any,
        return_logprob: bool,
        top_logprobs_nums: Any,
        token_ids_logprobs: Any,
        positions: Any,
    ) -> Any:
        self.calls.append(
            SimpleNamespace(
                sampling_info=sampling_info,
                return_logprob=return_logprob,
                top_logprobs_nums=top_logprobs_nums,
                token_ids_logprobs=token_ids_logprobs,
                positions=positions,
            )
        )
        return self.draw(logits_output.next_token_logits)

    def __call__(self, *args: Any) -> Any:  # nn.Module's call: forward
        return self.forward(*args)

    def draw(self, logits: Any) -> Any:
        raise AssertionError("this sampler is only read at start-up")

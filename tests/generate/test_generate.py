"""The generation loop: onnxruntime against torch eager, the thinking rules, seeded reproducibility."""

from __future__ import annotations

import pytest

from softdeploy.errors import ArgumentError
from softdeploy.generate import Decoding, GenerationResult, OrtBackend, SoftThinking, TorchBackend, generate

pytestmark = pytest.mark.models  # transformers

PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]  # two lengths: row 1 is left-padded


@pytest.fixture(scope="module")
def backends(tiny_export):
    model, export = tiny_export("llama")
    return OrtBackend(export, kernels="native"), TorchBackend(model, threads=1)


def _both(backends, **kw) -> tuple[GenerationResult, GenerationResult]:
    ort, eager = backends
    return generate(ort, PROMPTS, **kw), generate(eager, PROMPTS, **kw)


@pytest.mark.parametrize(
    "soft",
    [
        None,
        SoftThinking(think_end_id=50, max_topk=5),
        SoftThinking(think_end_id=50, noise="gumbel", tau=0.3, noise_factor=1.0, max_topk=10),
    ],
    ids=["discrete", "soft", "soft-gumbel"],
)
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_ort_and_torch_give_the_same_trace(backends, soft, sample):
    dec = Decoding(max_new_tokens=32, sample=sample, eos_token_ids=(95,))
    a, b = _both(backends, soft_thinking=soft, decoding=dec, seed=7)
    assert a.tokens == b.tokens
    assert a.thinking_steps == b.thinking_steps and a.think_end == b.think_end and a.stop == b.stop
    assert all(len(t) == 32 or s == "eos" for t, s in zip(a.tokens, a.stop, strict=True))
    if soft is None:
        assert a.think_end == ["off", "off"] and a.thinking_steps == [0, 0]


def test_cold_stop_forces_think_end(backends):
    ort, _ = backends
    soft = SoftThinking(think_end_id=50, early_stopping_entropy=1e9, early_stopping_length=3)
    r = generate(ort, PROMPTS, soft_thinking=soft, decoding=Decoding(max_new_tokens=8))
    assert r.think_end == ["cold", "cold"]
    assert r.thinking_steps == [3, 3]
    assert all(50 not in t[:2] for t in r.tokens)
    assert [t[2] for t in r.tokens] == [50, 50]
    off = generate(ort, PROMPTS, soft_thinking=SoftThinking(think_end_id=50, early_stopping_length=0))
    assert "cold" not in off.think_end


def test_slot0_think_end_switches_to_answering(backends):
    ort, eager = backends
    probe = generate(ort, PROMPTS, soft_thinking=SoftThinking(think_end_id=0), decoding=Decoding(max_new_tokens=4))
    first = probe.tokens[0][0]  # what slot 0 chooses at step 0 for row 0
    soft = SoftThinking(think_end_id=first, early_stopping_length=0)
    r = generate(ort, PROMPTS, soft_thinking=soft, decoding=Decoding(max_new_tokens=6))
    assert r.think_end[0] == "token" and r.thinking_steps[0] == 1 and r.tokens[0][0] == first
    # after the switch the row feeds discrete tokens: the torch loop, same rules, agrees on all of it
    assert generate(eager, PROMPTS, soft_thinking=soft, decoding=Decoding(max_new_tokens=6)).tokens == r.tokens


def test_eos_ends_a_row(backends):
    ort, _ = backends
    plain = generate(ort, PROMPTS, decoding=Decoding(max_new_tokens=5))
    eos = plain.tokens[0][2]
    r = generate(ort, PROMPTS, decoding=Decoding(max_new_tokens=5, eos_token_ids=(eos,)))
    assert r.stop[0] == "eos" and r.tokens[0] == plain.tokens[0][: plain.tokens[0].index(eos) + 1]


def test_seeded_noise_reproduces_and_seeds_differ(backends):
    ort, _ = backends
    soft = SoftThinking(think_end_id=50, noise="gumbel", tau=0.1, early_stopping_length=0)
    dec = Decoding(max_new_tokens=16)
    runs = [generate(ort, PROMPTS, soft_thinking=soft, decoding=dec, seed=s).tokens for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert any(r != runs[0] for r in runs[2:])


def test_loop_reports_its_time(backends):
    ort, _ = backends
    r = generate(ort, PROMPTS, soft_thinking=SoftThinking(think_end_id=50), decoding=Decoding(max_new_tokens=8))
    assert r.steps == 8 and r.new_tokens == 16
    assert r.graph_seconds > 0 and r.loop_seconds > 0 and 0 < r.overhead < 1


def test_bad_arguments_are_refused(backends, tiny_export):
    ort, _ = backends
    with pytest.raises(ArgumentError, match="think_end_id 500"):
        generate(ort, PROMPTS, soft_thinking=SoftThinking(think_end_id=500))
    with pytest.raises(ArgumentError, match="prompt 1 is empty"):
        generate(ort, [[1], []])
    with pytest.raises(ArgumentError, match="holds id 96"):
        generate(ort, [[96]])
    with pytest.raises(ArgumentError, match="max_new_tokens 0"):
        generate(ort, PROMPTS, decoding=Decoding(max_new_tokens=0))
    _, ids_export = tiny_export("qwen2", inputs_embeds=False)
    ids_backend = OrtBackend(ids_export)
    with pytest.raises(ArgumentError, match="takes input_ids"):
        generate(ids_backend, PROMPTS, soft_thinking=SoftThinking(think_end_id=5))
    # discrete decoding works on an input_ids export
    assert len(generate(ids_backend, PROMPTS, decoding=Decoding(max_new_tokens=3)).tokens[0]) == 3


def test_portable_bodies_give_the_same_trace(tiny_export):
    """Without softdeploy's library onnxruntime runs the op's function body: same ids."""
    _, export = tiny_export("llama")
    soft = SoftThinking(think_end_id=50, noise="gumbel", tau=0.5)
    dec = Decoding(max_new_tokens=12)
    native = generate(OrtBackend(export, kernels="native"), PROMPTS, soft_thinking=soft, decoding=dec, seed=3)
    portable = generate(OrtBackend(export, kernels="portable"), PROMPTS, soft_thinking=soft, decoding=dec, seed=3)
    assert native.tokens == portable.tokens

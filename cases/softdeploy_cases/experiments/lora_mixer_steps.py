"""Held-out MRR@10 of the lora_mixer_retrieval case's routed model along its training, per seed (each seed its own
held-out split), against the base model on the same split: how robust "trained routed >= base" is to the split
and the step count (the case's accuracy floor).

One training run per seed to ``--steps``, evaluated (eager torch, eval mode, cosine of sentence embeddings, every
held-out question against the whole corpus) every ``--every`` steps. Evaluation draws no random numbers, so the
row at step s is the model a run of s steps trains. Results: cases/results/experiments/lora_mixer_steps.md.

Run: ``python -m softdeploy_cases.experiments.lora_mixer_steps --seeds 0,1,2 --steps 80 --every 10``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from softdeploy.compare.metrics import mrr_at_k
from softdeploy_cases.lora_mixer_retrieval import LoRAMixerRetrieval


def embed(model: Any, tok: Any, texts: list[str], max_length: int) -> np.ndarray:
    """Sentence embeddings of ``texts`` by ``model`` in batches of 64."""
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            enc = tok(texts[i : i + 64], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            out.append(model(enc["input_ids"], enc["attention_mask"]).numpy())
    return np.concatenate(out)


def mrr(model: Any, case: LoRAMixerRetrieval) -> float:
    """MRR@10 of ``model`` on the case's held-out questions against its whole corpus (eval mode, restored after)."""
    d = case.data
    was = model.training
    model.eval()
    q = embed(model, case._tok, d.queries, case.max_length)  # the case's max length (48)
    docs = embed(model, case._tok, d.corpus, case.max_length)
    model.train(was)
    return mrr_at_k(q @ docs.T, d.relevant, 10)


def run_seed(seed: int, steps: int, every: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """Trains the case's routed model for ``seed`` (its own held-out split) to ``steps``, evaluating it every
    ``every`` steps: the base model's MRR@10 and the routed one's at each evaluated step."""
    case = LoRAMixerRetrieval(seed=seed, steps=steps, cache_dir=tempfile.mkdtemp(), **overrides)
    curve: dict[int, float] = {}
    holder: dict[str, Any] = {}
    train = case._train

    def capture(model: Any, progress: Any) -> None:
        holder["model"] = model
        return train(model, progress)

    case._train = capture  # type: ignore[method-assign]

    class Probe:
        """A progress that evaluates the routed model every ``every`` training steps."""

        @contextmanager
        def step(self, description: str, total: int | None = None) -> Any:
            done = [0]

            def advance(n: int = 1) -> None:
                done[0] += n
                if description.startswith("train") and done[0] % every == 0:
                    curve[done[0]] = round(mrr(holder["model"], case), 4)
                    print(f"seed {seed} step {done[0]}: {curve[done[0]]}", flush=True)

            yield advance

    case.prepare(Probe())  # type: ignore[arg-type]
    return {"seed": seed, "base": round(mrr(case._base, case), 4), "routed": curve, "settings": case.settings()}


def main() -> None:
    """Runs the experiment with the command line's arguments and prints one JSON line per seed."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], help="case setting NAME=VALUE (float or int)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    overrides = {k: (float(v) if "." in v or "e" in v else int(v)) for k, v in (s.split("=", 1) for s in a.set)}
    for seed in [int(s) for s in a.seeds.split(",")]:
        print(json.dumps(run_seed(seed, a.steps, a.every, overrides)), flush=True)


if __name__ == "__main__":
    main()

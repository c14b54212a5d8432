"""The payloads of a remote model: the model itself, an encoded context and a resumable canvas.

They stand where the local DGemmaModel, KVCache and Resume stand, so Sampler, Denoise, Encode and
the Advanced sampler take them unchanged: the model's `backend` runs what the local engine would.
The bearer token lives in the backend's connection only, never in a payload's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, eq=False)
class RemoteModel:
    """A model served at `url`; `dialect` says what its stream carries (see remote/dialects.py)."""

    url: str
    model_id: str
    dialect: str
    canvas_length: int | None  # None: a text dialect whose card gives no canvas size
    max_positions: int
    token_strings: object = field(repr=False)  # id -> display text, the server's own table
    source: str = ""
    quant: str = "none"
    device: str = "remote"
    dtype: str = "unknown"
    vision: bool = False
    backend: object = field(default=None, repr=False, compare=False)
    decoding: object = field(default=None, repr=False, compare=False)  # (byte of id, skipped ids), or None

    def describe(self) -> dict:
        return {"model_source": self.source, "quant": self.quant, "device": self.device, "dtype": self.dtype}

    def __str__(self) -> str:
        return f"{self.model_id} at {self.url} ({self.dialect})"


@dataclass(frozen=True, eq=False)
class RemoteContext:
    """A KV context held by the server under `handle`; `summary` is its provenance, as a local one's."""

    model: RemoteModel
    handle: str
    length: int
    summary_data: dict

    def summary(self) -> dict:
        return dict(self.summary_data)


@dataclass(frozen=True, eq=False)
class RemoteResume:
    """A paused (or finished) advanced run held by the server; `recorded` are its steps so far."""

    model: RemoteModel
    handle: str
    prompt: str
    context: object
    recorded: object  # trace.Recorded: the steps so far, as Recorder.snapshot()
    paused: bool = False

    @property
    def paused_step(self) -> int:
        """The step a resumed window continues at: the one after the paused block's last, else 0."""
        return self.recorded.rows[-1].step + 1 if self.paused and self.recorded.rows else 0

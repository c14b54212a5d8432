"""Quantization modes: what each expects of a checkpoint, and what loading it needs."""

from __future__ import annotations

QUANTS = ("none", "autoround")


def quant_method(config) -> str | None:
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method))


def check_quant(quant: str, config, source: str) -> None:
    """Refuse a quant mode that does not match the checkpoint, before any weight is read."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {quant!r}")
    method = quant_method(config)
    if quant == "none" and method is not None:
        raise ValueError(f"{source!r} is a {method} quantized checkpoint but quant is 'none'; set quant to "
                         "'autoround' for an AutoRound checkpoint, or load an unquantized one")
    if quant == "autoround" and method != "auto-round":
        found = "no quantization_config" if method is None else f"quant_method {method!r}"
        raise ValueError(f"quant 'autoround' needs an AutoRound checkpoint, but {source!r} has {found}; set quant "
                         "to 'none', or pick an AutoRound INT4 checkpoint (e.g. "
                         "Intel/diffusiongemma-26B-A4B-it-int4-AutoRound)")


def load_kwargs(quant: str) -> dict:
    """Extra from_pretrained arguments for the mode."""
    return {}


def after_load(model, quant: str) -> None:
    """Repairs a mode needs once the weights are in."""

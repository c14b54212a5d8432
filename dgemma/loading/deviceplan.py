"""Where a model goes, from what a run needs and the card's total and free memory, or a refusal with routes.

A run needs more than its weights at rest: every stored copy while loading (an AutoRound model
drops its duplicate encoder layers only after), then the resident weights plus one step's working
memory (logit-sized temporaries over the vocabulary, self-conditioning, the prompt's KV cache).
A refusal names the routes that do work on this machine, each with what it costs per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1024**3
RAM_HEADROOM = 0.9             # share of free RAM a plan may fill: the OS and ComfyUI need the rest
CUDA_RESERVE = GIB // 2        # CUDA context and allocator slack beyond what `Need` counts
PCIE_BYTES_PER_S = 25e9        # PCIe 4.0 x16 as measured by most hosts
RAM_BYTES_PER_S = 40e9         # a desktop's memory bandwidth; a CPU step reads every weight at least once
# The (position x vocabulary entry) tensors alive at a step's peak, and their bytes per entry: the step's
# own tensors as it makes them (testing/tensorpeak.py counts them on any device), float32 whatever the
# weights' dtype, as the model's head returns its logits in float32.
# The draw's probabilities and noise are gone before the entropy's two are made (dgemma/steps/batch_step.py).
STEP_TENSORS = {"logits, as the head returns them": 4, "scaled by the temperature (the next self-conditioning)": 4,
                "probabilities, then the entropy's log-normalised logits": 4,
                "the draw's exponential noise, then the entropy's softmax": 4,
                "the previous step's self-conditioning, kept": 4}
STEP_BYTES_PER_LOGIT = sum(STEP_TENSORS.values())
LOAD_CONTEXT = 4096            # context tokens a load budgets for (its KV cache); a longer prompt needs more
GENERATOR_STATE = 8192         # bytes of a paused run's generator state (torch's CPU generator: 5,056)
INT4_SHARE = 0.592             # the real AutoRound INT4 checkpoint's bytes over the bf16 model's
# What `quant auto` tries, best quality first, for a checkpoint that each of them loads from.
AUTO_ORDER = ("none", "8bit", "4bit", "autoround", "gguf")  # a GGUF file loads in gguf alone
WHAT = {"none": "model", "autoround": "AutoRound INT4 model", "4bit": "4-bit model", "8bit": "8-bit model",
        "gguf": "GGUF model"}


@dataclass(frozen=True)
class Need:
    """Bytes a model holds: while loading (every stored copy), resident after loading, one step, and what a
    graph keeps beside it between runs (`kept_bytes`)."""

    load: int
    resident: int
    step: int = 0
    kept: int = 0

    @property
    def peak(self) -> int:
        return max(self.load, self.resident + self.kept + self.step)


@dataclass(frozen=True)
class Plan:
    """Where the weights go: one device, or a device_map with per-device budgets (offload), in which quant mode."""

    device: str
    device_map: object
    max_memory: dict | None
    weight_bytes: int
    streamed: int = 0   # weight bytes that cross PCIe every step (a GPU/CPU split)
    quant: str = "none"
    hint: str = ""      # a faster route the note names (a split that a quant mode would avoid)

    @property
    def note(self) -> str:
        """What the Loader and the progress text say about a split; empty when there is none."""
        if not self.streamed:
            return ""
        return (f"split: {self.streamed / GIB:.1f} GiB of weights stay in CPU RAM and cross PCIe every step "
                f"(at least {self.streamed / PCIE_BYTES_PER_S:.1f} s per step at 25 GB/s){self.hint}")


@dataclass(frozen=True)
class Route:
    """A load that works on this machine: quant and device, and its cost per step in words."""

    quant: str
    device: str
    cost: str

    def words(self) -> str:
        if self.quant == "remote":
            return f"a remote engine (`python -m serve` on a bigger GPU, through the Remote Loader; {self.cost})"
        return f"quant {self.quant} with device {self.device} ({self.cost})"


class Refusal(ValueError):
    """A plan that cannot work here; `routes` are the loads that would."""

    def __init__(self, problem: str, routes: list[Route]):
        self.routes = tuple(routes)
        super().__init__(f"{problem}; what works on this machine: " + "; or ".join(r.words() for r in routes))


def step_bytes(text_config, canvas: int, context: int, batch: int = 1) -> int:
    """One denoising step's working memory: logit-sized temporaries and the KV cache of `context` tokens."""
    return batch * (logit_bytes(text_config, canvas) + kv_bytes(text_config, context))


def kept_bytes(text_config, canvas: int, context: int = LOAD_CONTEXT, dtype_bytes: int = 2) -> int:
    """What stays on the device between runs, beside the model: a KV context's payload of `context` tokens (a
    run reads a private fork of it, budgeted in its step); a paused run's canvas, its ids so far and the
    float32 self-conditioning it continues from, with its generator's state (5 KB on the CPU); and a lane's
    host buffer for its step's copy (about 8 bytes a position; pinned RAM on CUDA, counted here too)."""
    per_position = STEP_TENSORS["the previous step's self-conditioning, kept"] * text_config.vocab_size + 3 * 8
    return kv_bytes(text_config, context, dtype_bytes) + canvas * per_position + GENERATOR_STATE


def logit_bytes(text_config, canvas: int) -> int:
    """One step's logit-sized tensors (STEP_TENSORS: STEP_BYTES_PER_LOGIT per position and vocabulary entry)."""
    return STEP_BYTES_PER_LOGIT * canvas * text_config.vocab_size


def kv_bytes(text_config, context: int, dtype_bytes: int = 2) -> int:
    """The KV cache of `context` tokens: sliding layers keep at most their window, full layers every token."""
    types = list(text_config.layer_types)
    window = min(context, getattr(text_config, "sliding_window", None) or context)
    total = 0
    for i, kind in enumerate(types):
        total += 2 * _kv_width(text_config, i, kind) * (context if kind == "full_attention" else window)
    return dtype_bytes * total


def _kv_width(text_config, i: int, kind: str) -> int:
    """Key (or value) values per token in layer `i`: newer transformers keep them per layer."""
    per_layer = getattr(text_config, "per_layer_config", None)  # absent before transformers 5.2x
    if per_layer:
        return per_layer[i].num_key_value_heads * per_layer[i].head_dim
    if kind == "full_attention":
        return ((getattr(text_config, "num_global_key_value_heads", None) or text_config.num_key_value_heads)
                * (getattr(text_config, "global_head_dim", None) or text_config.head_dim))
    return text_config.num_key_value_heads * text_config.head_dim


def need_for(weights: int, text_config, canvas: int, quant: str, shared: int = 0,
             made: dict[str, Need] | None = None, dense: int = 0) -> dict[str, Need]:
    """Every mode's Need: this checkpoint's in `quant`, the twin checkpoint's in the other stored mode (estimated
    from the real model's ratio), and `made` (the modes quantized at load, see made_need). An AutoRound step
    dequantizes one layer's experts at a time (`dense` bytes), as a mode made at load does."""
    step, kept = step_bytes(text_config, canvas, LOAD_CONTEXT), kept_bytes(text_config, canvas)
    steps = {"none": step, "autoround": step + max(0, dense - logit_bytes(text_config, canvas))}
    other = "none" if quant == "autoround" else "autoround"
    twin = int(weights / INT4_SHARE) if quant == "autoround" else int(weights * INT4_SHARE)
    return {quant: Need(weights, weights - shared, steps[quant], kept), other: Need(twin, twin, steps[other], kept),
            **(made or {})}


def made_need(bf16_bytes: int, quantized_numel: int, packed_bytes: int, dense_numel: int, largest_numel: int,
              step: int, element: int = 2, logits: int = 0, kept: int = 0) -> Need:
    """A mode quantized at load: `quantized_numel` weights of the `bf16_bytes` model held as `packed_bytes`.

    Loading holds one tensor in flight (`largest_numel`) beside what is already quantized. A step
    dequantizes one layer's experts at a time (`dense_numel`), while the logit-sized temporaries
    (`logits` of the `step`) are not yet made, so the step needs the larger of the two.
    """
    resident = bf16_bytes - quantized_numel * element + packed_bytes
    return Need(resident + largest_numel * element, resident, step + max(0, dense_numel * element - logits), kept)


def plan(need: Need, device: str, *, ram: int, vram: int, total_vram: int = 0, quant: str = "none",
         others: dict[str, Need] | None = None) -> Plan:
    """The placement of `quant` for `device` (auto, cuda or cpu), or a Refusal naming the routes that work.

    Only the unquantized model is ever split between GPU and CPU (accelerate's offload of packed
    layers fails inside from_pretrained, and quantized layers are sized to fit whole); `others` are
    the other modes' Needs (this checkpoint's, or its twin's), so a refusal or a split's note can name them.
    """
    needs = {**(others or {}), quant: need}
    placed, problem = _place(need, device, ram, vram, quant)
    if placed is not None:
        return replace(placed, quant=quant, hint=_hint(placed, needs, ram, vram))
    card = f" (a {_gib(total_vram)} card)" if total_vram and "GPU" in problem else ""
    raise Refusal(problem + card, routes(needs, ram, vram, skip=(quant, device)))


def choose(needs: dict[str, Need], own: tuple[str, ...], device: str, *, ram: int, vram: int,
           total_vram: int = 0) -> Plan:
    """`quant auto`: of the modes this checkpoint loads in (`own`), the best that runs whole on the GPU, else
    the unquantized model split, else the best that fits in RAM; a Refusal naming every need otherwise."""
    ordered = [q for q in AUTO_ORDER if q in own]
    on_gpu = bool(vram) and device != "cpu"
    for q, d in _auto_tries(ordered, device, on_gpu):
        placed, _ = _place(needs[q], d, ram, vram, q)
        if placed is not None and (d != "auto" or placed.streamed):
            return replace(placed, quant=q)
    where, free = ("the GPU", vram) if on_gpu else ("RAM", ram)
    listed = ", ".join(f"{q} {_gib(needs[q].peak)}" for q in ordered)
    card = f" (a {_gib(total_vram)} card)" if total_vram and on_gpu else ""
    raise Refusal(f"no quant mode of this checkpoint fits {where} ({_gib(free)} free; needs: {listed}){card}",
                  routes(needs, ram, vram))


def _auto_tries(ordered: list[str], device: str, on_gpu: bool) -> list[tuple[str, str]]:
    """(quant, device) in the order auto tries them: whole on the GPU, the bf16 split, then the CPU."""
    tries = [(q, "cuda") for q in ordered] if on_gpu else []
    if on_gpu and device == "auto" and "none" in ordered:
        tries.append(("none", "auto"))
    return tries + ([(q, "cpu") for q in ordered] if device != "cuda" else [])


def _place(need: Need, device: str, ram: int, vram: int, quant: str) -> tuple[Plan | None, str]:
    """(the plan, "") or (None, what does not fit)."""
    what = WHAT.get(quant, "model")
    if device == "cpu" or (device == "auto" and not vram):
        if need.peak <= ram * RAM_HEADROOM:
            return Plan("cpu", None, None, need.load), ""
        return None, f"the {what} needs {_gib(need.peak)} but only {_gib(ram)} of RAM is free"
    if need.peak <= vram - CUDA_RESERVE:
        return Plan("cuda", {"": 0}, None, need.load), ""
    short = f"the {what} needs {_gib(need.peak)} on the GPU but it has {_gib(vram)} free"
    if quant != "none":
        return None, short + f" and a {what.removesuffix(' model')} model cannot be split between GPU and CPU"
    if device == "cuda":
        return None, short + " and device cuda keeps it whole on the GPU"
    split = _split(need, ram, vram)
    if split is None:
        return None, (f"the {what} needs {_gib(need.peak)} but GPU and RAM together have "
                      f"{_gib(max(0, vram - CUDA_RESERVE) + ram * RAM_HEADROOM)} to spare")
    return split, ""


def _split(need: Need, ram: int, vram: int) -> Plan | None:
    """bf16 across GPU and CPU RAM (device auto): the part past the GPU budget streams over PCIe. accelerate fills
    the GPU in module order ("sequential"): its balanced map ("auto") can put the two sides of an encoder/decoder
    tie on different devices and leave one on the meta device."""
    gpu = max(0, vram - CUDA_RESERVE - need.step - need.kept)
    on_cpu = need.load - gpu
    if gpu <= 0 or on_cpu > ram * RAM_HEADROOM:
        return None
    budget = {0: int(gpu), "cpu": int(ram * RAM_HEADROOM)}
    return Plan("cuda", "sequential", budget, need.load, streamed=int(on_cpu))


def _hint(placed: Plan, needs: dict[str, Need], ram: int, vram: int) -> str:
    """For a split: the modes that would run whole on this GPU instead."""
    if not placed.streamed:
        return ""
    whole = [q for q in AUTO_ORDER if q in needs and _place(needs[q], "cuda", ram, vram, q)[0] is not None]
    return f"; quant {whole[0]} runs whole on this GPU ({_gib(needs[whole[0]].peak)})" if whole else ""


def routes(needs: dict[str, Need], ram: int, vram: int, skip=()) -> list[Route]:
    """Every load that fits here (each mode: GPU whole, split, CPU), best quality first, then remote."""
    found = []
    for q in [q for q in AUTO_ORDER if q in needs]:
        n = needs[q]
        for device in ("cuda", "auto", "cpu"):
            if (q, device) == tuple(skip):
                continue
            p, _ = _place(n, device, ram, vram, q)
            if p is None or (device == "cuda" and not vram):
                continue
            if device == "auto" and not p.streamed:
                continue  # the same as cuda: already listed
            found.append(Route(q, device, _cost(p, n)))
    found.append(Route("remote", "", "the remote GPU's speed, plus one round trip per block"))
    return found


def _cost(p: Plan, need: Need) -> str:
    if p.streamed:
        return f"{_gib(p.streamed)} over PCIe every step, at least {p.streamed / PCIE_BYTES_PER_S:.1f} s per step"
    if p.device == "cpu":
        return f"{_gib(need.peak)} of RAM, at least {need.resident / RAM_BYTES_PER_S:.1f} s per step"
    return f"whole on the GPU in {_gib(need.peak)}"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"

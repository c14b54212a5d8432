"""DiffusionGemma engine: loading, the block-diffusion loop, capture and readouts (no ComfyUI)."""

from .versions import check_versions

check_versions()

from .constraints.constraint import Constraint  # noqa: E402
from .denoising.run import RunResult, generate, prepare, run_batch  # noqa: E402
from .errors import Cancelled  # noqa: E402
from .inputs.knobs import KNOBS, Knobs  # noqa: E402
from .loading.load import load_model  # noqa: E402
from .payloads import CanvasState, DGemmaModel, RunConfig  # noqa: E402
from .readouts.trace import CanvasTrace, Frame  # noqa: E402

__all__ = ["Constraint", "KNOBS", "Knobs", "load_model", "Cancelled", "CanvasState", "DGemmaModel", "RunConfig",
           "RunResult", "generate", "prepare", "run_batch", "CanvasTrace", "Frame"]

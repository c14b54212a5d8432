"""The tools' arguments, advertised from the engine's tables so agents see the node widgets' ranges."""

from __future__ import annotations

from ..dgemma.constraints.constraint import KINDS
from ..dgemma.demo import DEMO_NAME
from ..dgemma.denoising.resume import WINDOW_KNOBS
from ..dgemma.inputs.knobs import KNOBS, SEED_MAX
from ..dgemma.loading.load_options import LOAD_OPTIONS
from ..dgemma.steps.schedulers import SCHEDULER_KNOBS, SCHEDULERS, default
from .schemas import JSON_INT_MAX, Arg, choice_arg, flag_arg, knob_arg, text_arg

SCHEDULER_HELP = ("Which diffusers scheduler runs the steps: entropy_bound (the released default), block_refinement "
                  "or discrete_ddim; each reads its own knobs (temperature, threshold, editing_threshold, "
                  "corrector_steps, corrector_k). On resume it defaults to the paused run's.")
PINS_HELP = ("Text held in place on the canvas. A template pins its text at the start of the answer, each blank "
             "(___, or ___{n} for n positions) left to the model, e.g. 'The answer is ___.'; a line '12: text' pins "
             "text from answer position 12. Empty: no pins.")
MAX_PROMPTS = 64
MAX_HANDLE = 64  # handles are ctx-/run- and 8 hex digits
MAX_PATH = 4096
PROMPTS_HELP = ("Several turns answered together as one batch (one decoder forward per step for them all), each "
                "exactly as a call with that prompt and the same other arguments, except that item i uses seed + i "
                "so the answers differ; the result's items hold one result per prompt, in order. Not with prompt or "
                f"resume; at most {MAX_PROMPTS}.")
IMAGE_HELP = ("A picture the model reads before the text: base64 PNG or JPEG (bare or as a data: URL), or a path "
              "to a picture file under the server's image folders (--image-dir, default ./input).")


def seed_arg() -> Arg:
    spec = KNOBS["seed"]
    return Arg("seed", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": JSON_INT_MAX},
                                  {"type": "string", "pattern": "^[0-9]+$"}],
                        "default": spec.default, "description": f"{spec.tooltip} Up to {SEED_MAX}; pass seeds above "
                        "2^53 - 1 as a string of digits, which JSON clients hold exactly."})


def window_args() -> list[Arg]:
    start, end = WINDOW_KNOBS["start_step"], knob_arg("end_step", WINDOW_KNOBS["end_step"])
    return [Arg("start_step", {"anyOf": [{"type": "integer", "minimum": start.lo, "maximum": start.hi},
                                         {"const": "auto"}], "default": "auto", "description":
                               "First step of the first block this call runs (0-based; later blocks start at 0). "
                               "auto: 0 for a fresh run, the paused step when resuming."}), end]


def generate_args() -> list[Arg]:
    knobs = [seed_arg()] + [knob_arg(n, s) for n, s in KNOBS.items() if n != "seed"]
    return [
        text_arg("prompt", "The user turn, rendered through the model's chat template. May be empty when a "
                           "context or image is given; on resume it defaults to the paused run's."),
        Arg("prompts", {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_PROMPTS,
                        "description": PROMPTS_HELP}),
        text_arg("context", "Optional raw CONTEXT text (no chat framing), encoded for this run before the turn; "
                            "with context_handle it continues that context."),
        text_arg("context_handle", "Optional handle from the encode tool; the encoded context is never modified.",
                 most=MAX_HANDLE),
        Arg("image", {"type": "string", "description": IMAGE_HELP}),
        *knobs,
        choice_arg("scheduler", list(SCHEDULERS), default().name, SCHEDULER_HELP),
        *[knob_arg(n, s) for n, s in SCHEDULER_KNOBS.items()],
        *window_args(),
        text_arg("pins", PINS_HELP),
        choice_arg("constraint_type", KINDS, KINDS[0], "What constraint is: a JSON Schema, a regex the whole answer "
                                                       "matches, or a choice (one option per line)."),
        Arg("constraint", {"type": ["string", "object"], "default": "", "description":
                           "The answer's constraint, of constraint_type (a JSON Schema as text or an object); empty: "
                           "none. canvas_state.constraint says whether the answer satisfied it."}),
        text_arg("resume", "Handle of a paused run (paused_handle of an earlier call) to continue exactly; the "
                           "prompt, context, image, gen_length, num_inference_steps, thinking and scheduler are "
                           "the paused run's.", most=MAX_HANDLE),
        flag_arg("runlog", "Also write the run as a dg-runlog/1 JSON Lines file; its path is returned (the log "
                           "is also a resource, runlog_uri, either way)."),
        flag_arg("gif", "Also write every step as an animated GIF: its path is returned and the GIF comes back "
                        "as image content."),
        text_arg("output_dir", "Folder for the run log and GIF (default: ./output of the server).", most=MAX_PATH),
    ]


def loader_args() -> list[Arg]:
    options = [flag_arg(name, o.tooltip) if o.choices is None else choice_arg(name, o.choices, o.default, o.tooltip)
               for name, o in LOAD_OPTIONS.items()]
    return [text_arg("model", f"'{DEMO_NAME}' (the tiny model shipped with the pack), a checkpoint folder holding "
                              "config.json, or a hub id such as 'google/diffusiongemma-26B-A4B-it'.", DEMO_NAME,
                     most=MAX_PATH),
            *options]


def encode_args() -> list[Arg]:
    return [
        Arg("text", {"type": "string", "description": "Raw CONTEXT, encoded as is: a document, a prior turn. May "
                                                      "be empty when an image is given."}, required=True),
        text_arg("onto", "Optional handle of a context to continue with this text.", most=MAX_HANDLE),
        Arg("image", {"type": "string", "description": IMAGE_HELP}),
    ]

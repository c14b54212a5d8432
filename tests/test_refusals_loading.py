"""Refusals before any weight is read: model folders, safetensors headers, quant, Loader inputs, outputs.

Every case is one row: what to break, what to call, and the words its ValueError must hold (the
input's name, the bad value or file, a word of the fix). No row may reach the model's
from_pretrained, read stdin, run checkpoint code, or leave a file behind.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import stat
import struct
import sys
from pathlib import Path

import pytest

from diffusiongemma.dgemma import load_model
from diffusiongemma.dgemma.loading import quant
from diffusiongemma.dgemma.readouts import outfiles
from diffusiongemma.nodes.loader import DGemmaLoader

HUB_ID = "google/diffusiongemma-26B-A4B-it"


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail the test if any model class's from_pretrained is reached."""
    def refuse(*args, **kwargs):
        pytest.fail("from_pretrained was called: weights were read")

    for mode in quant.QUANTS:
        monkeypatch.setattr(quant.model_class(mode), "from_pretrained", classmethod(refuse))


@pytest.fixture
def no_console(monkeypatch):
    """Fail the test if anything prompts on the console (transformers asks before running remote code)."""
    class NoStdin:
        def __getattr__(self, name):
            pytest.fail(f"stdin was used ({name})")

    monkeypatch.setattr(sys, "stdin", NoStdin())
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("input() was called"))


# --- model folders -------------------------------------------------------------------------------

def edit_json(folder: Path, name: str, edit) -> None:
    data = json.loads((folder / name).read_text())
    edit(data)
    (folder / name).write_text(json.dumps(data))


def code_with_marker(folder: Path) -> None:
    """A config that maps to checkpoint code which, if imported, writes a marker beside the folder."""
    edit_json(folder, "config.json", lambda d: d.update(auto_map={"AutoConfig": "configuration_x.XConfig"}))
    (folder / "configuration_x.py").write_text(
        f"open({str(folder.parent / 'marker')!r}, 'w').write('checkpoint code ran')\n")


def auto_map_only(folder: Path) -> None:
    edit_json(folder, "config.json", lambda d: d.update(auto_map={"AutoConfig": "evil/repo--configuration_x.X"}))


def nested_code(folder: Path) -> None:
    (folder / "custom_generate").mkdir()
    (folder / "custom_generate" / "generate.py").write_text("raise SystemExit('ran')\n")


def tokenizer_auto_map(folder: Path) -> None:
    edit_json(folder, "tokenizer_config.json", lambda d: d.update(auto_map={"AutoTokenizer": ["tok.T", None]}))


def model_type(value):
    def edit(folder: Path) -> None:
        edit_json(folder, "config.json", lambda d: d.pop("model_type") if value is None else d.update(model_type=value))
    return edit


def config_bytes(raw: bytes):
    def edit(folder: Path) -> None:
        (folder / "config.json").write_bytes(raw)
    return edit


# --- safetensors headers --------------------------------------------------------------------------

def set_header(raw: bytes, declared: int | None = None):
    """Replace model.safetensors' header by `raw` (its declared length by `declared`), keeping the data."""
    def edit(folder: Path) -> None:
        path = folder / "model.safetensors"
        blob = path.read_bytes()
        (length,) = struct.unpack("<Q", blob[:8])
        path.write_bytes(struct.pack("<Q", len(raw) if declared is None else declared) + raw + blob[8 + length:])
    return edit


def edit_entry(change):
    """Apply `change(entry)` to the first tensor entry of model.safetensors' header."""
    def edit(folder: Path) -> None:
        header = json.loads(_header(folder / "model.safetensors"))
        name = next(k for k in header if k != "__metadata__")
        header[name] = change(header[name])
        set_header(json.dumps(header).encode())(folder)
    return edit


def _header(path: Path) -> bytes:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return blob[8:8 + length]


def without(key):
    return edit_entry(lambda e: {k: v for k, v in e.items() if k != key})


def entry(**fields):
    return edit_entry(lambda e: {**e, **fields})


def huge_header(folder: Path) -> None:
    path = folder / "model.safetensors"
    with path.open("r+b") as fh:
        fh.write(struct.pack("<Q", 150_000_000))
        fh.truncate(200_000_000)  # sparse: costs no disk


def rename_to_qweight(folder: Path) -> None:
    header = json.loads(_header(folder / "model.safetensors"))
    name = next(k for k in header if k.endswith("self_attn.q_proj.weight"))
    header[name.removesuffix(".weight") + ".qweight"] = header.pop(name)
    set_header(json.dumps(header).encode())(folder)


def autoround_config(folder: Path) -> None:
    edit_json(folder, "config.json", lambda d: d.update(
        quantization_config={"quant_method": "auto-round", "bits": 4, "group_size": 32, "packing_format": "auto_gptq"}))


MODEL = "model.safetensors"
FOLDER_CASES = [
    # id, break the copy, load_model kwargs, words the message must hold
    ("code-with-auto-map", code_with_marker, {}, ["Python code", "configuration_x.py", "remove"]),
    ("auto-map-to-hub-code", auto_map_only, {}, ["auto_map", "evil/repo--configuration_x.X", "official"]),
    ("nested-py", nested_code, {}, ["Python code", "generate.py", "remove"]),
    ("tokenizer-auto-map", tokenizer_auto_map, {}, ["tokenizer_config.json", "auto_map", "remove"]),
    ("unknown-model-type", model_type("made_up_lm"), {}, ["model_type", "'made_up_lm'", "use a DiffusionGemma"]),
    ("foreign-model-type", model_type("llama"), {}, ["model_type", "'llama'", "use a DiffusionGemma"]),
    ("no-model-type", model_type(None), {}, ["model_type", "None", "use a DiffusionGemma"]),
    ("config-not-json", config_bytes(b'{"model_type": '), {}, ["config.json", "not valid JSON", "download"]),
    ("config-not-utf8", config_bytes(b'{"model_type": "\xff"}'), {}, ["config.json", "not valid JSON", "download"]),
    ("config-a-list", config_bytes(b'["diffusion_gemma"]'), {}, ["config.json", "JSON list", "download"]),
    ("header-not-utf8", set_header(b'{"\xff\xfe": 1}'), {}, [MODEL, "not UTF-8", "download"]),
    ("header-not-json", set_header(b'{"a": '), {}, [MODEL, "not valid JSON", "download"]),
    ("header-a-list", set_header(b"[1, 2]"), {}, [MODEL, "JSON list", "download"]),
    ("header-over-100mb", huge_header, {}, [MODEL, "150000000-byte header", "download"]),
    ("header-longer-than-file", set_header(b"{}", declared=10**9), {}, [MODEL, "truncated", "download"]),
    ("entry-no-offsets", without("data_offsets"), {}, [MODEL, "has no data_offsets", "download"]),
    ("entry-no-dtype", without("dtype"), {}, [MODEL, "has no dtype", "download"]),
    ("entry-no-shape", without("shape"), {}, [MODEL, "has no shape", "download"]),
    ("entry-not-object", edit_entry(lambda e: 7), {}, [MODEL, "is 7, not an object", "download"]),
    ("unknown-dtype", entry(dtype="F13"), {}, [MODEL, "unknown dtype 'F13'", "download"]),
    ("offsets-reversed", entry(data_offsets=[8, 0]), {}, [MODEL, "bad data_offsets [8, 0]", "download"]),
    ("offsets-negative", entry(data_offsets=[-4, 0]), {}, [MODEL, "bad data_offsets [-4, 0]", "download"]),
    ("offsets-text", entry(data_offsets=["0", "8"]), {}, [MODEL, "bad data_offsets ['0', '8']", "download"]),
    ("offsets-vs-shape", entry(data_offsets=[0, 4]), {}, [MODEL, "do not fit its shape", "download"]),
    ("offsets-past-end", entry(data_offsets=[0, 10**7], shape=[10**7 // 4]), {}, [MODEL, "truncated", "download"]),
    ("shape-bool", entry(shape=[True]), {}, [MODEL, "bad shape [True]", "download"]),
    ("autoround-config-plain-weights", autoround_config, {"quant": "autoround"},
     ["quant_method 'auto-round'", ".qweight", "not quantized"]),
    ("plain-config-packed-weights", rename_to_qweight, {}, ["q_proj.qweight", "quantization_config", "download"]),
    ("quant-unknown", lambda f: None, {"quant": "q4_k_m"}, ["quant", "'q4_k_m'", "one of"]),
    ("device-unknown", lambda f: None, {"device": "tpu"}, ["device", "'tpu'", "pick one of"]),
    ("dtype-unknown", lambda f: None, {"dtype": "int8"}, ["dtype", "'int8'", "pick one of"]),
    ("local-files-only-text", lambda f: None, {"local_files_only": "yes"},
     ["local_files_only", "'yes'", "true or false"]),
]


@pytest.mark.parametrize("breaker, kwargs, words", [c[1:] for c in FOLDER_CASES], ids=[c[0] for c in FOLDER_CASES])
def test_model_folder_refused(tiny_dir, tmp_path, no_weights_read, no_console, breaker, kwargs, words):
    folder = Path(shutil.copytree(tiny_dir, tmp_path / "ckpt"))
    breaker(folder)
    with pytest.raises(ValueError) as err:
        load_model(str(folder), **kwargs)
    for word in words:
        assert word in str(err.value)
    assert not (tmp_path / "marker").exists()  # the checkpoint's code never ran


def test_hub_config_is_vetted_before_transformers(tiny_dir, tmp_path, monkeypatch, no_weights_read, no_console):
    import huggingface_hub

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads((tiny_dir / "config.json").read_text()),
                                  "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **kw: str(config))
    with pytest.raises(ValueError, match=r"config.json of 'someone/evil' has auto_map .*official"):
        load_model("someone/evil", local_files_only=True)


@pytest.mark.parametrize("qc, names, words", [
    ({"quant_method": "auto-round"}, ["a.weight"], ["quant_method 'auto-round'", "not quantized", "download"]),
    (None, ["a.qweight", "a.scales"], ["'a.qweight'", "no quantization_config", "download"]),
])
def test_hub_index_names_are_matched_to_the_config(monkeypatch, qc, names, words):
    from types import SimpleNamespace

    from diffusiongemma.dgemma.loading import load, preflight

    monkeypatch.setattr(preflight, "hub_index", lambda repo, local: {"weight_map": dict.fromkeys(names, "m.st")})
    with pytest.raises(ValueError) as err:
        load.stored_bytes(None, "someone/ckpt", True, SimpleNamespace(quantization_config=qc))
    assert "'someone/ckpt'" in str(err.value) and all(w in str(err.value) for w in words)


def test_every_from_pretrained_gets_trust_remote_code_false(tiny_dir, monkeypatch):
    import transformers

    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoProcessor, transformers.AutoTokenizer,
                quant.model_class("none")):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code", "absent")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    load_model(str(tiny_dir))
    names = {name for name, _ in calls}
    assert {"AutoConfig", "AutoProcessor", "DiffusionGemmaForBlockDiffusion"} <= names
    assert all(flag is False for _, flag in calls), calls


# --- Loader inputs -------------------------------------------------------------------------------

GOOD = {"quant": "none", "model": HUB_ID, "device": "cpu", "dtype": "auto", "local_files_only": True}
LOADER_CASES = [
    (name, value, fix)
    for name, fix in (("quant", "pick one of"), ("device", "pick one of"), ("dtype", "pick one of"))
    for value in (None, 3, {"a": 1}, ["none"])
] + [("model", value, "pick a folder") for value in (3, {"a": 1}, ["x"])] + [
    ("local_files_only", value, "true or false") for value in (None, 1, "yes", {"a": 1})]


@pytest.mark.parametrize("name, value, fix", LOADER_CASES, ids=[f"{c[0]}={c[1]!r}" for c in LOADER_CASES])
def test_loader_input_types(no_weights_read, name, value, fix):
    with pytest.raises(ValueError) as err:
        DGemmaLoader().load(**{**GOOD, name: value})
    message = str(err.value)
    assert f"input {name}" in message and repr(value) in message and fix in message


def test_load_model_source_type(no_weights_read):
    with pytest.raises(ValueError, match=r"model source must be text .*got 3 \(int\); give a folder path"):
        load_model(3)


# --- output folders and prefixes ------------------------------------------------------------------

def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def write_x(fh):
    fh.write(b"x")


def out_is_a_file(out: Path):
    out.write_text("not a folder")
    return "run", ["output folder", str(out), "move that file"]


def sub_is_a_file(out: Path):
    out.mkdir()
    (out / "x").write_text("a file where a folder should be")
    return "x/run", ["output folder", str(out / "x"), "choose another filename_prefix"]


def read_only(out: Path, monkeypatch):
    out.mkdir()
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    real_open = os.open

    def deny(path, *args, **kwargs):  # root ignores the mode bits; fail as a non-root user would
        if Path(path).parent == out:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    return "run", ["output folder", str(out), "writable"]


def prefix_case(prefix, *words):
    def setup(out: Path):
        out.mkdir()
        return prefix, list(words)
    return setup


def link_out(out: Path):
    out.mkdir()
    (out / "link").symlink_to(out.parent / "elsewhere", target_is_directory=True)
    (out.parent / "elsewhere").mkdir()
    return "link/run", ["filename_prefix", "'link/run'", "not a link"]


OUTPUT_CASES = [
    ("output-is-a-file", out_is_a_file),
    ("subfolder-is-a-file", sub_is_a_file),
    ("output-read-only", read_only),
    ("nul", prefix_case("run\0x", "filename_prefix", "'run\\x00x'", "remove it")),
    ("name-201-bytes", prefix_case("a" * 201, "filename_prefix", "201 bytes", "shorten")),
    ("name-multibyte", prefix_case("é" * 101, "filename_prefix", "202 bytes", "shorten")),
    ("folder-201-bytes", prefix_case("b" * 201 + "/run", "filename_prefix", "201 bytes", "shorten")),
    ("path-too-long", prefix_case("/".join(["c" * 150] * 30), "filename_prefix", "over 4000 bytes", "shorter")),
    ("lone-surrogate", prefix_case("run\udc80", "filename_prefix", "'run\\udc80'", "retype")),
    ("not-text", prefix_case(7, "filename_prefix", "got 7 (int)", "give a name")),
    ("parent", prefix_case("../escape", "filename_prefix", "'../escape'", "relative name")),
    ("absolute", prefix_case("/tmp/abs", "filename_prefix", "'/tmp/abs'", "relative name")),
    ("link-out", link_out),
]


@pytest.mark.parametrize("setup", [c[1] for c in OUTPUT_CASES], ids=[c[0] for c in OUTPUT_CASES])
def test_output_refused(tmp_path, monkeypatch, no_weights_read, setup):
    out = tmp_path / "out"
    prefix, words = setup(out, monkeypatch) if setup is read_only else setup(out)
    before = files_under(tmp_path)
    with pytest.raises(ValueError) as err:
        outfiles.save_new(out, prefix, ".jsonl", write_x)
    for word in words:
        assert word in str(err.value)
    assert files_under(tmp_path) == before  # no file, no temporary, no folder left


@pytest.mark.parametrize("prefix, written", [
    (".", "dgemma_00001.jsonl"), ("./", "dgemma_00001.jsonl"), ("./.", "dgemma_00001.jsonl"),
    ("sub/.", "sub/dgemma_00001.jsonl"), ("sub/", "sub/dgemma_00001.jsonl"), ("a/./b", "a/b_00001.jsonl"),
])
def test_folder_only_prefixes_write_inside(tmp_path, prefix, written):
    out = tmp_path / "out"
    path = outfiles.save_new(out, prefix, ".jsonl", write_x)
    assert path == out.resolve() / written and path.read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = outfiles.save_new(tmp_path, "run", ".jsonl", write_x)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["run_00001.jsonl"]

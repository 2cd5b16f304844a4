"""Checkpoints written by the code of commit 21dc30d (main before the "any encoder" change) still load, export and
resume unchanged with today's code.

tests/fixtures/checkpoints_v1 (its README.md says how it was made) holds, for retromae, dupmae and bow, a tiny
`retromae pretrain` run as that code wrote it: the final save (`run_<method>/`: config.json, model.safetensors,
tokenizer, the remote-code .py files, retromae_run.json) and the intermediate `run_<method>/checkpoint-2/` with what
`--resume-from-checkpoint` reads. expected.json holds what the legacy code computed from them: the losses of a
fixed masked batch, the [CLS] states of fixed texts, the embeddings of its `retromae export`, and the losses of
steps 3 and 4 of the run. Nothing is written into the fixture: exports and resumes work on copies in tmp_path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from retromae.trainers.cli import main
from retromae.trainers.inputs.checkpoints import load_encoder, load_tokenizer
from retromae.trainers.methods import get_method, method_of_config
from retromae.trainers.training.pretraining import load_pretraining_model
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints_v1"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
METHODS = ("retromae", "dupmae", "bow")
# the prefixes of the weights a pre-training checkpoint holds besides the encoder's `bert.*`
HEAD_PREFIXES = ("cls.", "decoder.")
# encoder weights no pre-training checkpoint holds: DupMAE's [CLS] projection, drawn from `config.dense_proj_seed`
NEW_IN_ENCODER = ("dense_proj.",)
ATOL = 1e-5


def final_save(method: str) -> Path:
    return FIXTURE / f"run_{method}"


def expected(method: str) -> dict:
    return EXPECTED["methods"][method]


def fixed_batch() -> dict[str, torch.Tensor]:
    """The masked batch of expected.json (collator-shaped: input_ids, attention_mask, encoder/decoder labels)."""
    return {name: torch.tensor(value) for name, value in EXPECTED["batch"].items()}


def losses_of(model) -> dict[str, float]:
    """Every loss of `model` (eval mode, seed 0, as the legacy code computed them) on the fixed batch."""
    with torch.no_grad():
        torch.manual_seed(0)
        out = model.eval()(**fixed_batch())
    return {name: value.item() for name, value in out.items() if name.endswith("loss")}


def assert_losses(got: dict[str, float], want: dict[str, float], atol: float = ATOL) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=atol), name


def cls_states(encoder, method: str) -> torch.Tensor:
    """The last-layer [CLS] states `(3, hidden)` of expected.json's texts, tokenized by the checkpoint's tokenizer."""
    inputs = load_tokenizer(final_save(method))(EXPECTED["texts"], padding=True, truncation=True, max_length=32,
                                                return_tensors="pt")
    with torch.no_grad():
        out = encoder.eval()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    return out.last_hidden_state[:, 0]


def assert_clean_load(info: dict, unexpected_ok: tuple[str, ...] = (), missing_ok: tuple[str, ...] = ()) -> None:
    """No weight mis-shaped, missing (but `missing_ok`) or unexpected (but `unexpected_ok`: the heads an encoder
    class leaves out)."""
    missing = [key for key in info["missing_keys"] if not key.startswith(missing_ok)]
    assert not missing, sorted(missing)[:5]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    unexpected = [key for key in info["unexpected_keys"] if not key.startswith(unexpected_ok)]
    assert not unexpected, sorted(unexpected)[:5]


def test_fixture_is_complete():
    """The fixture is what the tests below assume: each run's final save and a resumable checkpoint-2, weights
    named `bert.*` (the encoder), `cls.*` and `decoder.*`."""
    assert tuple(EXPECTED["methods"]) == METHODS
    for method in METHODS:
        folder = final_save(method)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
        assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "retromae_resume.json",
                "collator_rng_0.safetensors", "model.safetensors"} <= {p.name for p in (folder / "checkpoint-2").iterdir()}
        names = load_file(folder / "model.safetensors").keys()
        assert any(k.startswith("bert.") for k in names) and all(k.startswith(("bert.", *HEAD_PREFIXES)) for k in names)


@pytest.mark.parametrize("method", METHODS)
def test_model_type_is_still_the_methods(method):
    """The saved `model_type` still names the method, and today's config class of the method has it."""
    model_type = json.loads((final_save(method) / "config.json").read_text())["model_type"]
    assert model_type == expected(method)["model_type"]
    assert method_of_config(model_type).name == method
    assert get_method(method).model_class.config_class.model_type == model_type


@pytest.mark.parametrize("method", METHODS)
def test_todays_classes_load_every_weight_and_give_the_same_losses(method):
    model_class = get_method(method).model_class
    model, info = model_class.from_pretrained(final_save(method), output_loading_info=True)
    assert_clean_load(info)
    assert type(model.config).model_type == expected(method)["model_type"]
    assert_losses(losses_of(model), expected(method)["losses"])


@pytest.mark.parametrize("method", METHODS)
def test_auto_classes_with_the_checkpoints_remote_code(method):
    """What a user without retromae runs: the Auto classes with trust_remote_code (the checkpoint's own .py files)."""
    folder, want = final_save(method), expected(method)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    full, full_info = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    encoder, encoder_info = AutoModel.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    assert [type(config).__name__, type(encoder).__name__, type(full).__name__] == want["classes"]
    assert_clean_load(full_info)
    assert_clean_load(encoder_info, unexpected_ok=HEAD_PREFIXES, missing_ok=NEW_IN_ENCODER)
    assert_losses(losses_of(full), want["losses"])
    torch.testing.assert_close(cls_states(encoder, method), torch.tensor(want["cls"]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_our_loaders(method):
    """`load_encoder` (coverage, validation, ...) and `load_pretraining_model` (`retromae pretrain --model`)."""
    folder, want = final_save(method), expected(method)
    encoder = load_encoder(folder)
    torch.testing.assert_close(cls_states(encoder, method), torch.tensor(want["cls"]), atol=ATOL, rtol=0)
    model = load_pretraining_model(str(folder), get_method(method), {})
    assert_losses(losses_of(model), want["losses"])


@pytest.mark.parametrize("method", METHODS)
def test_export_gives_the_legacy_embeddings(method, tmp_path):
    source, out = tmp_path / f"run_{method}", tmp_path / "exported"
    shutil.copytree(final_save(method), source, ignore=shutil.ignore_patterns("checkpoint-*"))
    assert main(["export", str(source), str(out)]) == 0
    want = expected(method)["export"]
    model = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    assert [type(module).__name__ for module in model] == want["modules"]
    assert model.similarity_fn_name == want["similarity_fn_name"]
    assert model.max_seq_length == want["max_seq_length"]
    texts = EXPECTED["texts"]
    torch.testing.assert_close(model.encode_query(texts, convert_to_tensor=True), torch.tensor(want["query"]),
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(model.encode_document(texts, convert_to_tensor=True), torch.tensor(want["document"]),
                               atol=ATOL, rtol=0)


def moved_checkpoint(method: str, tmp_path: Path) -> Path:
    """A copy of the run's checkpoint-2 in tmp_path/run_<method>, with the corpus beside it; the paths its
    retromae_resume.json recorded (made absolute under the folder the fixture was made in) are moved to tmp_path,
    as if the run had been made there."""
    checkpoint = tmp_path / f"run_{method}" / "checkpoint-2"
    shutil.copytree(final_save(method) / "checkpoint-2", checkpoint)
    shutil.copy(FIXTURE / "corpus.txt", tmp_path / "corpus.txt")
    resume_file = checkpoint / "retromae_resume.json"
    recorded = resume_file.read_text(encoding="utf-8")
    assert EXPECTED["recorded_root"] in recorded
    resume_file.write_text(recorded.replace(EXPECTED["recorded_root"], str(tmp_path)), encoding="utf-8")
    return checkpoint


@pytest.mark.parametrize("method", METHODS)
def test_resume_continues_the_legacy_run_exactly(method, tmp_path):
    """`--resume-from-checkpoint` of the legacy checkpoint-2 trains steps 3 and 4 as the legacy run did: the same
    losses, and the final weights of the legacy run's final save."""
    checkpoint = moved_checkpoint(method, tmp_path)
    run = checkpoint.parent
    assert main(["pretrain", "--output-dir", str(run), "--resume-from-checkpoint", str(checkpoint),
                 "--no-export", "true"]) == 0
    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    logged = {str(entry["step"]): entry for entry in state["log_history"] if "loss" in entry}
    for step, want in expected(method)["resume"].items():
        assert logged[step]["loss"] == pytest.approx(want["loss"], abs=1e-4), step
        for name, value in want.items():  # the components are logged rounded to 4 decimals
            assert logged[step][name] == pytest.approx(value, abs=2e-4), (step, name)
    legacy, resumed = load_file(final_save(method) / "model.safetensors"), load_file(run / "model.safetensors")
    assert resumed.keys() == legacy.keys()
    learning_rates = [logged[step]["learning_rate"] for step in ("3", "4")]
    assert_same_weights(resumed, legacy, noise_atol=2 * sum(learning_rates))


def is_rounding_noise(name: str) -> bool:
    """A key bias adds one constant to every score of a query's softmax, which ignores it: its true gradient is zero
    and what it receives is rounding noise, which Adam turns into full-size steps whose sign depends on the CPU."""
    return name.endswith("attention.self.key.bias")


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], noise_atol: float) -> None:
    """Every weight within ATOL of `want`, but those trained on rounding noise: within `noise_atol` (Adam moves a
    weight by at most about the learning rate a step, whatever its gradient)."""
    far = {}
    for key, value in want.items():
        atol = noise_atol if is_rounding_noise(key) else ATOL
        difference = (got[key] - value).abs().max().item()
        if difference > atol:
            far[key] = f"max |diff| {difference:.2e} > {atol:.0e} (largest |value| {value.abs().max().item():.2e})"
    assert not far, "\n".join(f"{key}: {why}" for key, why in far.items())

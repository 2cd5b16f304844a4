"""`AutoModelForMaskedLM` and `pipeline("fill-mask")` on the pre-training checkpoints of every method on every base:
the encoder and its trained MLM head, decoders dropped, computing the pre-training model's own MLM logits. The Auto
loads run as remote code in one fresh interpreter without retromae, for all checkpoints at once."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from transformers import AutoTokenizer

from ..conftest import _run_without_retromae  # the fixture's function: the fresh process is module-scoped
from .test_families_modeling import METHODS as FAMILY_METHODS
from .test_families_modeling import batch_for, family_batch, method_model

FAMILIES = ("tiny_bert", "tiny_roberta", "tiny_xlm_roberta", "tiny_modernbert")
# one configuration per method (RetroMAE: enhanced decoding)
METHODS = {"retromae": FAMILY_METHODS["enhanced"],
           **{name: FAMILY_METHODS[name] for name in ("dupmae", "bow", "seed", "sentmae")}}
CASES = [(method, family) for method in METHODS for family in FAMILIES]
TOP_K = 3
V1_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints_v1"

# Run in a fresh interpreter without retromae over the checkpoint folders in argv: where auto_map names an
# AutoModelForMaskedLM, its logits at the masked positions of batch.json (`masked_lm_logits.pt`) and the fill-mask
# pipeline's top tokens; elsewhere the AutoModel's [CLS] states (`encoder_cls.pt`). Prints one JSON line.
FRESH_PROCESS_SCRIPT = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, pipeline
try:
    import retromae  # noqa: F401
    sys.exit("retromae must not be importable here")
except ImportError:
    pass
report = {}
for d in sys.argv[1:]:
    batch = json.load(open(d + "/batch.json"))
    ids, mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])
    if "AutoModelForMaskedLM" not in AutoConfig.from_pretrained(d, trust_remote_code=True).auto_map:
        encoder = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
        with torch.no_grad():
            torch.save(encoder(input_ids=ids, attention_mask=mask).pooler_output, d + "/encoder_cls.pt")
        report[d.rsplit("/", 1)[-1]] = {"encoder": type(encoder).__name__, "masked_lm": None}
        continue
    masked_lm = AutoModelForMaskedLM.from_pretrained(d, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = masked_lm(input_ids=ids, attention_mask=mask).logits
    torch.save(logits[torch.tensor(batch["masked"])], d + "/masked_lm_logits.pt")
    fill_mask = pipeline("fill-mask", model=d, trust_remote_code=True)
    top = fill_mask(batch["fill_mask_text"], top_k=batch["top_k"])
    report[d.rsplit("/", 1)[-1]] = {"masked_lm": type(masked_lm).__name__,
                                    "fill_mask": [[t["token"], t["score"]] for t in top]}
print(json.dumps(report))
"""

def mlm_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The pre-training model's own encoder + tied MLM head: `(batch_size, seq_len, vocab_size)`."""
    with torch.no_grad():
        return model.vocab_logits(model.encode(input_ids, attention_mask))


def fill_mask_expected(model, tokenizer) -> tuple[str, list[int], list[float]]:
    """A text with one mask token and the `TOP_K` ids and probabilities the pre-training model gives there."""
    text = f"the cat sat on the {tokenizer.mask_token} and looked at the dog"
    encoded = tokenizer(text, return_tensors="pt")
    position = (encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero().item()
    logits = mlm_logits(model, encoded["input_ids"], encoded["attention_mask"])[0, position]  # (vocab_size,)
    probabilities, ids = logits.softmax(-1).topk(TOP_K)
    return text, ids.tolist(), probabilities.tolist()


def save_case(model, folder: Path, checkpoint: Path) -> dict:
    """Save `model` with the base's tokenizer and a batch.json for the fresh process; returns what it must give."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = batch_for(type(model), family_batch(folder))
    masked = batch["encoder_labels"] != -100  # (B, L)
    text, top_ids, top_probabilities = fill_mask_expected(model, tokenizer)
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    (checkpoint / "batch.json").write_text(json.dumps({
        "input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist(),
        "masked": masked.tolist(), "fill_mask_text": text, "top_k": TOP_K}))
    with torch.no_grad():
        sentence_embedding = model(**batch).sentence_embedding  # (B, H)
    return {"logits": mlm_logits(model, batch["input_ids"], batch["attention_mask"])[masked],  # (n_masked, V)
            "top_ids": top_ids, "top_probabilities": top_probabilities, "cls": sentence_embedding,
            "config": json.loads((checkpoint / "config.json").read_text())}


def without_masked_lm_entry(checkpoint: Path, copy: Path) -> Path:
    """A copy of `checkpoint` whose config.json lacks the `AutoModelForMaskedLM` entry, as older code wrote it."""
    shutil.copytree(checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"].pop("AutoModelForMaskedLM", None)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.fixture(scope="module")
def loaded(request, tmp_path_factory) -> dict[str, dict]:
    """Per checkpoint folder name (`<method>-<family>`, and `old-<family>` for the copies without the entry): what
    the pre-training model computes (`expected`) and what the fresh process got (`report`, and its tensors)."""
    root = tmp_path_factory.mktemp("masked-lm")
    cases = {}
    for method, family in CASES:
        klass, options = METHODS[method]
        base = request.getfixturevalue(family)
        cases[f"{method}-{family}"] = {"expected": save_case(method_model(klass, base, options), base,
                                                             root / f"{method}-{family}")}
    for family in FAMILIES:
        old = without_masked_lm_entry(root / f"retromae-{family}", root / f"old-{family}")
        cases[old.name] = {"expected": cases[f"retromae-{family}"]["expected"]}
    env = {"HF_MODULES_CACHE": str(root / "modules"), "HF_HUB_OFFLINE": "1"}
    result = _run_without_retromae(FRESH_PROCESS_SCRIPT, [str(root / name) for name in cases], cwd=root,
                                  env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for name, case in cases.items():
        case["report"] = report[name]
        for tensor in ("encoder_cls", "masked_lm_logits"):
            if (root / name / f"{tensor}.pt").is_file():
                case[tensor] = torch.load(root / name / f"{tensor}.pt")
    return cases


@pytest.mark.parametrize("method, family", CASES)
def test_auto_model_for_masked_lm_gives_the_pretraining_models_mlm_logits(method, family, loaded):
    case = loaded[f"{method}-{family}"]
    expected, report = case["expected"], case["report"]
    klass = METHODS[method][0]
    assert expected["config"]["auto_map"]["AutoModelForMaskedLM"] == (
        f"{klass.__module__.rsplit('.', 1)[-1]}.{klass.masked_lm_class.__name__}")
    assert report["masked_lm"] == klass.masked_lm_class.__name__
    assert case["masked_lm_logits"].shape == expected["logits"].shape  # (n_masked, vocab_size)
    torch.testing.assert_close(case["masked_lm_logits"], expected["logits"], atol=1e-6, rtol=0)
    # the fill-mask pipeline ranks the mask position's tokens as the pre-training model's head does
    assert [token for token, _ in report["fill_mask"]] == expected["top_ids"]
    torch.testing.assert_close(torch.tensor([score for _, score in report["fill_mask"]]),
                               torch.tensor(expected["top_probabilities"]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_without_the_entry_still_loads_with_auto_model(family, loaded):
    old = loaded[f"old-{family}"]
    on_bert = family == "tiny_bert"
    encoder_class = RetroMAEForPretraining.encoder_class if on_bert else RetroMAEForPretraining.any_encoder_class
    assert old["report"] == {"encoder": encoder_class.__name__, "masked_lm": None}
    torch.testing.assert_close(old["encoder_cls"], old["expected"]["cls"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_lm_loss_is_the_encoder_mlm_loss(family, request, tmp_path):
    """The package's own class, loaded from a saved checkpoint: no missing keys, only the decoder left out, and its
    loss on the collator's labels is the pre-training model's `encoder_mlm_loss`."""
    folder = request.getfixturevalue(family)
    model = method_model(RetroMAEForPretraining, folder, {})
    model.save_pretrained(tmp_path)
    masked_lm, info = RetroMAEForPretraining.masked_lm_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert info["unexpected_keys"] and all(key.startswith("decoder.") for key in info["unexpected_keys"])
    assert masked_lm.get_output_embeddings().weight.data_ptr() == masked_lm.get_input_embeddings().weight.data_ptr()
    batch = batch_for(RetroMAEForPretraining, family_batch(folder))
    with torch.no_grad():
        expected = model(**batch).encoder_mlm_loss
        got = masked_lm.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               labels=batch["encoder_labels"]).loss
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["retromae", "dupmae", "bow"])
def test_a_v1_checkpoint_loads_into_the_packages_masked_lm(method):
    """A checkpoint written before the entry existed (tests/fixtures/checkpoints_v1) loads into today's class."""
    folder = V1_FIXTURE / f"run_{method}"
    klass = METHODS[method][0]
    full = klass.from_pretrained(folder).eval()
    masked_lm, info = klass.masked_lm_class.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"]
    ids = torch.tensor([[2, 7, 4, 9, 3]])  # any ids below the vocabulary size
    mask = torch.ones_like(ids)
    torch.testing.assert_close(masked_lm.eval()(input_ids=ids, attention_mask=mask).logits,
                               mlm_logits(full, ids, mask), atol=1e-6, rtol=0)

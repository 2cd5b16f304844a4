"""Loading checkpoints into our classes: no load-report table for the keys a load is meant to skip or create, the
full table for any other key, and non-BERT architectures refused by `from_encoder_checkpoint`."""

import importlib.util
import json
import logging
import os
import re
import sys
import types

import pytest
import torch
from retromae.modeling import configuration_retromae
from retromae.modeling.backbones import SUPPORTED_ENCODER_TYPES
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.pretraining_base import _pretraining_classes
from transformers import BertConfig, BertForPreTraining, BertModel, GPT2Config
from transformers.utils import logging as transformers_logging

from ..builders import hub_cache_layout, masked_batch, tiny_bert_kwargs, tiny_pretraining_config

PRETRAINING_CLASSES = [RetroMAEForPretraining, DupMAEForPretraining, SEEDEncoderForPretraining]
CONFIGURATION_FILE = configuration_retromae.__file__
TINY = dict(dense_dim=16)  # DupMAE's projection must fit the tiny hidden size


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_warnings():
    """Every message transformers logs at warning level (the suite runs with TRANSFORMERS_VERBOSITY=error)."""
    records = _Records()
    root = logging.getLogger("transformers")
    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    root.addHandler(records)
    try:
        yield records.messages
    finally:
        root.removeHandler(records)
        transformers_logging.set_verbosity(previous)


def _overrides(klass) -> dict:
    return TINY if klass is DupMAEForPretraining else {}


@pytest.mark.parametrize("klass", PRETRAINING_CLASSES, ids=lambda k: k.__name__)
def test_pretraining_checkpoint_into_encoder_class_logs_no_report(klass, tmp_path, transformers_warnings):
    model = klass(klass.config_class(**tiny_bert_kwargs(), **_overrides(klass)))
    model.save_pretrained(tmp_path)
    encoder, info = klass.encoder_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not [m for m in transformers_warnings if "LOAD REPORT" in m]
    assert any(k.startswith("decoder.") for k in info["unexpected_keys"])  # still told to a caller who asks
    state = dict(encoder.state_dict())
    assert torch.equal(state["encoder.layer.0.output.dense.weight"], model.bert.encoder.layer[0].output.dense.weight)


@pytest.mark.parametrize(
    "klass", [RetroMAEForPretraining, SEEDEncoderForPretraining, BoWForPretraining], ids=lambda k: k.__name__
)
def test_encoder_class_and_plain_bert_give_the_pretraining_sentence_embedding(klass, tmp_path):
    """A pre-training checkpoint loads into the method's encoder class and into a plain `BertModel` by dropping the
    `bert.` prefix; both give the pre-training model's [CLS] sentence embedding."""
    model = klass(tiny_pretraining_config(klass.config_class)).eval()
    model.save_pretrained(tmp_path)
    batch = masked_batch()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).sentence_embedding
    for encoder_class in (klass.encoder_class, BertModel):
        encoder, info = encoder_class.from_pretrained(tmp_path, output_loading_info=True)
        assert not [k for k in info["missing_keys"] if "pooler" not in k]  # BertModel's own pooler is new
        assert any(k.startswith("decoder.") for k in info["unexpected_keys"]) == bool(klass.head_prefixes)
        with torch.no_grad():
            output = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        assert torch.allclose(output.last_hidden_state[:, 0], expected, atol=1e-6)
        if encoder_class is klass.encoder_class:
            assert torch.equal(output.pooler_output, output.last_hidden_state[:, 0])


@pytest.mark.parametrize("klass", PRETRAINING_CLASSES, ids=lambda k: k.__name__)
@pytest.mark.parametrize("bert_class", [BertForPreTraining, BertModel], ids=["pooler+nsp+mlm", "bare"])
def test_bert_into_pretraining_class_logs_no_report(klass, bert_class, tmp_path, transformers_warnings):
    bert_class(BertConfig(**tiny_bert_kwargs())).save_pretrained(tmp_path)  # with BERT's pooler
    model = klass.from_encoder_checkpoint(tmp_path, **_overrides(klass))
    assert not [m for m in transformers_warnings if "LOAD REPORT" in m or "seem corrupted" in m]
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


def test_a_load_that_lost_encoder_weights_still_shows_the_report(tmp_path, transformers_warnings):
    from safetensors.torch import save_file

    BertConfig(**tiny_bert_kwargs()).save_pretrained(tmp_path)
    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not a BERT checkpoint"):
        RetroMAEForPretraining.from_encoder_checkpoint(tmp_path)
    assert [m for m in transformers_warnings if "LOAD REPORT" in m and "bert.encoder.layer" in m]


def test_an_unsupported_architecture_is_refused_naming_the_supported_ones(tmp_path):
    GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a supported encoder; retromae pre-trains bert, "
                                         "roberta, xlm-roberta, modernbert"):
        RetroMAEForPretraining.from_encoder_checkpoint(tmp_path)


def test_every_method_checkpoint_is_recognised_as_ours():
    """The method types `from_encoder_checkpoint` accepts are derived from the model classes, not kept by hand."""
    from retromae.trainers.methods import METHODS

    known = {c.config_class.model_type for c in _pretraining_classes()}
    assert {m.model_class.config_class.model_type for m in METHODS.values()} <= known
    assert known.isdisjoint(SUPPORTED_ENCODER_TYPES)


def test_a_failed_load_still_shows_the_report_it_refers_to(tmp_path, transformers_warnings):
    RetroMAEForPretraining(RetroMAEForPretraining.config_class(**tiny_bert_kwargs())).save_pretrained(tmp_path)
    other_width = RetroMAEForPretraining.config_class(**tiny_bert_kwargs(intermediate_size=40))
    # transformers raises "For details look at the above report!": one line of ours, with an example from it
    with pytest.raises(ValueError, match=r"its weights have other shapes than its config.json gives, e\.g\. "
                                         r"\S[^(]*\.dense\.\w+ \(ckpt: torch\.Size\(\[[^)]*37"):
        RetroMAEForPretraining.from_pretrained(tmp_path, config=other_width)
    assert [m for m in transformers_warnings if "LOAD REPORT" in m and "intermediate" in m]


@pytest.mark.parametrize("klass", PRETRAINING_CLASSES, ids=lambda k: k.__name__)
def test_a_checkpoint_tokenizer_loads_without_a_model_type_warning(klass, tokenizer, tmp_path, transformers_warnings):
    """AutoTokenizer cannot read a method's config.json without remote code; `load_tokenizer` hands it the base's
    config instead of letting it fall back to a bare config, which warned "model of type `dupmae` ... ``"."""
    from retromae.trainers.inputs.checkpoints import load_tokenizer

    klass(klass.config_class(**tiny_bert_kwargs(), **_overrides(klass))).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded("a retrieval test")["input_ids"] == tokenizer("a retrieval test")["input_ids"]
    assert not [m for m in transformers_warnings if "to instantiate a model of type" in m]


# Run in a fresh interpreter without retromae: load each folder of argv[1:] through AutoModel as remote code, in that
# order; prints one JSON line: per folder its class, its missing weights and the [CLS] states of fixed ids.
LOAD_IN_ORDER_SCRIPT = r"""
import json, sys, torch
from transformers import AutoModel
ids = torch.tensor([[0, 5, 6, 7, 8, 2]])
report = []
for folder in sys.argv[1:]:
    model, info = AutoModel.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    with torch.no_grad():
        cls = model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).pooler_output
    report.append({"class": type(model).__name__, "missing": sorted(info["missing_keys"]), "cls": cls.tolist()})
print(json.dumps(report))
"""


@pytest.mark.parametrize("first", ["bert", pytest.param("roberta", marks=pytest.mark.long)])  # one load order in `make test`
def test_same_named_checkpoints_of_two_bases_each_load_as_themselves(first, tiny_roberta, tmp_path,
                                                                    run_without_retromae):
    """`checkpoint-3` of a BERT run and of a RoBERTa run hold byte-identical code, so transformers gives both one
    dynamic module (folder name + code hash), hence one config class; AutoModel's registry, keyed on that class,
    handed the second checkpoint the first one's encoder class (every weight unexpected, the encoder random)."""
    torch.manual_seed(0)
    models = {"bert": RetroMAEForPretraining(tiny_pretraining_config(RetroMAEConfig)).eval(),
              "roberta": RetroMAEForPretraining.from_encoder_checkpoint(tiny_roberta).eval()}
    folders = {name: tmp_path / f"run_{name}" / "checkpoint-3" for name in models}
    for name, model in models.items():
        model.save_pretrained(folders[name])
    order = [first, *(name for name in models if name != first)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = run_without_retromae(LOAD_IN_ORDER_SCRIPT, [str(folders[name]) for name in order], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = dict(zip(order, json.loads(result.stdout.strip().splitlines()[-1]), strict=True))
    ids = torch.tensor([[0, 5, 6, 7, 8, 2]])
    for name, model in models.items():
        expected_class = model.encoder_class if name == "bert" else model.any_encoder_class
        assert report[name]["class"] == expected_class.__name__, name
        assert report[name]["missing"] == [], name
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=torch.ones_like(ids)).sentence_embedding
        assert torch.allclose(torch.tensor(report[name]["cls"]), expected, atol=1e-6), name


def test_a_missing_folder_under_an_existing_one_is_named_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """`models/nope` in a folder that has `models/`: the folder is meant, not a Hub id (it was looked up on the Hub,
    and the error spoke of connecting to huggingface.co)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for build in (RetroMAEForPretraining.from_encoder_checkpoint, RetroMAEForPretraining.from_encoder_config):
        with pytest.raises(ValueError, match="^model folder models/nope does not exist; give a saved model's folder"
                           ) as error:
            build("models/nope")
        assert "\n" not in str(error.value)


def test_a_missing_folder_that_could_be_a_hub_id_names_both(tmp_path, monkeypatch):
    """`models/nope` where nothing named `models` exists may be a Hub id: the one-line error says that no such local
    folder exists (naming it) as well as why the Hub lookup failed (the suite runs offline)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError, match=r"^models/nope: no local folder of that name \(") as error:
        RetroMAEForPretraining.from_encoder_checkpoint("models/nope")
    message = str(error.value)
    assert str(tmp_path / "models" / "nope") in message and "Hub" in message
    assert "\n" not in message


# Run in a fresh interpreter without retromae or DeepSpeed, with argv[1:] repo ids that resolve in the offline Hub
# cache: each loads through AutoModel and AutoModelForPreTraining as remote code; prints one JSON line of class names.
LOAD_BY_REPO_ID_SCRIPT = r"""
import json, sys
sys.modules["deepspeed"] = None  # importing it raises ImportError, as where it is not installed
from transformers import AutoModel, AutoModelForPreTraining
print(json.dumps([[type(auto.from_pretrained(repo_id, trust_remote_code=True)).__name__
                   for auto in (AutoModel, AutoModelForPreTraining)] for repo_id in sys.argv[1:]]))
"""


def test_checkpoints_load_by_repo_id_without_deepspeed(tmp_path, run_without_retromae):
    """By repo id, transformers requires every package any of the checkpoint's code files imports (from a folder,
    only the top file's): `import deepspeed` in backbones.py made every method's checkpoint fail to load from the Hub
    ("This modeling file requires ... deepspeed")."""
    classes = [RetroMAEForPretraining, DupMAEForPretraining, SEEDEncoderForPretraining, BoWForPretraining]
    cache = tmp_path / "hub"
    for klass in classes:
        klass(klass.config_class(**tiny_bert_kwargs(), **_overrides(klass))).save_pretrained(tmp_path / klass.__name__)
        hub_cache_layout(tmp_path / klass.__name__, f"org/{klass.__name__.lower()}", cache)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = run_without_retromae(LOAD_BY_REPO_ID_SCRIPT, [f"org/{k.__name__.lower()}" for k in classes],
                                  cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [[k.encoder_class.__name__, k.__name__] for k in classes]


def test_on_transformers_4_the_checkpoint_code_names_the_version_it_needs(tmp_path, monkeypatch):
    """transformers 4.x has no `PreTrainedConfig` (it spells it `PretrainedConfig`): loading a checkpoint failed with
    "cannot import name 'PreTrainedConfig'", naming no requirement."""
    old = types.ModuleType("transformers")
    old.__version__, old.BertConfig = "4.57.6", BertConfig
    monkeypatch.setitem(sys.modules, "transformers", old)
    spec = importlib.util.spec_from_file_location("configuration_retromae", CONFIGURATION_FILE)
    with pytest.raises(ImportError, match=re.escape("this model's code needs transformers >= 5 (installed: 4.57.6); "
                                                    "upgrade it with: pip install -U 'transformers>=5'")):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))

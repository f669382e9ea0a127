"""Lightning's language-model demos (``pytorch_lightning.demos.transformer``:
LightningTransformer, ``pytorch_lightning.demos.lstm``: LightningLSTM with its SequenceSampler and
a hidden state carried across steps), their source with only the imports changed, on fw beside
Lightning 2.6: the same weights bit for bit after training on the same text (a WikiText2-shaped
file written here, so nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

DEMOS = Path(importlib.util.find_spec("pytorch_lightning").origin).parent / "demos"
FW_IMPORTS = {
    "from pytorch_lightning import LightningModule": "from framework import TrainModule as LightningModule",
    "from pytorch_lightning.core import LightningModule": "from framework import TrainModule as LightningModule",
    "from pytorch_lightning.demos.transformer import WikiText2": "from fw_demo_transformer import WikiText2",
}


def demo(name: str, which: str) -> types.ModuleType:
    """Lightning's demo module ``name``; for fw, its source with the imports changed only."""
    if which == "lightning":
        return importlib.import_module(f"pytorch_lightning.demos.{name}")
    source = (DEMOS / f"{name}.py").read_text()
    changed = [theirs for theirs in FW_IMPORTS if theirs in source]
    assert changed, f"Lightning's {name} demo imports none of {list(FW_IMPORTS)}"
    for theirs in changed:
        source = source.replace(theirs, FW_IMPORTS[theirs])
    module = types.ModuleType(f"fw_demo_{name}")
    sys.modules[module.__name__] = module  # lstm.py imports the transformer demo's WikiText2
    exec(compile(source, str(DEMOS / f"{name}.py"), "exec"), module.__dict__)
    return module


@pytest.fixture
def wikitext(tmp_path, monkeypatch):
    """``./data/wikitext-2.txt``, where the demos' WikiText2 looks (and then downloads nothing)."""
    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(60)]
    lines = [" ".join(words[int(j)] for j in torch.randint(0, 60, (12,), generator=g)) for _ in range(400)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    yield
    sys.modules.pop("fw_demo_transformer", None)
    sys.modules.pop("fw_demo_lstm", None)


def train(which: str, name: str, model_name: str, **trainer_args) -> dict[str, torch.Tensor]:
    import framework as fw

    if which == "fw":
        demo("transformer", "fw")
    module = demo(name, which)
    seed, Trainer = (pl.seed_everything, pl.Trainer) if which == "lightning" else (fw.seed_everything, fw.Trainer)
    seed(5)
    vocab = module.WikiText2().vocab_size  # the LSTM demo imports it too
    model = getattr(module, model_name)(vocab_size=vocab)
    if name == "lstm":  # the demo's own LSTM, narrower (4 layers of 512 take seconds a step on 2 cores)
        model.model = module.SimpleLSTM(vocab_size=vocab, ninp=64, nhid=64, nlayers=2)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **trainer_args)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(model)
    assert any(not torch.equal(initial[k], v) for k, v in model.state_dict().items())  # it trained
    assert trainer.global_step == trainer_args.get("max_steps", trainer.global_step)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "model_name", "trainer_args"), [
    ("transformer", "LightningTransformer", dict(max_steps=8)),
    ("lstm", "LightningLSTM", dict(max_epochs=2, limit_train_batches=3)),  # the hidden state crosses the epoch end
])
def test_lightnings_language_model_demos_give_lightnings_weights(wikitext, name, model_name, trainer_args):
    theirs = train("lightning", name, model_name, **trainer_args)
    ours = train("fw", name, model_name, **trainer_args)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key

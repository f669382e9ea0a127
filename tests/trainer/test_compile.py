"""``Trainer(compile=...)``: a compiled fit trains eager's numbers (``aot_eager``: bit for bit;
inductor: within its rounding) and says how long compiling took; checkpoints keep the eager names
(no ``_orig_mod.``) and resume compiled; validation and predict run compiled; what cannot be
compiled runs eagerly with one warning, or stops under ``fallback: false``.

Every compiled run is in a forked copy of the test process (tests/forked.py): dynamo's caches
and inductor's compile workers stay with the copy. Most use the ``aot_eager`` backend (traced
and run through AOTAutograd, no C++ build): one test pays inductor's compile.
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import parallel_lm
from forked import call, in_a_copy
from helpers import FW, clean_env, run_cmd

import framework as fw
from framework.callbacks import ModelCheckpoint
from framework.rank_zero import FwWarning

AOT = {"backend": "aot_eager"}
INDUCTOR_TOLERANCE = 1e-5  # 12 AdamW steps: measured 4.5e-7 (2.3e-5 after 20; inductor fuses and reorders float math)


def apart(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def fit_and_predict(compile, root: str, ckpt_path: str | None = None, checkpoints: bool = False) -> dict:
    """A fit (12 AdamW steps, validation and a checkpoint at 6), then predict on the validation data."""
    callbacks = [ModelCheckpoint(dirpath=f"{root}/ck", every_n_train_steps=parallel_lm.CHECKPOINT_EVERY, save_top_k=-1)] if checkpoints else None
    out = parallel_lm.fit("single", devices=1, compile=compile, root=root, ckpt_path=ckpt_path, callbacks=callbacks)
    trainer = fw.Trainer(**parallel_lm.QUIET, devices=1, compile=compile, enable_checkpointing=False)
    model = parallel_lm.LM()
    model.load_state_dict(out["weights"])
    with redirect_stderr(io.StringIO()):
        out["predictions"] = torch.cat(trainer.predict(model, DataLoader(parallel_lm.data(20), batch_size=8)))
        out["validated"] = trainer.validate(model, DataLoader(parallel_lm.data(20), batch_size=8))[0]
    return out


@pytest.mark.timeout(120)  # three fits, forked: 17 s here
def test_a_compiled_fit_trains_eager_s_numbers_keeps_the_names_and_resumes_compiled(tmp_path):
    eager = call(fit_and_predict, None, str(tmp_path / "eager"))
    compiled = call(fit_and_predict, AOT, str(tmp_path / "compiled"), checkpoints=True)
    assert apart(compiled["weights"], eager["weights"]) == 0.0
    assert compiled["metrics"] == eager["metrics"]
    assert torch.equal(compiled["predictions"], eager["predictions"])
    assert compiled["validated"] == eager["validated"]
    saved = torch.load(tmp_path / "compiled" / "ck" / "epoch=0-step=6.ckpt", weights_only=True)
    assert not [key for key in saved["state_dict"] if "_orig_mod" in key]
    assert set(saved["state_dict"]) == set(parallel_lm.LM().state_dict())
    resumed = call(fit_and_predict, AOT, str(tmp_path / "resumed"),
                   ckpt_path=str(tmp_path / "compiled" / "ck" / "epoch=0-step=6.ckpt"))
    assert resumed["batches"] == parallel_lm.STEPS - parallel_lm.CHECKPOINT_EVERY and resumed["global_step"] == parallel_lm.STEPS
    assert apart(resumed["weights"], compiled["weights"]) == 0.0


def _inductor_fit(root: str) -> tuple[dict, str]:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(root).parent / "inductor-cache"))
    said = io.StringIO()
    trainer = fw.Trainer(**parallel_lm.QUIET, devices=1, max_steps=parallel_lm.STEPS, compile=True,
                         enable_checkpointing=False, default_root_dir=root)
    model = parallel_lm.LM()
    with redirect_stderr(said):
        trainer.fit(model, DataLoader(parallel_lm.data(), batch_size=8, shuffle=True))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, said.getvalue()


@pytest.mark.timeout(300)  # a cold inductor build of the tiny LM: 15-40 s on 2 cores
def test_inductor_trains_within_its_rounding_and_says_how_long_compiling_took(tmp_path):
    weights, said = call(_inductor_fit, str(tmp_path / "run"), timeout=280)
    eager = parallel_lm.fit("single", devices=1)["weights"]
    print(f"inductor against eager after {parallel_lm.STEPS} AdamW steps: {apart(weights, eager):.2e}")
    assert apart(weights, eager) < INDUCTOR_TOLERANCE
    assert "fw: compiling 1 module(s) of class TinyLM with torch.compile" in said
    assert "fw: compiled: the first step took" in said


class _Breaks(parallel_lm.TinyLM):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = super().forward(tokens)
        if out.sum() > 0:  # data-dependent control flow: a graph break, refused under fullgraph=True
            out = out * 1
        return out


class _BreakingLM(parallel_lm.LM):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = _Breaks()


@in_a_copy
def test_a_module_that_cannot_be_compiled_runs_eagerly_with_one_warning_or_stops(tmp_path):
    loader = DataLoader(parallel_lm.data(16), batch_size=8)
    trainer = fw.Trainer(**parallel_lm.QUIET, devices=1, max_steps=2, enable_checkpointing=False,
                         compile={**AOT, "fullgraph": True}, default_root_dir=str(tmp_path))
    with pytest.warns(FwWarning) as caught, redirect_stderr(io.StringIO()):
        trainer.fit(_BreakingLM(), loader)
    warnings = [str(w.message) for w in caught if "trainer.compile:" in str(w.message)]
    assert len(warnings) == 1 and "Unsupported" in warnings[0] and "the model runs eagerly" in warnings[0]
    assert trainer.global_step == 2
    strict = fw.Trainer(**parallel_lm.QUIET, devices=1, max_steps=2, enable_checkpointing=False,
                        compile={**AOT, "fullgraph": True, "fallback": False}, default_root_dir=str(tmp_path))
    with pytest.raises(fw.ConfigError, match=r"trainer.compile: Unsupported: .*\(trainer.compile.fallback=false: stopped\)"):
        strict.fit(_BreakingLM(), loader)


@pytest.mark.timeout(120)
def test_without_a_cxx_compiler_inductor_falls_back_or_stops_in_one_line(tmp_path):
    env = {**clean_env(), "PATH": str(tmp_path / "empty")}  # no g++, c++ or clang++ to be found
    base = [FW, "fit", "conf/regression.yaml", "trainer.compile=true", "trainer.max_epochs=1",
            f"trainer.default_root_dir={tmp_path}", "trainer.enable_progress_bar=false"]
    ran = run_cmd(base, timeout=100, env=env)
    assert ran.returncode == 0, ran.output
    assert "trainer.compile: no C++ compiler found" in ran.output and "the model runs eagerly" in ran.output
    stopped = run_cmd([*base, "trainer.compile={fallback: false}"], timeout=100, env=env)
    assert stopped.returncode == 2, stopped.output
    (line,) = [line for line in stopped.output.splitlines() if line.startswith("fw: error:")]
    assert "no C++ compiler found" in line and "Traceback" not in stopped.output


@pytest.mark.parametrize(("value", "words"), [
    ("yes", r"trainer.compile='yes': give true, false, or a mapping"),
    ({"modes": "max-autotune"}, r"trainer.compile.modes: not an option; give fullgraph, dynamic, backend, mode"),
])
def test_a_compile_setting_fw_does_not_know_is_refused(value, words):
    with pytest.raises(fw.ConfigError, match=words):
        fw.Trainer(accelerator="cpu", compile=value)


@in_a_copy
@pytest.mark.parametrize(("value", "words"), [
    ({"mode": "fastest"}, r"trainer.compile mode='fastest': Unrecognized mode=fastest, should be one of: default, "),
    ({"backend": "fastest"}, r"trainer.compile.backend='fastest': not a torch.compile backend; give inductor \(the "
                             r"default\), aot_eager, eager"),
    ({"options": {"no_such_option": 1}}, r"trainer.compile options=\{'no_such_option': 1\}: Unexpected optimization "
                                         r"option no_such_option, known options are \["),
])
def test_a_compile_mode_or_backend_torch_does_not_have_is_refused_in_one_line(tmp_path, value, words):
    """torch raises its own RuntimeError (or InvalidBackend) from torch.compile: fw names the key."""
    trainer = fw.Trainer(**parallel_lm.QUIET, devices=1, max_steps=1, enable_checkpointing=False, compile=value,
                         default_root_dir=str(tmp_path))
    with pytest.raises(fw.ConfigError, match=words) as err:
        trainer.fit(parallel_lm.LM(), DataLoader(parallel_lm.data(8), batch_size=8))
    assert "\n" not in str(err.value)

"""``strategy="model_parallel"``: tensor parallel on 2 ranks and data x tensor parallel on 4 end
where one process ends on the same global batches (shuffled); loss parallel over a vocabulary-split
head; sequence parallel (alone, with loss parallel, on 2 x 2); logged sums counted once per
data-parallel replica; a sharded checkpoint of the 2 x 2 mesh (SGD and AdamW) resumes mid-epoch on
a 1 x 2 mesh and under plain FSDP on 2 ranks; Lightning's ModelParallelStrategy with the plan
written by hand ends where fw's ends; what would train silently wrong is refused.

The ranks are forked from the test process (tests/forked.py): no launcher is under test here.
"""

from __future__ import annotations

import json

import forked
import pytest
import torch

from . import parallel_lm
from .helpers import check_ok, write_script

SGD_TOLERANCE = 1e-5  # measured: at most 1.2e-7 (the sums of split layers in another order), sequence parallel
#                       and resumes across meshes included
ADAMW_TOLERANCE = 1e-5  # measured over these 12 steps: 4.3e-7 (2 ranks), 1.6e-6 (2 ranks, sequence parallel),
#                         1.8e-6 (2 x 2); a 2 x 2 checkpoint resumed on 1 x 2 and under fsdp: 1.2e-7 from the run
#                         that went on. Over 20 steps 3.1e-5 and 3.9e-5 (not run): AdamW divides each step by its
#                         gradient's running size, so a rounding difference in a small gradient moves a weight by
#                         up to lr x 1e-3

SCRIPT = """
import json, sys
import torch
import parallel_lm
from framework.callbacks import ModelCheckpoint

cfg = json.loads(sys.argv[1])
for case in cfg["cases"]:
    strategy = case.get("plain") or {"name": "model_parallel", **case.get("strategy", {})}
    callbacks = None
    if case.get("checkpoint"):
        callbacks = [ModelCheckpoint(dirpath=f"{cfg['out']}/ck_{case['tag']}", every_n_train_steps=parallel_lm.CHECKPOINT_EVERY, save_top_k=-1)]
    resume = case.get("resume")
    if "lightning" in case:  # Lightning's ModelParallelStrategy, its configure_model applying the plan by hand
        out = parallel_lm.lightning_fit(cfg["devices"], 2, root=cfg["out"], **case["lightning"])
    else:
        out = parallel_lm.fit(strategy, devices=cfg["devices"], callbacks=callbacks, root=cfg["out"],
                              ckpt_path=resume.format(out=cfg["out"]) if resume else None, **case.get("fit", {}))
    if out["rank"] == 0:
        torch.save(out, f"{cfg['out']}/{case['tag']}.pt")
"""

#: 4 ranks: data parallel 2 x tensor parallel 2 (checkpoints at step 6 of 12, mid-epoch)
MESH_2X2 = {"data_parallel_size": 2, "tensor_parallel_size": 2}
FOUR = [
    {"tag": "2d_sgd", "strategy": MESH_2X2, "fit": {"data_parallel": 2, "optimizer": "sgd"}, "checkpoint": True},
    {"tag": "2d_adamw", "strategy": MESH_2X2, "fit": {"data_parallel": 2}, "checkpoint": True},
    {"tag": "2d_sequence_parallel", "strategy": MESH_2X2,
     "fit": {"data_parallel": 2, "optimizer": "sgd", "sequence_parallel": True}},
]
#: 2 ranks: tensor parallel 2 (then the 2 x 2 checkpoint resumed on 1 x 2, and under fsdp)
TWO = [
    {"tag": "tp_sgd", "strategy": {"tensor_parallel_size": 2}, "fit": {"optimizer": "sgd"}},
    {"tag": "tp_adamw", "strategy": {"tensor_parallel_size": 2}, "fit": {}},
    {"tag": "tp_loss_parallel", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "loss_parallel": True}},
    # sequence parallel: alone, with AdamW, with loss parallel, an MLP given the residual stream's part itself
    {"tag": "tp_sequence_parallel", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "sequence_parallel": True}},
    {"tag": "tp_sequence_parallel_adamw", "strategy": {"tensor_parallel_size": 2}, "fit": {"sequence_parallel": True}},
    {"tag": "tp_sequence_and_loss_parallel", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "sequence_parallel": True, "loss_parallel": True}},
    {"tag": "tp_sequence_parallel_mlp_without_norm", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "sequence_parallel": True, "mlp_norm": False}},
    {"tag": "resumed_1x2", "strategy": {"tensor_parallel_size": 2}, "fit": {"optimizer": "sgd"},
     "resume": "{out}/ck_2d_sgd/epoch=0-step=6.ckpt"},
    {"tag": "resumed_fsdp", "plain": {"name": "fsdp", "auto_wrap_policy": ["Block"]},
     "fit": {"optimizer": "sgd", "data_parallel": 2}, "resume": "{out}/ck_2d_sgd/epoch=0-step=6.ckpt"},
    {"tag": "resumed_1x2_adamw", "strategy": {"tensor_parallel_size": 2}, "fit": {},
     "resume": "{out}/ck_2d_adamw/epoch=0-step=6.ckpt"},
    # written without sequence parallel, resumed with it: it moves activations, not the weights' layout
    {"tag": "resumed_1x2_sequence_parallel", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "sequence_parallel": True}, "resume": "{out}/ck_2d_sgd/epoch=0-step=6.ckpt"},
    {"tag": "resumed_fsdp_adamw", "plain": {"name": "fsdp", "auto_wrap_policy": ["Block"]},
     "fit": {"data_parallel": 2}, "resume": "{out}/ck_2d_adamw/epoch=0-step=6.ckpt"},
    # activation checkpointing: each beside the same run without it (tp_adamw for tensor parallel)
    {"tag": "ddp", "plain": "ddp_gloo", "fit": {"data_parallel": 2}},
    {"tag": "ac_ddp", "plain": "ddp_gloo", "fit": {"data_parallel": 2, "activation_checkpointing_policy": ["Block"]}},
    {"tag": "fsdp", "plain": {"name": "fsdp", "auto_wrap_policy": ["Block"]}, "fit": {"data_parallel": 2}},
    {"tag": "ac_fsdp", "plain": {"name": "fsdp", "auto_wrap_policy": ["Block"], "activation_checkpointing_policy": ["Block"]},
     "fit": {"data_parallel": 2}},
    {"tag": "ac_tp", "strategy": {"tensor_parallel_size": 2}, "fit": {"activation_checkpointing_policy": ["Block"]}},
    {"tag": "ac_sequence_parallel", "strategy": {"tensor_parallel_size": 2},
     "fit": {"optimizer": "sgd", "sequence_parallel": True, "activation_checkpointing_policy": ["Block"]}},
    # compiled per block (aot_eager: traced, no C++ build), each beside the same run eagerly
    {"tag": "compiled_fsdp", "plain": {"name": "fsdp", "auto_wrap_policy": ["Block"]},
     "fit": {"data_parallel": 2, "compile": {"backend": "aot_eager"}}},
    {"tag": "compiled_tp", "strategy": {"tensor_parallel_size": 2}, "fit": {"compile": {"backend": "aot_eager"}}},
    # last (Lightning leaves its settings behind): its ModelParallelStrategy beside tp_adamw, tp_sequence_parallel
    {"tag": "lightning_tp_adamw", "lightning": {}},
    {"tag": "lightning_sequence_parallel", "lightning": {"optimizer": "sgd", "sequence_parallel": True}},
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 4-rank job, then the 2-rank job (which resumes the 4-rank checkpoint)."""
    out = tmp_path_factory.mktemp("model_parallel")
    script = write_script(out, SCRIPT)
    results = []
    for devices, cases in ((4, FOUR), (2, TWO)):
        arg = json.dumps({"cases": cases, "out": str(out), "devices": devices})
        results.append(forked.run_script(script, arg, nprocs=devices, timeout=150))
    return results, out


_ONE_PROCESS: dict[str, dict] = {}


def one_process(**fit) -> dict:
    """The run in one process on the global batch (the same for any split of it: computed once)."""
    fit = {k: v for k, v in fit.items() if k not in ("data_parallel", "sequence_parallel")}
    key = json.dumps(fit, sort_keys=True, default=str)
    if key not in _ONE_PROCESS:
        _ONE_PROCESS[key] = parallel_lm.fit("single", devices=1, **fit)
    return _ONE_PROCESS[key]


def the_same_run(job, tag: str, other: str) -> tuple[dict, dict]:
    """The runs ``tag`` and ``other`` of the job, which trained the same weights, bit for bit."""
    results, out = job
    for result in results:
        check_ok(result)
    run, reference = torch.load(out / f"{tag}.pt"), torch.load(out / f"{other}.pt")
    assert apart(run["weights"], reference["weights"]) == 0.0
    assert run["metrics"] == reference["metrics"]
    return run, reference


def apart(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


CASES = [(c["tag"], c["fit"]) for c in FOUR + TWO
         if not {"resume", "plain", "lightning"} & c.keys() and not c["tag"].startswith(("ac_", "compiled_"))]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tag", "fit"), CASES, ids=[tag for tag, _ in CASES])
def test_model_parallel_ends_where_one_process_ends(job, tag, fit):
    results, out = job
    for result in results:
        check_ok(result)
    run = torch.load(out / f"{tag}.pt")
    single = one_process(**fit)
    assert run["global_step"] == single["global_step"] == parallel_lm.STEPS
    # sequence parallel: a block's norm saw this rank's half of each sequence
    assert run["norm_tokens"] == parallel_lm.CONTEXT // (2 if fit.get("sequence_parallel") else 1)
    tolerance = SGD_TOLERANCE if fit.get("optimizer") == "sgd" else ADAMW_TOLERANCE
    assert apart(run["weights"], single["weights"]) < tolerance
    for name in ("train_loss", "val_loss"):
        assert run["metrics"][name] == pytest.approx(single["metrics"][name], abs=1e-5)
    # a sum over the validation samples counts each once: not once per tensor-parallel rank
    assert run["metrics"]["val_tokens"] == single["metrics"]["val_tokens"] == 20 * parallel_lm.CONTEXT


@pytest.mark.timeout(300)
def test_sequence_parallel_keeps_half_of_what_the_norms_keep(job):
    """What sequence parallel saves on the test's LM: each of its 4 block norms keeps its input and
    its mean and 1/std per token (width + 2 floats) for half the sequence; the rest is as under
    tensor parallel alone (the bytes of the DTensors counted as this rank's part)."""
    results, out = job
    for result in results:
        check_ok(result)
    split, whole = torch.load(out / "tp_sequence_parallel.pt"), torch.load(out / "tp_sgd.pt")
    half = parallel_lm.GLOBAL_BATCH * parallel_lm.CONTEXT // 2 * (parallel_lm.WIDTH + 2) * 4
    assert whole["saved_bytes"] - split["saved_bytes"] == 4 * half


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tag", "uninterrupted", "tolerance"), [
    ("resumed_1x2", "2d_sgd", SGD_TOLERANCE), ("resumed_fsdp", "2d_sgd", SGD_TOLERANCE),
    ("resumed_1x2_adamw", "2d_adamw", ADAMW_TOLERANCE), ("resumed_fsdp_adamw", "2d_adamw", ADAMW_TOLERANCE),
    ("resumed_1x2_sequence_parallel", "2d_sgd", SGD_TOLERANCE)])
def test_a_2x2_checkpoint_resumes_on_another_mesh_where_the_run_went_on(job, tag, uninterrupted, tolerance):
    """Written mid-epoch at step 6 of 12 on data parallel 2 x tensor parallel 2; resumed on 1 x 2 (the
    same global batch on one replica) and on 2 ranks of fsdp: both end where the 2 x 2 run ended
    (with AdamW its moments come back sharded anew on the other mesh)."""
    results, out = job
    for result in results:
        check_ok(result)
    uninterrupted, resumed = torch.load(out / f"{uninterrupted}.pt"), torch.load(out / f"{tag}.pt")
    assert resumed["global_step"] == uninterrupted["global_step"] == parallel_lm.STEPS
    assert resumed["batches"] == parallel_lm.STEPS - parallel_lm.CHECKPOINT_EVERY and uninterrupted["batches"] == parallel_lm.STEPS
    assert apart(resumed["weights"], uninterrupted["weights"]) < tolerance
    assert resumed["metrics"]["val_loss"] == pytest.approx(uninterrupted["metrics"]["val_loss"], abs=1e-5)



@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tag", "without"), [("ac_ddp", "ddp"), ("ac_fsdp", "fsdp"), ("ac_tp", "tp_adamw"),
                                              ("ac_sequence_parallel", "tp_sequence_parallel")])
def test_activation_checkpointing_trains_the_same_numbers_keeping_less(job, tag, without):
    """Under DDP (the Trainer's argument), FSDP (the strategy's, as in Lightning), tensor and
    sequence parallel (whose split of the first block's input is not split again when the block
    is recomputed): the same weights bit for bit as the run without it, the forward keeping a fraction
    of the bytes for the backward (the blocks keep only their inputs)."""
    checkpointed, plain = the_same_run(job, tag, without)
    assert checkpointed["saved_bytes"] < plain["saved_bytes"] / 3, (checkpointed["saved_bytes"], plain["saved_bytes"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tag", "eager"), [("compiled_fsdp", "fsdp"), ("compiled_tp", "tp_adamw")])
def test_blocks_compiled_one_by_one_under_fsdp_and_tensor_parallel_train_eager_s_numbers(job, tag, eager):
    the_same_run(job, tag, eager)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("tag", "ours"), [("lightning_tp_adamw", "tp_adamw"),
                                          ("lightning_sequence_parallel", "tp_sequence_parallel")])
def test_lightning_model_parallel_strategy_ends_where_fw_s_ends(job, tag, ours):
    """Lightning 2.6.6's ModelParallelStrategy runs on the CPU over Gloo (nothing refused); its
    module's configure_model writes Megatron's plan out with torch's styles (and torchtitan's
    sequence split). fw's one line makes the same collectives in the same order: the same weights
    and logged loss, bit for bit (a gather asked for twice before a layer showed as 6e-8 here)."""
    results, out = job
    for result in results:
        check_ok(result)
    theirs, mine = torch.load(out / f"{tag}.pt"), torch.load(out / f"{ours}.pt")
    assert theirs["global_step"] == mine["global_step"] == parallel_lm.STEPS
    assert apart(theirs["weights"], mine["weights"]) == 0.0
    assert theirs["metrics"]["train_loss"] == mine["metrics"]["train_loss"]


def test_activation_checkpointing_in_one_process_trains_the_same_numbers_keeping_less():
    plain = one_process()
    checkpointed = one_process(activation_checkpointing_policy=[parallel_lm.Block])
    assert apart(checkpointed["weights"], plain["weights"]) == 0.0
    assert checkpointed["saved_bytes"] < plain["saved_bytes"] / 3, (checkpointed["saved_bytes"], plain["saved_bytes"])


@pytest.mark.parametrize(("options", "words"), [
    ({"activation_checkpointing_policy": ["Layer"]},
     r"trainer.activation_checkpointing_policy: LM has no submodule of class Layer; its submodules' classes: "),
    ({"activation_checkpointing_policy": [3]}, r"activation_checkpointing_policy: 3 is not a module class or its name"),
])
def test_an_activation_checkpointing_class_the_model_lacks_is_refused(options, words):
    import framework as fw

    with pytest.raises(fw.ConfigError, match=words):
        one_process(**options)


REFUSALS = """
import json, sys
import torch
import framework as fw
import parallel_lm
from framework.errors import TrainingError
from parallel_lm import LM, Block

class NoConfigureModel(LM):
    configure_model = fw.TrainModule.configure_model

class ShardsNothing(LM):
    def configure_model(self):
        pass

class PlanOfAnotherModel(LM):
    def configure_model(self):
        fw.parallel.parallelize(self.model, self.device_mesh, blocks={Block}, plan={"attn.qkv": "colwise"})

class FusedQKV(LM):
    def __init__(self):
        super().__init__()
        for block in self.model.blocks:
            block.attn.c_attn = torch.nn.Linear(parallel_lm.WIDTH, 3 * parallel_lm.WIDTH)

class ScaledMLP(parallel_lm.MLP):  # a scale left whole between the split layers: it sees half the features

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.proj(torch.nn.functional.gelu(self.fc(x)) * self.scale)

class WholeScaleApart(LM):
    def __init__(self):
        super().__init__()
        for block in self.model.blocks:
            block.mlp = ScaledMLP()

class OptimizerFromInit(LM):
    def __init__(self):
        super().__init__()
        self.early = torch.optim.SGD(self.parameters(), lr=0.1)

    def configure_optimizers(self):
        return self.early

class OddSequence(LM):  # sequences of 7 tokens: 2 ranks cannot split them
    def __init__(self):
        super().__init__(sequence_parallel=True)

    @staticmethod
    def loader():
        tokens, targets = parallel_lm.data(16).tensors
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens[:, :7], targets[:, :7]), batch_size=8)

class OddWidthMLP(LM):  # an MLP of 65 features: 2 ranks cannot split them evenly
    def __init__(self):
        super().__init__()
        for block in self.model.blocks:
            block.mlp.fc, block.mlp.proj = torch.nn.Linear(parallel_lm.WIDTH, 65), torch.nn.Linear(65, parallel_lm.WIDTH)

CASES = {"no_configure_model": (NoConfigureModel, {"tensor_parallel_size": 2}),
         "data_parallel_unsharded": (ShardsNothing, {"data_parallel_size": 2}),
         "tensor_parallel_unsplit": (ShardsNothing, {"tensor_parallel_size": 2}),
         "plan_of_another_model": (PlanOfAnotherModel, {"tensor_parallel_size": 2}),
         "fused_qkv": (FusedQKV, {"tensor_parallel_size": 2}),
         "optimizer_from_init": (OptimizerFromInit, {"tensor_parallel_size": 2}),
         "whole_parameter_apart": (WholeScaleApart, {"tensor_parallel_size": 2}),
         "sequence_not_divisible": (OddSequence, {"tensor_parallel_size": 2}),
         "width_not_divisible": (OddWidthMLP, {"tensor_parallel_size": 2})}
said = {}
for tag, (cls, sizes) in CASES.items():
    trainer = fw.Trainer(**parallel_lm.QUIET, enable_checkpointing=False, devices=2, max_steps=2,
                         strategy={"name": "model_parallel", **sizes})
    try:
        loader = cls.loader() if hasattr(cls, "loader") else torch.utils.data.DataLoader(parallel_lm.data(16), batch_size=8)
        trainer.fit(cls(), loader)
        said[tag] = "no error"
    except (fw.ConfigError, TrainingError) as err:
        said[tag] = str(err)
if trainer.global_rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(said, f)
"""

EXPECTED = {
    "no_configure_model": "does not override configure_model()",
    "data_parallel_unsharded": "gradients would never be averaged",
    "tensor_parallel_unsplit": "splits no parameter over self.device_mesh['tensor_parallel']",
    "plan_of_another_model": "plan names attn.qkv, which Block has no linear layer of",
    "fused_qkv": "attn.c_attn is one layer for q, k and v",
    "optimizer_from_init": "not the model's after configure_model() parallelized it",
    "whole_parameter_apart": "model.blocks.0.mlp.scale, model.blocks.1.mlp.scale differ between the ranks",
    "sequence_not_divisible": "Block's input (8, 7, 16) is not (batch, sequence, width) with a sequence that "
                              "tensor_parallel_size=2 divides; give sequences of a multiple of 2 tokens",
    "width_not_divisible": "Block.mlp.fc (colwise) has 65 output features, which tensor_parallel_size=2 does not "
                           "divide; give it a width that 2 divides, or choose a tensor-parallel size that divides 65",
}


@pytest.mark.timeout(120)
def test_what_would_train_silently_wrong_is_refused_in_one_line(tmp_path):
    script = write_script(tmp_path, REFUSALS)
    result = forked.run_script(script, str(tmp_path / "said.json"), nprocs=2, timeout=90)
    check_ok(result)
    said = json.loads((tmp_path / "said.json").read_text())
    for tag, words in EXPECTED.items():
        assert words in said[tag], (tag, said[tag])
        assert "\n" not in said[tag]


@pytest.mark.parametrize(("sizes", "words"), [
    ({"tensor_parallel_size": 3}, "tensor_parallel_size=3 does not divide the world of 4 ranks"),
    ({"data_parallel_size": 3, "tensor_parallel_size": 2}, "is 6 ranks, the world is 4"),
    ({"tensor_parallel_size": 0}, "give a positive whole number or 'auto'"),
])
def test_a_mesh_that_does_not_make_the_world_is_refused_when_the_trainer_is_built(sizes, words):
    import framework as fw

    with pytest.raises(fw.ConfigError, match=words.replace("(", r"\(")):
        fw.Trainer(accelerator="cpu", devices=4, strategy={"name": "model_parallel", **sizes})


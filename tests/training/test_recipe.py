"""The optimiser and schedule settings: Muon with AdamW (model.optimizer muon) and the
warmup-stable-decay schedule (model.schedule wsd).

Fast: the schedule's values, which parameters Muon takes, MuonWithAdamW's state round trip, the
settings' one-line errors, and one tiny run of the train command with both (logged lr, checkpoint,
a resume with the other optimiser refused). Slow (real processes, as test_failures.py): SIGKILL
then resume gives the losses of an unbroken run; a wsd run extended past its planned steps keeps
its stable stage; a decay started from a stable-stage checkpoint.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import io
import math
import random
import shutil
import signal
import typing
from pathlib import Path

import pytest
import torch
from runs import (
    SAVE_STEPS,
    STEPS,
    assert_resumed_losses_equal,
    checkpoint_step,
    finish,
    tiny_config,
    train_process,
    with_callback,
    write_config,
)

from minitx.cli import train_main
from minitx.config import AttentionConfig, ModelConfig
from minitx.errors import UserError
from minitx.files.checkpoint import LAST
from minitx.model import Transformer
from minitx.training.inputs import check_model_section
from minitx.training.optim import (
    ADDED_LATER,
    DEFAULTS,
    OPTIMIZERS,
    BatchedMuon,
    MuonSettings,
    MuonWithAdamW,
    Optimisation,
    OptimizerOptions,
    lr_at,
    muon_matrix,
    optimizer_groups,
    optimizer_of_state,
    split_for_muon,
)

# The recipe under test, on the tiny run of runs.tiny_config: 24 steps, warmup 5, the decay over
# the last quarter (steps 18 to 23).
RECIPE = {
    "optimizer": "muon",
    "optimizer_options": {"muon": {"lr": 0.05}},
    "schedule": "wsd",
    "decay_fraction": 0.25,
}
MUON_LR = RECIPE["optimizer_options"]["muon"]["lr"]
LR, MIN_LR, WARMUP = 1e-2, 1e-3, 5


def logged_lrs(run: Path, version: int = 0) -> dict[int, float]:
    """The lr logged at each step (AdamW's group, param_groups[0]) from a run's CSV log."""
    with open(run / "logs" / f"version_{version}" / "metrics.csv", newline="") as handle:
        return {int(row["step"]): float(row["lr"]) for row in csv.DictReader(handle) if row.get("lr")}


def assert_schedule(lrs: dict[int, float], **schedule) -> None:
    """Each logged lr (float32) is lr_at's value of its step."""
    expected = {s: lr_at(s, LR, MIN_LR, WARMUP, schedule="wsd", **schedule) for s in lrs}
    assert lrs == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------- the schedule


def test_wsd_warms_up_holds_then_decays_to_min_lr():
    lr, min_lr, warmup, total = 1.0, 0.1, 10, 100

    def at(step, **kw):
        return lr_at(step, lr, min_lr, warmup, total, schedule="wsd", **kw)

    assert [at(s) for s in range(warmup)] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert [at(s) for s in range(warmup, 80)] == [lr] * 70  # stable until the last 20% (default)
    linear = [at(s) for s in range(80, 100)]
    assert linear == pytest.approx([lr - (lr - min_lr) * (s - 80) / 20 for s in range(80, 100)])
    one_minus_sqrt = [at(s, decay_shape="1-sqrt") for s in range(80, 100)]
    assert one_minus_sqrt == pytest.approx(
        [lr - (lr - min_lr) * math.sqrt((s - 80) / 20) for s in range(80, 100)]
    )
    assert all(a > b for a, b in zip(one_minus_sqrt[1:], linear[1:]) if False) or True
    assert all(s < li for s, li in zip(one_minus_sqrt[1:], linear[1:]))  # 1-sqrt drops faster
    assert at(total) == at(total + 7) == min_lr == at(total, decay_shape="1-sqrt")  # the end value
    # decay_steps overrides the fraction; a fraction of 0 holds lr to the end.
    assert at(89, decay_steps=10) == lr and at(90, decay_steps=10) == lr and at(95, decay_steps=10) < lr
    assert [at(s, decay_fraction=0.0) for s in range(warmup, total)] == [lr] * (total - warmup)
    # A decay longer than the run after warmup starts when the warmup ends.
    assert at(warmup, decay_steps=1000) == lr and at(warmup + 1, decay_steps=1000) < lr


def test_wsd_extended_keeps_the_stable_stage_and_decays_at_the_new_end():
    # The schedule is a function of max_steps: a longer run is the same run until its own decay.
    short = [lr_at(s, 1.0, 0.1, 10, 100, schedule="wsd") for s in range(80)]
    longer = [lr_at(s, 1.0, 0.1, 10, 300, schedule="wsd") for s in range(240)]
    assert longer[:80] == short and longer[80:] == [1.0] * 160
    assert lr_at(299, 1.0, 0.1, 10, 300, schedule="wsd") == pytest.approx(0.1 + 0.9 / 60)


def test_cosine_is_still_the_default():
    assert (
        lr_at(55, 1.0, 0.1, 10, 100) == lr_at(55, 1.0, 0.1, 10, 100, schedule="cosine") == pytest.approx(0.55)
    )


# ------------------------------------------------------------------------------- Muon's parameters


def model_of(attention: AttentionConfig, **config) -> Transformer:
    return Transformer(
        ModelConfig(
            vocab_size=50, n_layer=3, n_head=4, d_model=32, block_size=16, attention=attention, **config
        )
    )


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    cases = [
        model_of(AttentionConfig(kind="mha"), tie_embeddings=False, bias=True),
        model_of(AttentionConfig(kind="mta", options={"mta": {"conv_layers": [1]}})),
        model_of(AttentionConfig(kind="mla")),
        model_of(AttentionConfig(kind="mha", options={"mha": {"sinks": True, "gate": "head"}})),
        model_of(AttentionConfig(kind="diff")),
    ]
    for model in cases:
        params = dict(model.named_parameters())
        muon = {name for name, p in params.items() if muon_matrix(name, p)}
        adamw = set(params) - muon
        assert muon, list(params)
        for name in muon:  # projections inside the blocks, each a real matrix
            assert name.startswith("blocks.") and name.endswith(".weight") and params[name].dim() == 2
            assert min(params[name].shape) > 1 and "norm" not in name
        for name in adamw:
            last = name.rsplit(".", 1)[-1]
            kept_off = (
                not name.startswith("blocks.")  # embeddings, the untied head, the final norm
                or params[name].dim() != 2
                or last in ("kq_conv", "kq_conv_post", "mix_pre", "mix_post")
                or min(params[name].shape) == 1  # a one-row gate
            )
            assert kept_off, name
    plain = dict(cases[0].named_parameters())
    assert {"tok_emb.weight", "lm_head.weight", "norm.weight", "blocks.0.norm1.weight"} <= set(plain) - {
        n for n, p in plain.items() if muon_matrix(n, p)
    }
    assert {n for n, p in plain.items() if muon_matrix(n, p) and n.startswith("blocks.0.")} == {
        "blocks.0.attn.qkv_proj.weight",
        "blocks.0.attn.out_proj.weight",
        "blocks.0.mlp.up.weight",
        "blocks.0.mlp.down.weight",
    }
    mta = dict(cases[1].named_parameters())
    assert not any(
        muon_matrix(n, mta[n]) for n in mta if n.rsplit(".", 1)[-1] in ("kq_conv", "mix_pre", "mix_post")
    )


def test_muon_takes_gdns_projections_and_adamw_its_convolution_decay_and_norm(one_thread):
    """gdn's 2-D projections (q, k, v, the output gate z, beta's and the decay's rates: a row per
    value head, as the softmax kinds' per-head gate) are hidden matrices for Muon; the depthwise
    convolution (3-D), A_log and dt_bias (a number per head) and the output norm stay on AdamW.
    A few steps on one batch move every parameter and lower the loss."""
    torch.manual_seed(0)
    attention = AttentionConfig(
        layers=["gdn", "gdn", "mha"], options={"gdn": {"chunk_size": 8, "n_value_head": 8}}
    )
    model = model_of(attention)
    params = dict(model.named_parameters())
    layer = {
        name.removeprefix("blocks.0.attn."): p
        for name, p in params.items()
        if name.startswith("blocks.0.attn.")
    }
    on_muon = {name for name, p in layer.items() if muon_matrix("blocks.0.attn." + name, p)}
    projections = ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj", "out_proj")
    assert on_muon == {f"{name}.weight" for name in projections}
    assert set(layer) - on_muon == {"conv.weight", "A_log", "dt_bias", "norm.weight"}
    optimizer = muon_with_adamw(model)
    before = {name: p.detach().clone() for name, p in params.items()}
    x = torch.randint(0, 50, (2, 16))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and all(math.isfinite(v) for v in losses)
    for name, p in params.items():
        assert not torch.equal(p, before[name]), name


def muon_with_adamw(model: Transformer) -> MuonWithAdamW:
    names = {n for n, p in model.named_parameters() if muon_matrix(n, p)}
    muon, rest = split_for_muon(list(model.named_parameters()), names)
    # The default settings: AdamW's lr 1e-3, betas (0.9, 0.95), eps 1e-8; Muon's lr 0.02, momentum 0.95.
    return MuonWithAdamW(muon, optimizer_groups(rest, 0.1), DEFAULTS)


def train_steps(model: Transformer, optimizer: MuonWithAdamW, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 50, (2, 16), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
        optimizer.step()


def test_muon_with_adamw_state_round_trips_exactly(one_thread):
    torch.manual_seed(0)
    model = model_of(AttentionConfig(kind="mha"))
    optimizer = muon_with_adamw(model)
    # One parameter list, each parameter once: AdamW's groups first (group 0's lr is the logged one).
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-3, 0.02]
    owned = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())
    train_steps(model, optimizer, 3, seed=1)
    assert len(optimizer.state) == len(owned)

    buffer = io.BytesIO()
    torch.save({"weights": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # plain tensors and containers only
    copy = model_of(AttentionConfig(kind="mha"))
    copy.load_state_dict(saved["weights"])
    resumed = muon_with_adamw(copy)
    resumed.load_state_dict(saved["optimizer"])
    assert [g["lr"] for g in resumed.param_groups] == [g["lr"] for g in optimizer.param_groups]
    assert resumed.param_groups[-1] is resumed.muon.param_groups[0]  # the loaded groups, not stale ones
    for group in resumed.param_groups:  # the scheduler's lr reaches the optimiser that steps
        group["lr"] *= 0.5
    for group in optimizer.param_groups:
        group["lr"] *= 0.5

    train_steps(model, optimizer, 3, seed=2)
    train_steps(copy, resumed, 3, seed=2)
    for (name, a), b in zip(model.state_dict().items(), copy.state_dict().values()):
        assert torch.equal(a, b), name


def test_batched_muon_takes_torch_muons_step(one_thread):
    # Same-shaped matrices orthogonalised as one batch, in float32 on the CPU: the same step as
    # torch.optim.Muon's per matrix in bfloat16, to bfloat16's precision; the momentum the same.
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 16), (16, 48), (48, 16), (16, 16), (16, 64)]
    start = [torch.randn(shape) * 0.1 for shape in shapes]
    grads = [[torch.randn(shape) for shape in shapes] for _ in range(3)]
    params, buffers = {}, {}
    for name, kind in (("torch", torch.optim.Muon), ("batched", BatchedMuon)):
        params[name] = [torch.nn.Parameter(w.clone()) for w in start]
        optimizer = kind(params[name], lr=0.02, momentum=0.95, weight_decay=0.1)
        for step_grads in grads:
            for param, grad in zip(params[name], step_grads):
                param.grad = grad.clone()
            optimizer.step()
        buffers[name] = [optimizer.state[p]["momentum_buffer"] for p in params[name]]
    for ours, theirs, w in zip(params["batched"], params["torch"], start):
        moved = (theirs - w).norm()
        assert (ours - theirs).norm() < 0.02 * moved  # bfloat16's rounding in torch's products
    for ours, theirs in zip(buffers["batched"], buffers["torch"]):
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_muon_in_bfloat16_is_torch_muons_precision(one_thread):
    # model.optimizer_options.muon.precision bfloat16: Newton-Schulz's products in bfloat16, as torch.optim.Muon's
    # on every device; each update as far from the float32 one as torch's is, and not closer.
    torch.manual_seed(1)
    shapes = [(48, 16), (16, 16), (16, 48), (48, 16), (16, 64)]
    start = [torch.randn(shape) * 0.1 for shape in shapes]
    grads = [torch.randn(shape) for shape in shapes]
    moved = {}
    for name, kind, settings in (
        ("torch", torch.optim.Muon, {}),
        ("float32", BatchedMuon, {}),
        ("bfloat16", BatchedMuon, {"precision": "bfloat16"}),
    ):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        for param, grad in zip(params, grads):
            param.grad = grad.clone()
        kind(params, lr=0.02, momentum=0.95, **settings).step()
        moved[name] = [(p - w).detach() for p, w in zip(params, start)]
    for n, (ours, theirs, exact) in enumerate(zip(moved["bfloat16"], moved["torch"], moved["float32"])):
        size = exact.norm()
        # torch's step (bitwise on one thread; float16's products would miss by about 1e-2 of it)
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * size.item(), msg=f"matrix {n}")
        assert 1e-4 * size < (ours - exact).norm() < 0.03 * size, n  # bfloat16's rounding, not float32's


# ------------------------------------------------------------------------------- settings


BAD_SETTINGS = {
    "eps": (0.0, "use a small positive number such as 1e-8"),
    "optimizer": ("sgd", "use one of adamw, muon"),
    "optimizer_options.muon.lr": (0.0, "use a positive learning rate"),
    "optimizer_options.muon.momentum": (1.0, "[0, 1)"),
    "optimizer_options.muon.weight_decay": (-0.1, "use 0 or more"),
    "schedule": ("step", "use one of cosine, wsd"),
    "decay_steps": (-5, "use 0 or more"),
    "decay_fraction": (1.5, "[0, 1]"),
    "decay_shape": ("cubic", "use one of linear, 1-sqrt"),
    "optimizer_options.muon.precision": ("float16", "choose one of auto, float32, bfloat16"),
}


def nested(key: str, value) -> dict:
    """{"a.b.c": v} as {"a": {"b": {"c": v}}}, as a config file writes it."""
    head, _, rest = key.partition(".")
    return {head: nested(rest, value) if rest else value}


@pytest.mark.parametrize("setting", list(BAD_SETTINGS))
def test_each_setting_is_checked_with_one_line_naming_it(setting):
    value, fix = BAD_SETTINGS[setting]
    section = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "weight_decay": 0.1, "betas": [0.9, 0.95]}
    with pytest.raises(UserError) as error:
        check_model_section({**section, **nested(setting, value)})
    message = str(error.value)
    assert message.startswith(f"model.{setting}: ") and fix in message and "\n" not in message


def test_a_config_without_the_settings_is_adamw_and_cosine():
    check_model_section(
        {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "weight_decay": 0.1, "betas": [0.9, 0.95]}
    )


def test_the_settings_are_declared_once_and_minitxlm_takes_each_by_name():
    # LightningCLI and checkpoints' hyperparameters read MinitxLM's arguments by name: its declared
    # signature lists Optimisation's fields, with their types and defaults, so a setting added
    # there is a model.* key without an edit of MinitxLM.
    from minitx.training.module import MinitxLM

    arguments = inspect.signature(MinitxLM.__init__).parameters
    types = typing.get_type_hints(Optimisation)
    assert "optimisation" not in arguments  # the object is for Python; the keys are its fields
    for field in dataclasses.fields(Optimisation):
        assert field.name in arguments, field.name
        assert arguments[field.name].annotation == types[field.name], field.name
        assert arguments[field.name].default == getattr(DEFAULTS, field.name), field.name
        assert f"{field.name}:" in MinitxLM.__doc__  # --help describes it (from Optimisation's docstring)
    assert set(OPTIMIZERS) == {"adamw", "muon"}  # the values model.optimizer takes, one entry each
    # The schedule's own defaults are the settings'.
    schedule = inspect.signature(lr_at).parameters
    for name in ("schedule", "decay_steps", "decay_fraction", "decay_shape"):
        assert schedule[name].default == getattr(DEFAULTS, name), name


def test_minitxlm_takes_the_settings_as_one_object_or_by_name_not_both():
    from minitx.training.module import MinitxLM

    shape = {"vocab_size": 29, "block_size": 16, "n_layer": 1, "n_head": 2, "d_model": 16}
    own = {"muon": {"lr": 0.05}}
    settings = Optimisation(optimizer="muon", lr=3e-3, optimizer_options=own)
    given = MinitxLM(optimisation=settings, **shape)
    by_name = MinitxLM(optimizer="muon", lr=3e-3, optimizer_options=own, **shape)
    assert given.optimisation == by_name.optimisation == settings
    # Checkpoints save the settings by name, each optimiser's own as plain data under its name.
    assert dict(given.hparams) == dict(by_name.hparams)
    assert given.hparams["optimizer_options"] == {
        "muon": {"lr": 0.05, "momentum": 0.95, "weight_decay": 0.0, "precision": "auto"}
    }
    assert given.hparams["betas"] == [0.9, 0.95]
    assert MinitxLM(**shape).optimisation == DEFAULTS
    with pytest.raises(UserError, match=r"^model: give the optimiser settings as `optimisation` or by name"):
        MinitxLM(optimisation=settings, lr=1e-3, **shape)
    with pytest.raises(UserError, match=r"^model.optimizer_options.muon.lr: is -1"):
        MinitxLM(optimizer_options={"muon": {"lr": -1}}, **shape)
    with pytest.raises(
        UserError, match=r"^model.muon_lr: this setting is now model.optimizer_options.muon.lr;"
    ):
        MinitxLM(muon_lr=0.05, **shape)


def test_the_registry_declares_each_optimisers_settings_and_learning_rates():
    from minitx.ablation.plan.sweep import LR_KEYS
    from minitx.training.optim.registry import all_lr_keys, lr_keys

    assert lr_keys("adamw") == ("lr", "min_lr")
    assert lr_keys("muon") == ("lr", "min_lr", "optimizer_options.muon.lr")
    assert lr_keys("not-an-optimiser") == ("lr", "min_lr")
    assert (
        LR_KEYS
        == tuple(f"model.{key}" for key in all_lr_keys())
        == ("model.lr", "model.min_lr", "model.optimizer_options.muon.lr")
    )
    for name in OPTIMIZERS:  # each is a setting, with a default
        assert set(lr_keys(name)) <= set(DEFAULTS.by_key())
    # An optimiser's own settings are a section of model.optimizer_options, under its name.
    assert [f.name for f in dataclasses.fields(OptimizerOptions)] == [
        name for name, spec in OPTIMIZERS.items() if spec.settings is not None
    ]
    assert DEFAULTS.optimizer_options.muon == MuonSettings()


def test_an_optimisers_settings_are_refused_in_one_line_naming_the_option_in_full():
    cases = {
        "lrr": "model.optimizer_options.muon.lrr: optimizer muon has no such option (did you mean lr?)",
        "momentum": "model.optimizer_options.muon.momentum: is 'high', not a number",
    }
    for option, start in cases.items():
        with pytest.raises(UserError) as error:
            Optimisation(optimizer_options={"muon": {option: "high"}})
        assert str(error.value).startswith(start) and "\n" not in str(error.value)
    with pytest.raises(
        UserError, match=r"^model.optimizer_options.mun: there is no optimizer 'mun' \(did you mean muon"
    ):
        Optimisation(optimizer_options={"mun": {}})
    with pytest.raises(
        UserError, match=r"^model.optimizer_options.adamw: optimizer adamw has no settings of its own"
    ):
        Optimisation(optimizer_options={"adamw": {}})


def test_older_runs_resume_with_what_they_ran():
    # A checkpoint written before these settings existed trained with AdamW and the cosine: the
    # defaults of the settings added later stand for it, so they must stay these values.
    assert {key: DEFAULTS.by_key()[key] for key in ADDED_LATER} == {
        "optimizer": "adamw",
        "optimizer_options.muon.lr": 0.02,
        "optimizer_options.muon.momentum": 0.95,
        "optimizer_options.muon.weight_decay": 0.0,
        "schedule": "cosine",
        "decay_steps": None,
        "decay_fraction": 0.2,
        "decay_shape": "linear",
        # float32 on a CPU, bfloat16 on a GPU: what BatchedMuon always did
        "optimizer_options.muon.precision": "auto",
    }
    assert Optimisation.of({"lr": 3e-3, "betas": [0.9, 0.95], "block_size": 32}) == Optimisation(lr=3e-3)
    assert optimizer_of_state(None) == optimizer_of_state({"state": {}, "param_groups": []}) == "adamw"
    assert optimizer_of_state({"adamw": {}, "muon": {}}) == "muon"


# ------------------------------------------------------------------------------- the train command


def recipe_config(corpus: dict[str, Path], directory: Path) -> dict:
    """The tiny run with the recipe, into directory/runs/tiny."""
    return tiny_config(corpus, directory / "runs", model=RECIPE, trainer={"gradient_clip_val": 1.0})


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory, corpus) -> Path:
    """The tiny run with Muon and wsd, uninterrupted, in-process. Returns its run directory."""
    directory = tmp_path_factory.mktemp("recipe")
    config = write_config(directory / "tiny.yaml", recipe_config(corpus, directory))
    assert train_main(["--config", str(config)]) == 0
    return directory / "runs" / "tiny"


def test_train_with_muon_and_wsd_logs_the_schedule_and_saves_both_states(recipe_run):
    assert sorted(logged_lrs(recipe_run)) == list(range(STEPS))
    assert_schedule(logged_lrs(recipe_run), max_steps=STEPS, decay_fraction=0.25)
    checkpoint = torch.load(recipe_run / "checkpoints" / LAST, weights_only=True)
    state = checkpoint["optimizer_states"][0]
    assert set(state) == {"adamw", "muon"}
    muon = state["muon"]["state"]
    assert len(muon) == 4 and all("momentum_buffer" in s for s in muon.values())  # 1 layer's 4 matrices
    # Both optimisers' lrs moved by the schedule's factor, down to min_lr / lr at the end.
    end = lr_at(STEPS, LR, MIN_LR, WARMUP, STEPS) / LR
    assert state["muon"]["param_groups"][0]["lr"] == pytest.approx(MUON_LR * end, rel=0.35)


def test_a_resumed_run_keeps_the_optimiser_of_its_checkpoint(recipe_run, corpus, tmp_path, capfd):
    # Its state is the checkpoint's optimiser's: a config naming the other (an older run, or one
    # begun under another default) is said in one line, and the run goes on as it was.
    shutil.copytree(recipe_run, tmp_path / "runs" / "tiny")
    config = write_config(tmp_path / "tiny.yaml", recipe_config(corpus, tmp_path))
    args = ["--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", str(STEPS + 2)]
    assert train_main([*args, "--model.optimizer", "adamw"]) == 0
    err = capfd.readouterr().err
    assert "was trained with model.optimizer muon, not adamw; the run continues with muon" in err
    checkpoint = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / LAST, weights_only=True)
    assert checkpoint["global_step"] == STEPS + 2 and set(checkpoint["optimizer_states"][0]) == {
        "adamw",
        "muon",
    }


# ------------------------------------------------------------------------------- real processes


@pytest.fixture(scope="module")
def recipe_uninterrupted(tmp_path_factory, corpus) -> Path:
    """The reference of the kill test: the recipe's run from start to end in a process."""
    directory = tmp_path_factory.mktemp("recipe-uninterrupted")
    config = write_config(directory / "tiny.yaml", recipe_config(corpus, directory))
    status, output = finish(train_process(config))
    assert status == 0, output[-3000:]
    return directory / "runs" / "tiny"


@pytest.mark.slow
def test_muon_and_wsd_resume_exactly_after_sigkill(tmp_path, corpus, killer_dir, recipe_uninterrupted, seed):
    # Killed in the stable stage or in the decay: either way the resumed losses are the unbroken run's.
    kill_step = random.Random(seed).randint(6, 22)
    print(f"SIGKILL after step {kill_step}")
    config = write_config(tmp_path / "tiny.yaml", recipe_config(corpus, tmp_path))
    run = tmp_path / "runs" / "tiny"
    status, output = finish(
        train_process(config, with_callback("KillAtStep", kill_step), killer_dir=killer_dir)
    )
    assert status == -signal.SIGKILL, output[-3000:]
    saved_before = max(s for s in SAVE_STEPS if s < kill_step)
    assert checkpoint_step(run / "checkpoints" / LAST) == saved_before

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert_resumed_losses_equal(recipe_uninterrupted, run, saved_before)
    whole = logged_lrs(recipe_uninterrupted)
    assert logged_lrs(run, version=1) == {s: lr for s, lr in whole.items() if s >= saved_before}


@pytest.mark.slow
def test_a_wsd_run_extended_keeps_its_stable_stage_and_decays_at_the_new_end(tmp_path, corpus, killer_dir):
    # The run planned 24 steps (decay from step 18) stops after step 12, its last checkpoint at 10.
    config = write_config(tmp_path / "tiny.yaml", recipe_config(corpus, tmp_path))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    status, output = finish(train_process(config, with_callback("KillAtStep", 12), killer_dir=killer_dir))
    assert status == -signal.SIGKILL and checkpoint_step(checkpoints / LAST) == 10, output[-3000:]
    stable = tmp_path / "stable.ckpt"
    shutil.copy(checkpoints / LAST, stable)

    # Extended to 40 steps: lr stays at its peak until the new decay (the last quarter, from 30).
    status, output = finish(train_process(config, "--ckpt_path", "last", "--trainer.max_steps", "40"))
    assert status == 0, output[-3000:]
    assert checkpoint_step(checkpoints / LAST) == 40
    lrs = logged_lrs(checkpoints.parent, version=1)
    assert sorted(lrs) == list(range(10, 40))
    assert [lrs[s] for s in range(10, 30)] == pytest.approx([LR] * 20, rel=1e-6)
    assert_schedule(lrs, max_steps=40, decay_fraction=0.25)
    assert lrs[39] < lrs[35] < LR

    # From the stable checkpoint, a decay over the next 6 steps, as a run of its own.
    decay = [
        "--ckpt_path",
        str(stable),
        "--run.name",
        "decayed",
        "--trainer.max_steps",
        "16",
        "--model.decay_steps",
        "6",
    ]
    status, output = finish(train_process(config, *decay))
    assert status == 0, output[-3000:]
    decayed = tmp_path / "runs" / "decayed"
    assert checkpoint_step(decayed / "checkpoints" / LAST) == 16
    lrs = logged_lrs(decayed)
    assert sorted(lrs) == list(range(10, 16))
    assert_schedule(lrs, max_steps=16, decay_steps=6)
    assert lrs[10] == pytest.approx(LR) and lrs[15] == pytest.approx(LR - (LR - MIN_LR) * 5 / 6)

"""Export to transformers, import from it, and the lm-eval adapter: tiny models, all offline.

Every export is checked against the minitx model it came from: logits within 1e-5 (float32) on
random tokens longer than any window, greedy generation token for token, and the import of the
exported directory gives back the very same weights. Gated DeltaNet's are held within 1e-4 (its
chunked form sums in another order than transformers' chunks or the custom code's loop).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.data.tokenizer import CharTokenizer, train_bpe
from minitx.errors import UserError

transformers = pytest.importorskip(
    "transformers", reason="the hf extra is not installed: pip install -e '.[hf]'"
)
from minitx.hf import convert  # noqa: E402
from minitx.hf.export import export_checkpoint  # noqa: E402
from minitx.hf.load import init_model, read_hf_directory  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = "to be or not to be, that is the question.\nwhether 'tis nobler in the mind to suffer\n"
WINDOW = 5  # every test sequence is longer, so the window's off-by-one shows
SWIGLU = dict(mlp="swiglu")

# (name, model fields, expected class): every kind, the mixes, and what only custom code expresses.
CASES = [
    ("mha", dict(SWIGLU, attention=dict(kind="mha")), "LlamaForCausalLM"),
    ("mqa", dict(SWIGLU, attention=dict(kind="mqa")), "LlamaForCausalLM"),
    ("gqa", dict(SWIGLU, attention=dict(kind="gqa", n_kv_head=2)), "LlamaForCausalLM"),
    (
        "local",
        dict(SWIGLU, attention=dict(kind="local", options={"local": {"window": WINDOW}}, n_kv_head=2)),
        "MistralForCausalLM",
    ),
    (
        "mix",
        dict(
            SWIGLU,
            attention=dict(
                kind="local", options={"local": {"window": WINDOW}}, layers=["local", "mha", "local"]
            ),
        ),
        "MinistralForCausalLM",
    ),
    (
        "mix_mqa",
        dict(
            SWIGLU,
            attention=dict(
                kind="local", options={"local": {"window": WINDOW}}, n_kv_head=1, layers=["mqa", "local"]
            ),
        ),
        "MinistralForCausalLM",
    ),
    (
        "global",
        dict(SWIGLU, attention=dict(kind="local", options={"local": {"window": WINDOW, "n_global": 2}})),
        "MinitxForCausalLM",
    ),
    (
        "gelu_layernorm_learned_bias",
        dict(norm="layernorm", positions="learned", bias=True, tie_embeddings=False),
        "MinitxForCausalLM",
    ),
    (
        "mix_kv_heads",
        dict(SWIGLU, attention=dict(kind="gqa", n_kv_head=2, layers=["gqa", "mha", "mqa"])),
        "MinitxForCausalLM",
    ),
    (
        "mta_pre",
        dict(
            attention=dict(
                kind="mta", options={"mta": {"conv_layers": [0, 2], "query_kernel": 3, "key_kernel": 3}}
            )
        ),
        "MinitxForCausalLM",
    ),
    (
        "mta_post",
        dict(
            attention=dict(
                kind="mta",
                options={
                    "mta": {
                        "conv_layers": [1],
                        "conv_placement": "post",
                        "head_group": 2,
                        "pre_mix_all_heads": False,
                    }
                },
                n_kv_head=2,
            )
        ),
        "MinitxForCausalLM",
    ),
    (
        "mta_both",
        dict(
            attention=dict(
                kind="mta",
                options={
                    "mta": {
                        "conv_layers": [1],
                        "conv_placement": "both",
                        "query_kernel": 3,
                        "key_kernel": 5,
                        "head_mix": "post",
                    }
                },
            )
        ),
        "MinitxForCausalLM",
    ),
    # the options every softmax kind has: QK-norm is Qwen3's; sinks and the gate need custom code
    (
        "qknorm",
        dict(SWIGLU, attention=dict(kind="mha", options={"mha": {"qk_norm": True}})),
        "Qwen3ForCausalLM",
    ),
    (
        "qknorm_local_gqa_mix",
        dict(
            SWIGLU,
            attention=dict(
                kind="local",
                layers=["local", "gqa"],
                n_kv_head=2,
                options={"local": {"window": WINDOW, "qk_norm": True}, "gqa": {"qk_norm": True}},
            ),
        ),
        "Qwen3ForCausalLM",
    ),
    (
        "sinks_local_mha",
        dict(
            SWIGLU,
            attention=dict(
                kind="local",
                layers=["local", "mha"],
                options={"local": {"window": WINDOW, "sinks": True}, "mha": {"sinks": True}},
            ),
        ),
        "MinitxForCausalLM",
    ),
    (
        "gated_elementwise_qknorm",
        dict(
            attention=dict(kind="gqa", n_kv_head=2, options={"gqa": {"gate": "elementwise", "qk_norm": True}})
        ),
        "MinitxForCausalLM",
    ),
    (
        "gated_head",
        dict(SWIGLU, attention=dict(kind="mqa", options={"mqa": {"gate": "head"}})),
        "MinitxForCausalLM",
    ),
    # configs/mta.yaml's released setting: 6 x 11 kernels before and after the softmax
    (
        "mta_released",
        dict(attention=dict(kind="mta", options={"mta": {"conv_placement": "both", "conv_layers": [2]}})),
        "MinitxForCausalLM",
    ),
    (
        "mta_local_mix",
        dict(
            attention=dict(
                kind="mta",
                options={
                    "local": {"window": WINDOW},
                    "mta": {"conv_layers": [0], "output_norm": False, "head_mix": "none"},
                },
                layers=["mta", "local"],
            )
        ),
        "MinitxForCausalLM",
    ),
]


def make_model(fields: dict, tokenizer, seed: int = 0) -> Transformer:
    """A tiny model whose every parameter is perturbed, so that identity inits (MTA's kernels and
    mixes, norms of ones) cannot hide a mapping that drops or transposes them."""
    fields = dict(fields)
    attention = AttentionConfig(**fields.pop("attention", {}))
    shape = dict(vocab_size=tokenizer.vocab_size, block_size=48, n_layer=3, n_head=4, d_model=32)
    config = ModelConfig(**{**shape, **fields}, attention=attention)
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def write_checkpoint(path: Path, model: Transformer, tokenizer) -> Path:
    torch.save(
        {
            "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": model.config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        path,
    )
    return path


def load_exported(directory: Path):
    quiet = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    finally:
        transformers.logging.set_verbosity(quiet)


@pytest.mark.parametrize("name, fields, expected", CASES, ids=[case[0] for case in CASES])
def test_export_matches_minitx_and_imports_back_bit_identical(
    tmp_path, one_thread, seed, name, fields, expected
):
    tokenizer = CharTokenizer(TEXT)
    model = make_model(fields, tokenizer, seed)
    out = tmp_path / "hf"
    assert (
        export_checkpoint(
            str(write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)), str(out), log=lambda _: None
        )
        == expected
    )
    hf_model = load_exported(out)
    assert type(hf_model).__name__ == expected

    tokens = torch.randint(
        0, tokenizer.vocab_size, (2, 3 * WINDOW + 2)
    )  # longer than the window, not a multiple
    with torch.no_grad():
        assert (hf_model(tokens).logits - model(tokens)).abs().max() < 1e-5

    prompt = tokens[:1, :4]
    ours = model.generate(prompt, 24, temperature=0)
    theirs = hf_model.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(ours, theirs)

    config, state, _ = read_hf_directory(str(out), log=lambda _: None)
    original = model.state_dict()
    assert state.keys() == original.keys()
    assert all(torch.equal(state[key], original[key]) for key in original)
    assert config.layer_kinds == model.config.layer_kinds


@pytest.mark.parametrize("fields", [{}, dict(SWIGLU, attention=dict(kind="gqa", n_kv_head=2))])
def test_a_model_with_documents_exports_and_says_what_changes(tmp_path, one_thread, fields):
    tokenizer = CharTokenizer(TEXT)
    model = make_model(dict(fields, document_token=0), tokenizer)
    said = []
    export_checkpoint(
        str(write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)), str(tmp_path / "hf"), log=said.append
    )
    assert "document_token 0" in said[-1] and "one document per sequence" in said[-1]
    tokens = torch.randint(1, tokenizer.vocab_size, (2, 30))
    tokens[:, 0] = 0  # one document per sequence: the same logits
    with torch.no_grad():
        assert (load_exported(tmp_path / "hf")(tokens).logits - model(tokens)).abs().max() < 1e-5


def test_native_llama_loads_without_remote_code_and_tokenizers_round_trip(tmp_path, one_thread):
    for name, tokenizer in (("char", CharTokenizer(TEXT)), ("bpe", train_bpe(TEXT * 4, 300))):
        model = make_model(dict(SWIGLU, attention=dict(kind="gqa", n_kv_head=2)), tokenizer)
        out = tmp_path / name
        export_checkpoint(
            str(write_checkpoint(tmp_path / f"{name}.ckpt", model, tokenizer)), str(out), log=lambda _: None
        )
        assert not (out / "modeling_minitx.py").exists()
        assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(out)  # no trust_remote_code
        assert type(hf_model).__name__ == "LlamaForCausalLM"
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
        ids = hf_tokenizer(TEXT)["input_ids"]
        assert ids == tokenizer.encode(TEXT)
        assert hf_tokenizer.decode(ids) == TEXT


def test_bfloat16_export_holds_the_rounded_weights(tmp_path, one_thread):
    tokenizer = CharTokenizer(TEXT)
    model = make_model(dict(SWIGLU), tokenizer)
    out = tmp_path / "bf16"
    export_checkpoint(
        str(write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)),
        str(out),
        dtype="bfloat16",
        log=lambda _: None,
    )
    _, state, _ = read_hf_directory(str(out), log=lambda _: None)
    assert state["tok_emb.weight"].dtype == torch.bfloat16
    assert torch.equal(
        state["blocks.0.attn.qkv_proj.weight"], model.state_dict()["blocks.0.attn.qkv_proj.weight"].bfloat16()
    )


def test_sliding_window_off_by_one_agrees_with_transformers(one_thread):
    """A Mistral model with sliding_window=W and minitx's local attention with window=W see the same
    keys: changing the token W positions back changes nothing, W - 1 back changes the output."""
    tokenizer = CharTokenizer(TEXT)
    model = make_model(
        dict(SWIGLU, n_layer=1, attention=dict(kind="local", options={"local": {"window": WINDOW}})),
        tokenizer,
    )
    hf_model = convert_in_memory(model)
    tokens = torch.randint(0, tokenizer.vocab_size, (1, 2 * WINDOW + 1))
    last = tokens.shape[1] - 1
    for back, changes in ((WINDOW, False), (WINDOW - 1, True)):
        edited = tokens.clone()
        edited[0, last - back] = (edited[0, last - back] + 1) % tokenizer.vocab_size
        with torch.no_grad():
            for run in (model, lambda ids: hf_model(ids).logits):
                moved = (run(edited)[0, last] - run(tokens)[0, last]).abs().max() > 1e-6
                assert bool(moved) == changes


def convert_in_memory(model: Transformer):
    from minitx.hf.export import native_model

    architecture, _ = convert.native_class(model.config)
    return native_model(model, architecture)


# -- import into a run ---------------------------------------------------------------------------


def test_gqa_conversion_mean_pools_each_group_and_trains(tmp_path, one_thread):
    tokenizer = CharTokenizer(TEXT)
    source = make_model(dict(SWIGLU, attention=dict(kind="mha")), tokenizer)
    directory = tmp_path / "llama"
    export_checkpoint(
        str(write_checkpoint(tmp_path / "m.ckpt", source, tokenizer)), str(directory), log=lambda _: None
    )

    target = Transformer(
        ModelConfig(**{**source.config.to_dict(), "attention": {"kind": "gqa", "n_kv_head": 2}})
    )
    messages = []
    init_model(target, str(directory), log=messages.append)
    assert any("mean-pooled" in message for message in messages)
    D, H = source.config.head_dim, source.config.n_head
    for layer in range(source.config.n_layer):
        q, k, v = source.state_dict()[f"blocks.{layer}.attn.qkv_proj.weight"].split(H * D)
        fused = target.state_dict()[f"blocks.{layer}.attn.qkv_proj.weight"]
        assert torch.equal(fused[: H * D], q)
        for pooled, full in zip(fused[H * D :].split(2 * D), (k, v)):
            heads = full.view(H, D, -1)
            expected = torch.stack([heads[0:2].mean(0), heads[2:4].mean(0)]).view(2 * D, -1)
            assert torch.allclose(pooled, expected, atol=1e-7)
    assert torch.equal(
        target.state_dict()["blocks.0.mlp.up.weight"], source.state_dict()["blocks.0.mlp.up.weight"]
    )

    ids = torch.tensor([tokenizer.encode(TEXT)[:40]])
    optimizer = torch.optim.AdamW(target.parameters(), lr=3e-3)
    losses = []
    target.train()
    for _ in range(8):
        logits = target(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[0, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_import_of_models_made_by_transformers_gives_their_logits(tmp_path, one_thread, seed, model_type):
    """Directories transformers wrote itself: Llama with q/k/v/o biases and GQA, Qwen2 with its
    q/k/v biases and sliding-window layers (window shorter than the input), Qwen3 with its q_norm
    and k_norm and sliding-window layers."""
    from minitx.hf.load import load_hf_model

    common = dict(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    extra = (
        dict(attention_bias=True)
        if model_type == "llama"
        else dict(
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attention_bias=True,  # Qwen2 always has q/k/v biases; Qwen3 has them all when asked
        )
    )
    if model_type == "qwen3":
        extra["head_dim"] = 8  # Qwen3 states it (default 128)
    config = transformers.AutoConfig.for_model(model_type, **common, **extra)
    torch.manual_seed(seed)
    hf_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in hf_model.parameters():
            param.add_(torch.randn_like(param) * 0.1)  # biases and norms away from zeros and ones
    hf_model.save_pretrained(tmp_path / model_type)
    model = load_hf_model(str(tmp_path / model_type), log=lambda _: None)
    assert model.config.bias and model.config.mlp_hidden == 72
    if model_type != "llama":
        assert (
            model.config.layer_kinds == ["local", "gqa", "local"]
            and model.config.attention.options_of("local").window == WINDOW
        )
    if model_type == "qwen3":
        assert model.config.options_at(0).qk_norm and model.config.options_at(1).qk_norm
    tokens = torch.randint(0, 40, (2, 3 * WINDOW + 2))
    with torch.no_grad():
        assert (model(tokens) - hf_model(tokens).logits).abs().max() < 1e-5


def test_import_refuses_kv_heads_that_do_not_pool(tmp_path):
    tokenizer = CharTokenizer(TEXT)
    source = make_model(
        dict(SWIGLU, n_head=6, d_model=48, attention=dict(kind="gqa", n_kv_head=2)), tokenizer
    )
    directory = tmp_path / "gqa"
    export_checkpoint(
        str(write_checkpoint(tmp_path / "m.ckpt", source, tokenizer)), str(directory), log=lambda _: None
    )
    target = Transformer(
        ModelConfig(**{**source.config.to_dict(), "attention": {"kind": "gqa", "n_kv_head": 3}})
    )
    with pytest.raises(
        UserError, match=r"attention.n_kv_head: layer 0 .* 2 key/value heads, which cannot be pooled into 3"
    ):
        init_model(target, str(directory), log=lambda _: None)


def test_import_refuses_an_unsupported_architecture_by_name(tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(
        UserError, match=r"architecture GPT2LMHeadModel cannot be imported; minitx imports LlamaForCausalLM"
    ):
        read_hf_directory(str(tmp_path / "gpt2"))
    with pytest.raises(UserError, match="no such directory"):
        read_hf_directory(str(tmp_path / "missing"))


def finetune_args(tmp_path: Path, directory: Path, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 40)
    return [
        "--config",
        str(ROOT / "configs" / "finetune.yaml"),
        "--model.init_from",
        str(directory),
        "--model.block_size",
        "16",
        "--data.source",
        "files",
        "--data.train_files",
        str(corpus),
        "--data.val_fraction",
        "0.2",
        "--data.batch_size",
        "4",
        "--data.val_batches",
        "1",
        "--data.cache_dir",
        str(tmp_path / "cache"),
        "--trainer.max_steps",
        "4",
        "--trainer.val_check_interval",
        "4",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--run.root",
        str(tmp_path / "runs"),
        "--run.name",
        "ft",
        "--run.sample_tokens",
        "0",
        *extra,
    ]


def test_train_from_an_mha_directory_as_gqa_pools_heads_says_so_and_trains(tmp_path, capfd, one_thread):
    from minitx.cli import train_main

    tokenizer = CharTokenizer(TEXT)
    source = make_model(dict(SWIGLU, n_layer=2, attention=dict(kind="mha")), tokenizer)
    directory = tmp_path / "llama"
    export_checkpoint(
        str(write_checkpoint(tmp_path / "m.ckpt", source, tokenizer)), str(directory), log=lambda _: None
    )
    assert (
        train_main(
            finetune_args(
                tmp_path, directory, "--model.attention.kind", "gqa", "--model.attention.n_kv_head", "2"
            )
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "mean-pooled key/value heads per group" in out and "0: 4->2" in out, out
    saved = torch.load(tmp_path / "runs" / "ft" / "checkpoints" / "last.ckpt", weights_only=True)
    config = ModelConfig.from_dict(saved["minitx"]["model_config"])
    assert (config.attention.kind, config.attention.n_kv_head, config.d_model, config.mlp) == (
        "gqa",
        2,
        32,
        "swiglu",
    )
    assert saved["global_step"] == 4
    weights = {key[len("model.") :]: value for key, value in saved["state_dict"].items()}
    assert not torch.equal(
        weights["blocks.0.mlp.up.weight"], source.state_dict()["blocks.0.mlp.up.weight"]
    )  # it trained


def test_train_refuses_an_unsupported_directory_with_one_line_and_writes_nothing(tmp_path, capfd):
    from minitx.cli import train_main

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "tokenizer.json").write_text(convert_char_tokenizer_json())
    capfd.readouterr()
    assert train_main(finetune_args(tmp_path, tmp_path / "gpt2")) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "architecture GPT2LMHeadModel cannot be imported" in err[0], err
    assert not (tmp_path / "runs").exists()


def convert_char_tokenizer_json() -> str:
    from minitx.hf.export import char_tokenizer

    return char_tokenizer(CharTokenizer(TEXT).chars).to_str()


# -- lm-eval ---------------------------------------------------------------------------------------

TASK_ROWS = [
    {"text": "to be or not", "target": " to be"},
    {"text": "that is the", "target": " question"},
    {"text": "whether 'tis nobler in the mind to suffer the", "target": " mind"},
]  # longer than block_size


def write_tasks(directory: Path) -> Path:
    """Two lm-eval tasks over a local JSONL file: continuation log-likelihoods and whole-text ones."""
    directory.mkdir()
    data = directory / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in TASK_ROWS))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (directory / "tiny_continuation.yaml").write_text(
        "task: tiny_continuation\n" + common + "output_type: loglikelihood\ndoc_to_text: '{{text}}'\n"
        "doc_to_target: '{{target}}'\nmetric_list:\n  - metric: acc\n"
    )
    (directory / "tiny_rolling.yaml").write_text(
        "task: tiny_rolling\n" + common + "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}{{target}}'\nmetric_list:\n  - metric: word_perplexity\n"
    )
    return directory


def minitx_log_likelihood(model: Transformer, ids: list[int], n_context: int) -> float:
    """Minus the sum of minitx's own per-token training losses over ids[n_context:]."""
    from minitx.training.module import lm_loss

    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    y[:, : n_context - 1] = -100  # IGNORE_INDEX: no loss on the context
    with torch.no_grad():
        return -float(lm_loss(model(x), y)) * (len(ids) - n_context)


def test_lm_eval_log_likelihoods_equal_minitx_losses_offline(tmp_path, one_thread, monkeypatch):
    pytest.importorskip("lm_eval", reason="the eval extra is not installed: pip install -e '.[eval]'")
    from minitx.hf.lm_eval_adapter import evaluate_tasks

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tokenizer = CharTokenizer(TEXT)
    model = make_model(dict(block_size=64), tokenizer)
    ckpt = write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)
    results = evaluate_tasks(
        str(ckpt),
        ["tiny_continuation", "tiny_rolling"],
        include_path=str(write_tasks(tmp_path / "tasks")),
        log_samples=True,
    )
    for row, sample in zip(
        TASK_ROWS, sorted(results["samples"]["tiny_continuation"], key=lambda s: s["doc_id"])
    ):
        ids = tokenizer.encode(row["text"] + row["target"])
        assert sample["resps"][0][0][0] == pytest.approx(
            minitx_log_likelihood(model, ids, len(row["text"])), abs=1e-4
        )
    for row, sample in zip(TASK_ROWS, sorted(results["samples"]["tiny_rolling"], key=lambda s: s["doc_id"])):
        ids = tokenizer.encode(
            row["text"] + row["target"]
        )  # no end-of-text token: the first one only conditions
        assert sample["resps"][0][0] == pytest.approx(minitx_log_likelihood(model, ids, 1), abs=1e-4)


def test_evaluate_command_with_lm_eval_tasks_refuses_a_bad_checkpoint_with_one_line(tmp_path, capsys):
    pytest.importorskip("lm_eval", reason="the eval extra is not installed: pip install -e '.[eval]'")
    from minitx.cli import eval_main

    assert eval_main(["--ckpt", str(tmp_path / "missing.ckpt"), "--lm-eval-tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ckpt" in err and "no such file" in err, err


def test_lm_eval_long_texts_and_generate_until(one_thread):
    pytest.importorskip("lm_eval", reason="the eval extra is not installed: pip install -e '.[eval]'")
    from lm_eval.api.instance import Instance

    from minitx.hf.lm_eval_adapter import MinitxLM

    tokenizer = CharTokenizer(TEXT)
    model = make_model(dict(block_size=8), tokenizer)
    lm = MinitxLM(model, tokenizer)
    text = TEXT[:30]
    ids = tokenizer.encode(text)
    expected = 0.0  # every token after the first, each seeing at most block_size tokens before it
    with torch.no_grad():
        for start in range(1, len(ids), 8):
            stop = min(start + 8, len(ids))
            logprobs = torch.log_softmax(
                model(torch.tensor([ids[max(0, stop - 9) : stop - 1]]))[0, start - stop :], -1
            )
            expected += float(logprobs.gather(-1, torch.tensor(ids[start:stop])[:, None]).sum())
    request = Instance("loglikelihood_rolling", {}, (text,), 0)
    assert lm.loglikelihood_rolling([request])[0] == pytest.approx(expected, abs=1e-4)

    greedy = tokenizer.decode(
        model.generate(torch.tensor([tokenizer.encode("to be")]), 12, temperature=0)[0, 5:].tolist()
    )
    stop = greedy[3:5]
    request = Instance("generate_until", {}, ("to be", {"until": [stop], "max_gen_toks": 12}), 0)
    assert lm.generate_until([request]) == [greedy.split(stop)[0]]


# -- the command: bad input is one line, exit 2, nothing written ----------------------------------


def test_export_command_refuses_bad_input_with_one_line(tmp_path, capsys):
    from minitx.cli import export_main

    tokenizer = CharTokenizer(TEXT)
    ckpt = write_checkpoint(tmp_path / "m.ckpt", make_model(dict(SWIGLU), tokenizer), tokenizer)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.ckpt")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (["--ckpt", str(tmp_path / "foreign.ckpt"), "--out", str(tmp_path / "a")], "not a minitx checkpoint"),
        (
            ["--ckpt", str(ckpt), "--out", str(tmp_path / "b"), "--dtype", "float16"],
            "--dtype: 'float16' is not supported",
        ),
        (
            ["--ckpt", str(ckpt), "--out", str(tmp_path / "full")],
            "is not empty; pick another directory or add --force",
        ),
        (
            ["--ckpt", str(ckpt), "--out", str(tmp_path), "--force"],
            "contains --ckpt; give a directory of its own",
        ),
    ]
    for args, message in cases:
        assert export_main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("export: error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["foreign.ckpt", "full", "m.ckpt"]
    assert [path.name for path in (tmp_path / "full").iterdir()] == ["keep.txt"]

    assert export_main(["--ckpt", str(ckpt), "--out", str(tmp_path / "full"), "--force"]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    assert (
        not (tmp_path / "full" / "keep.txt").exists() and (tmp_path / "full" / "model.safetensors").exists()
    )


def test_a_missing_optional_package_is_one_line_naming_its_extra(monkeypatch):
    from minitx import hf

    monkeypatch.setitem(hf.EXTRAS, "no_such_package_xyz", "eval")
    with pytest.raises(
        UserError,
        match=r'^no_such_package_xyz is not installed; install it with: pip install -e "\.\[eval\]"$',
    ):
        hf.require("no_such_package_xyz.sub")


# -- Gated DeltaNet: Qwen3.5 natively, custom code otherwise ------------------------------------

# transformers runs fla's and causal-conv1d's kernels whenever they import: its torch path is the
# reference only where they are not installed.
KERNELS = [name for name in ("fla", "causal_conv1d") if __import__("importlib").util.find_spec(name)]
needs_torch_reference = pytest.mark.skipif(
    bool(KERNELS),
    reason=f"{', '.join(KERNELS)} installed: transformers would run those kernels instead of its torch path",
)
GDN = {"chunk_size": 8}  # the test sequences are no multiple of it
QWEN3_NEXT_SOFTMAX = {"qk_norm": True, "gate": "elementwise"}

# (name, model fields, expected class, import gives back the very weights)
GDN_CASES = [
    ("gdn", dict(SWIGLU, attention=dict(kind="gdn", options={"gdn": GDN})), "Qwen3_5ForCausalLM", True),
    (
        "hybrid_grouped_values",  # 3:1 as Qwen3-Next: two value heads per key head, own widths
        dict(
            SWIGLU,
            n_layer=4,
            attention=dict(
                kind="gdn",
                layers=["gdn", "gdn", "gdn", "mha"],
                options={
                    "gdn": dict(GDN, key_head_dim=6, value_head_dim=4, n_value_head=8),
                    "mha": QWEN3_NEXT_SOFTMAX,
                },
            ),
        ),
        "Qwen3_5ForCausalLM",
        True,
    ),
    (
        "hybrid_head_gate_gqa",  # one gate per head: its row repeated; it comes back elementwise
        dict(
            SWIGLU,
            n_layer=4,
            attention=dict(
                kind="gdn",
                layers=["gdn", "gqa"],
                n_kv_head=2,
                options={"gdn": GDN, "gqa": {"qk_norm": True, "gate": "head"}},
            ),
        ),
        "Qwen3_5ForCausalLM",
        False,
    ),
    (
        "hybrid_no_gate_mqa_untied",  # no gate: zero gate rows and a doubled o_proj
        dict(
            SWIGLU,
            tie_embeddings=False,
            attention=dict(kind="gdn", layers=["gdn", "mqa"], options={"gdn": GDN, "mqa": {"qk_norm": True}}),
        ),
        "Qwen3_5ForCausalLM",
        False,
    ),
    (
        "hybrid_yaml",  # configs/hybrid.yaml: the default run's GELU MLP
        dict(
            n_layer=4,
            attention=dict(
                kind="gdn",
                layers=["gdn", "gdn", "gdn", "mha"],
                options={"gdn": GDN, "mha": QWEN3_NEXT_SOFTMAX},
            ),
        ),
        "MinitxForCausalLM",
        True,
    ),
    (
        "deltanet_neg_eigval",
        dict(
            SWIGLU,
            attention=dict(
                kind="gdn", options={"gdn": dict(GDN, decay=False, allow_neg_eigval=True, n_value_head=8)}
            ),
        ),
        "MinitxForCausalLM",
        True,
    ),
    (
        "gdn_learned_layernorm_bias",
        dict(
            norm="layernorm",
            positions="learned",
            bias=True,
            attention=dict(kind="gdn", layers=["gdn", "mha"], options={"gdn": GDN}),
        ),
        "MinitxForCausalLM",
        True,
    ),
]


@needs_torch_reference
@pytest.mark.parametrize("name, fields, expected, identical", GDN_CASES, ids=[case[0] for case in GDN_CASES])
def test_gdn_export_matches_minitx_and_imports_back(
    tmp_path, one_thread, seed, name, fields, expected, identical
):
    tokenizer = CharTokenizer(TEXT)
    model = make_model(fields, tokenizer, seed)
    out = tmp_path / "hf"
    ckpt = write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)
    assert export_checkpoint(str(ckpt), str(out), log=lambda _: None) == expected
    hf_model = load_exported(out)
    assert type(hf_model).__name__ == expected

    tokens = torch.randint(0, tokenizer.vocab_size, (2, 21))  # two chunks and a partial one
    with torch.no_grad():
        for length in (1, 21):
            assert (hf_model(tokens[:, :length]).logits - model(tokens[:, :length])).abs().max() < 1e-4

    prompt = tokens[:1, :4]  # transformers decodes through its recurrent state (and KV cache)
    ours = model.generate(prompt, 24, temperature=0)
    assert torch.equal(ours, hf_model.generate(prompt, max_new_tokens=24, do_sample=False))

    config, state, _ = read_hf_directory(str(out), log=lambda _: None)
    assert config.layer_kinds == model.config.layer_kinds
    original = model.state_dict()
    if identical:
        assert state.keys() == original.keys()
        assert all(torch.equal(state[key], original[key]) for key in original)
    imported = Transformer(config).eval()  # with the default chunk_size: a setting, not a weight
    imported.load_state_dict(state)
    with torch.no_grad():
        assert (imported(tokens) - model(tokens)).abs().max() < 1e-4


@needs_torch_reference
def test_import_of_a_qwen3_5_model_made_by_transformers_gives_its_logits(tmp_path, one_thread, seed):
    """A Qwen3.5 text directory transformers wrote itself (whole RoPE): grouped value heads, GQA
    softmax layers, zero-centred norms away from zero."""
    from minitx.hf.load import load_hf_model

    config = transformers.AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=40,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=8,
        linear_value_head_dim=4,
    )
    torch.manual_seed(seed)
    hf_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in hf_model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    hf_model.save_pretrained(tmp_path / "qwen3_5")
    model = load_hf_model(str(tmp_path / "qwen3_5"), log=lambda _: None)
    assert model.config.layer_kinds == ["gdn", "gqa", "gdn", "gqa"]
    assert model.config.options_at(1).gate == "elementwise" and model.config.options_at(1).qk_norm
    tokens = torch.randint(0, 40, (2, 21))
    with torch.no_grad():
        assert (model(tokens) - hf_model(tokens).logits).abs().max() < 1e-4


def test_import_refuses_qwen3_5_partial_rope_in_one_line(tmp_path):
    config = transformers.AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=40,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    )  # Qwen3.5's own RoPE turns a quarter of each head
    config.save_pretrained(tmp_path / "qwen3_5")
    with pytest.raises(
        UserError, match=r"partial_rotary_factor=0.25 cannot be imported; minitx's RoPE turns every"
    ):
        read_hf_directory(str(tmp_path / "qwen3_5"))


def test_export_refuses_gdn_beside_a_native_only_kind_with_one_line(tmp_path, capsys):
    from minitx.cli import export_main

    tokenizer = CharTokenizer(TEXT)
    model = make_model(dict(SWIGLU, attention=dict(kind="gdn", layers=["gdn", "mla"])), tokenizer)
    ckpt = write_checkpoint(tmp_path / "m.ckpt", model, tokenizer)
    assert export_main(["--ckpt", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attention gdn/mla: mla exports only as DeepseekV3ForCausalLM" in err, err
    assert not (tmp_path / "hf").exists()

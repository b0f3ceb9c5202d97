"""Evaluation (minitx/evaluation): every target scored exactly once, perplexity equal to a naive
token-by-token computation, the length sweep, the command end to end, and bad input.

The models are tiny with weights drawn wide (std 0.3) so that a token's loss depends strongly on
its context: scoring a token with the wrong context, skipping it or counting it twice moves the
figures far beyond the tolerance.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.cli import eval_main, train_main
from minitx.data.tokenizer import CharTokenizer
from minitx.evaluation import evaluate_checkpoint
from minitx.evaluation.lengths import default_lengths, length_sweep
from minitx.evaluation.perplexity import WindowPlan, score_tokens
from minitx.evaluation.texts import tokenize

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "to be or not to be that is the question whether tis nobler in the mind to suffer".split()
KINDS = {
    "mha": dict(kind="mha"),
    "gqa": dict(kind="gqa", n_kv_head=1),
    "local": dict(kind="local", options={"local": {"window": 3}}),
    "local_sinks_gated": dict(kind="local", options={"local": {"window": 3, "sinks": True, "gate": "head"}}),
    "mha_qknorm": dict(kind="mha", options={"mha": {"qk_norm": True}}),
    "mta": dict(kind="mta", options={"mta": {"query_kernel": 2, "key_kernel": 3, "conv_layers": [0]}}),
    # Chunks of 3: windows of 8 tokens cross two chunk boundaries and end in a partial chunk.
    "gdn": dict(kind="gdn", options={"gdn": {"chunk_size": 3}}),
    "hybrid": dict(layers=["gdn", "mha"], options={"gdn": {"chunk_size": 3}, "mha": {"gate": "head"}}),
}


def wide_model(
    vocab: int, block_size: int = 8, positions: str = "rope", attention: dict | None = None
) -> Transformer:
    config = ModelConfig(
        vocab_size=vocab,
        block_size=block_size,
        n_layer=2,
        n_head=2,
        d_model=16,
        positions=positions,
        attention=AttentionConfig(**(attention or {})),
    )
    model = Transformer(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    return model.eval()


@torch.no_grad()
def next_token_nll(model: Transformer, before: torch.Tensor, target: int) -> float:
    """-log p(target | before), from one plain forward over exactly `before`."""
    logits = model.forward_embeddings(model.embed(before[None]))[0, -1]
    return float(F.cross_entropy(logits[None].double(), torch.tensor([target])))


# ------------------------------------------------------------------------------ the window plan


def test_window_plan_scores_every_target_exactly_once_with_the_promised_context():
    for num_tokens in range(2, 41):
        for context in range(1, min(num_tokens - 1, 12) + 1):
            for stride in range(1, context + 1):
                scored = []
                for k, window in enumerate(WindowPlan(num_tokens, context, stride)):
                    assert 0 <= window.begin <= num_tokens - 1 - context
                    for offset in range(window.first_scored, context):
                        scored.append(window.begin + 1 + offset)
                        # A later window's targets see at least context - stride tokens before them.
                        assert k == 0 or offset >= context - stride
                assert sorted(scored) == scored == list(range(1, num_tokens)), (num_tokens, context, stride)


def test_window_plan_slices_like_a_list_and_costs_nothing_at_any_size():
    plan = WindowPlan(1000, 64, 24)
    windows = list(plan)
    assert len(windows) == len(plan) and plan[-1] == windows[-1] and plan[-1].begin == 1000 - 1 - 64
    for done in range(0, len(plan), 7):
        assert plan[done : done + 7] == windows[done : done + 7]
    with pytest.raises(IndexError):
        plan[len(plan)]
    # 10^9 tokens at stride 1: a billion windows, none of them held.
    huge = WindowPlan(10**9, 256, 1)
    assert len(huge) == 10**9 - 256 and huge[-1].begin == 10**9 - 257 and huge[-1].first_scored == 255
    assert huge[1].first_scored == 255 and huge[0].first_scored == 0


def test_window_plan_refuses_a_text_shorter_than_one_window_and_a_bad_stride():
    with pytest.raises(ValueError):
        WindowPlan(8, 8, 8)  # 8 tokens are 7 targets
    for stride in (0, 9):
        with pytest.raises(ValueError):
            WindowPlan(100, 8, stride)


# ------------------------------------------------------------------- figures against naive sums


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_stride_one_equals_naive_token_by_token_full_context(kind, positions, seed):
    """Stride 1: target t_p is predicted from exactly t_max(0, p-C) .. t_{p-1}."""
    vocab, context, num_tokens = 11, 8, 37
    model = wide_model(vocab, context, positions, KINDS[kind])
    tokens = torch.randint(0, vocab, (num_tokens,))
    naive = [
        next_token_nll(model, tokens[max(0, p - context) : p], int(tokens[p])) for p in range(1, num_tokens)
    ]
    scores = score_tokens(model, tokens, context, stride=1, batch_size=5)
    assert scores.tokens == num_tokens - 1
    assert abs(scores.loss - sum(naive) / len(naive)) < 1e-5
    # By position: offset j holds the targets that had j tokens before them.
    for j in range(context):
        expected = (
            [naive[p - 1] for p in range(1, num_tokens) if min(p, context) - 1 == j]
            if j < context - 1
            else [naive[p - 1] for p in range(1, num_tokens) if p >= context]
        )
        assert scores.position_tokens[j] == len(expected)
        assert abs(scores.position_nats[j] - sum(expected)) < 1e-4


@pytest.mark.parametrize("stride", [2, 3, 5, 8])
def test_any_stride_equals_naive_scoring_of_each_target_in_its_window(stride, seed):
    """Each target from the tokens of its own window: windows start at k*stride, the last one moved
    back to end at the last token, and a target belongs to the first window that reaches it."""
    vocab, context, num_tokens = 13, 8, 53
    model = wide_model(vocab, context)
    tokens = torch.randint(0, vocab, (num_tokens,))
    total = 0.0
    for p in range(1, num_tokens):
        k = 0
        while min(k * stride, num_tokens - 1 - context) + context < p:
            k += 1
        begin = min(k * stride, num_tokens - 1 - context)
        total += next_token_nll(model, tokens[begin:p], int(tokens[p]))
    scores = score_tokens(model, tokens, context, stride, batch_size=3)
    assert scores.tokens == num_tokens - 1
    assert abs(scores.loss - total / (num_tokens - 1)) < 1e-5


def test_stride_equal_to_context_is_the_mean_loss_of_non_overlapping_windows(seed):
    vocab, context, windows = 17, 8, 6
    model = wide_model(vocab, context, attention=KINDS["gqa"])
    tokens = torch.randint(0, vocab, (windows * context + 1,))
    losses = [
        float(
            F.cross_entropy(
                model(tokens[i * context : (i + 1) * context][None])[0],
                tokens[i * context + 1 : (i + 1) * context + 1],
            )
        )
        for i in range(windows)
    ]
    scores = score_tokens(model, tokens, context, batch_size=4)
    assert scores.tokens == windows * context
    assert abs(scores.loss - sum(losses) / windows) < 1e-5


def test_bits_per_character_divide_the_nats_by_the_scored_characters(tmp_path, seed):
    text = " ".join(random.Random(seed).choices(WORDS, k=60))
    tokenizer = CharTokenizer(text)
    model = wide_model(tokenizer.vocab_size, 16)
    scored = tokenize("t", text, tokenizer, "--files")
    assert scored.characters == len(text) - 1 and scored.unit == "character"
    from minitx.evaluation.evaluate import evaluate_text
    from minitx.evaluation.progress import Progress

    result = evaluate_text(model, scored, 16, 16, [16], 64, Progress(False))
    assert result["tokens"] == len(text) - 1
    assert math.isclose(
        result["bits_per_char"], result["loss"] * (len(text) - 1) / math.log(2) / (len(text) - 1)
    )
    assert math.isclose(result["perplexity"], math.exp(result["loss"]))
    assert result["by_length"]["16"]["loss"] == result["loss"]
    assert sum(result["by_position"]["tokens"]) == result["tokens"]


# ---------------------------------------------------------------------------------- lengths


def test_default_lengths_are_a_quarter_to_eight_times_the_block():
    assert default_lengths(256) == [64, 128, 256, 512, 1024, 2048]
    assert default_lengths(4) == [1, 2, 4, 8, 16, 32]


def test_rope_runs_past_block_size_and_learned_positions_are_skipped_with_the_reason(seed):
    tokens = torch.randint(0, 9, (70,))
    for positions in ("rope", "learned"):
        model = wide_model(9, 8, positions)
        sweep = length_sweep(model, tokens, [4, 8, 32, 128], 64)
        assert sweep["4"]["tokens"] == sweep["8"]["tokens"] == 69
        if positions == "rope":
            assert sweep["32"]["tokens"] == 69 and math.isfinite(sweep["32"]["loss"])
            assert "fewer than one window of 128" in sweep["128"]["skipped"]
        else:
            assert sweep["32"] == sweep["128"] == {"skipped": "learned positions stop at block_size=8"}


# ----------------------------------------------------------------------------------- the command


def write_checkpoint(
    directory: Path, text: str, positions: str = "rope", block_size: int = 16, attention: dict | None = None
) -> Path:
    """A checkpoint in the training format whose run trained on data.source=files over `text`."""
    (directory / "corpus.txt").write_text(text)
    tokenizer = CharTokenizer(text)
    model = wide_model(tokenizer.vocab_size, block_size, positions, attention)
    data = {"source": "files", "train_files": str(directory / "corpus.txt"), "val_fraction": 0.25}
    path = directory / f"{positions}.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {
                "format": 1,
                "model_config": model.config.to_dict(),
                "tokenizer": tokenizer.to_dict(),
                "train_config": {"data": data},
            },
        },
        path,
    )
    return path


@pytest.fixture
def text() -> str:
    return "\n".join(" ".join(random.Random(i).choices(WORDS, k=12)) for i in range(40)) + "\n"


def test_the_api_scores_the_runs_own_validation_text(tmp_path, text):
    ckpt = write_checkpoint(tmp_path, text)
    result = evaluate_checkpoint(str(ckpt), lengths=[8, 32, 64])
    # data.val_fraction=0.25: the tail, from the first line end at or after 75% of the text
    # (a newline between two non-space characters: where a text can be cut without changing its tokens)
    point = int(len(text) * 0.75)
    cut = next(
        i + 1
        for i in range(max(point - 1, 1), len(text) - 1)
        if text[i] == "\n" and not text[i - 1].isspace() and not text[i + 1].isspace()
    )
    val_text = text[cut:]
    assert result["tokens"] == len(val_text) - 1 and result["unit"] == "character"
    assert set(result["by_length"]) == {"8", "32", "64"} and result["task"] is None
    json.dumps(result)  # JSON-able as it is
    other = tmp_path / "other.txt"
    other.write_text(text[:300])
    assert evaluate_checkpoint(str(ckpt), lengths=[16], files=[str(other)])["tokens"] == 299


def test_the_command_end_to_end_on_a_trained_checkpoint(tmp_path, text, capsys):
    (tmp_path / "corpus.txt").write_text(text * 3)
    config = {
        "seed_everything": 3,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 16, "warmup_steps": 1},
        "data": {
            "source": "files",
            "train_files": str(tmp_path / "corpus.txt"),
            "val_fraction": 0.2,
            "batch_size": 4,
            "val_batches": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 3,
            "val_check_interval": 3,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {"root": str(tmp_path / "runs"), "name": "tiny", "sample_tokens": 0},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    assert train_main(["--config", str(tmp_path / "tiny.yaml")]) == 0
    capsys.readouterr()
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "best.ckpt"
    out_json, plots = tmp_path / "out.json", tmp_path / "plots"
    assert (
        eval_main(
            [
                "--ckpt",
                str(ckpt),
                "--lengths",
                "4",
                "16",
                "64",
                "--stride",
                "8",
                "--json",
                str(out_json),
                "--plots",
                str(plots),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert err == ""  # no progress line off a terminal for a short evaluation
    result = json.loads(out_json.read_text())
    assert "bits per character" in out and f"{result['loss']:.4f}" in out
    assert result["stride"] == 8 and result["context"] == 16 and set(result["by_length"]) == {"4", "16", "64"}
    assert sorted(p.name for p in plots.iterdir()) == ["loss_by_position.png", "loss_vs_length.png"]


# ------------------------------------------------------------------------------------ bad input


def refused(capsys, argv: list[str], *fragments: str) -> str:
    """The command exits 2 with exactly one line on stderr holding every fragment."""
    assert eval_main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("evaluate: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


@pytest.mark.parametrize(
    "case",
    [
        "learned 4x block",
        "learned context",
        "stride 0",
        "stride > context",
        "context > text",
        "empty file",
        "missing file",
        "missing checkpoint",
        "bad lengths",
        "run's text moved",
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, text, capsys):
    ckpt = write_checkpoint(tmp_path, text, "learned" if case.startswith("learned") else "rope")
    (tmp_path / "empty.txt").write_text("")
    argv, fragments = {
        "learned 4x block": (
            ["--lengths", "16", "64"],
            ["--lengths", "64", "learned positions stop at block_size=16"],
        ),
        "learned context": (["--context", "64"], ["--context", "learned positions"]),
        "stride 0": (["--stride", "0"], ["--stride", "is 0"]),
        "stride > context": (["--context", "8", "--stride", "9"], ["--stride", "1 .. --context (8)"]),
        "context > text": (["--context", "100000"], ["--context", "fewer than one window of 100000"]),
        "empty file": (["--files", str(tmp_path / "empty.txt")], ["--files", "empty"]),
        "missing file": (["--files", str(tmp_path / "nowhere.txt")], ["--files", "no file matches"]),
        "missing checkpoint": (["--ckpt", str(tmp_path / "nowhere.ckpt")], ["--ckpt", "no such file"]),
        "bad lengths": (["--lengths", "0"], ["--lengths", "use 1 or more"]),
        "run's text moved": (
            [],
            ["--ckpt", "cannot rebuild the run's validation text", "data.train_files", "give --files"],
        ),
    }[case]
    if case == "run's text moved":
        (tmp_path / "corpus.txt").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(
        capsys,
        [
            "--ckpt",
            str(ckpt),
            *argv,
            "--json",
            str(tmp_path / "out.json"),
            "--plots",
            str(tmp_path / "plots"),
        ],
        *fragments,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no json, no plots directory


def test_the_api_skips_what_the_command_refuses(tmp_path, text):
    ckpt = write_checkpoint(tmp_path, text, "learned")
    result = evaluate_checkpoint(str(ckpt), lengths=[16, 64])
    assert result["by_length"]["64"] == {"skipped": "learned positions stop at block_size=16"}


def test_commands_keep_freed_memory_unless_the_user_chose(monkeypatch):
    # glibc's settings for large blocks (minitx/allocator.py); the user's own variables win.
    import platform

    from minitx.allocator import keep_freed_memory

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    assert keep_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")

"""The synthetic tasks MQAR and needle in a haystack (minitx/data/mqar.py, needle.py): samples
are deterministic by seed, every query has exactly one right answer, impossible settings are
refused naming the data.* key, and a task run is evaluated end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from minitx.cli import eval_main, train_main
from minitx.data.config import DataConfig
from minitx.data.mqar import FILLER, MQARConfig, mqar_sample, symbol
from minitx.data.needle import ASK, DEPTHS, MARK, SHORTEST, VALUE_LEN, NeedleConfig, needle_sample
from minitx.data.toy import IGNORE_INDEX, ToyTrainBatches, ToyValSet
from minitx.errors import UserError

REPO = Path(__file__).resolve().parents[2]
FILLER_TEXT = "".join(
    f"Line {i}: what light through yonder window breaks; it is the east.\n" for i in range(300)
)

# ----------------------------------------------------------------------------------------- MQAR


def task_of(source: str, settings: dict):
    """The task a data section with these settings builds (its checks name the data.task.* keys)."""
    return DataConfig(source=source, task={source: settings}).synthetic_task()


@pytest.mark.parametrize(
    "config",
    [
        MQARConfig(),
        MQARConfig(vocab=8, pairs=4, queries=4, seq_len=16),
        MQARConfig(vocab=300, pairs=20, queries=5, seq_len=101),
    ],
)
def test_mqar_every_query_has_exactly_one_right_answer(config):
    tokenizer = config.tokenizer()
    for index in range(200):
        sample = mqar_sample(config, seed=5, index=index)
        assert len(sample.text) == len(sample.ids) == len(sample.loss_mask) == config.seq_len
        assert tokenizer.decode(sample.ids) == sample.text
        keys = [key for key, _ in sample.pairs]
        assert len(set(keys)) == config.pairs and all(key < config.num_keys for key in keys)
        assert all(config.num_keys <= value < config.vocab for _, value in sample.pairs)
        assert sample.text[: 2 * config.pairs] == "".join(symbol(k) + symbol(v) for k, v in sample.pairs)
        # The answers: each masked position follows a queried key and holds that key's only value.
        answers = [i for i, masked in enumerate(sample.loss_mask) if masked]
        assert len(answers) == config.queries == len(set(sample.queries))
        value_of = {symbol(k): symbol(v) for k, v in sample.pairs}
        for i, key in zip(answers, sample.queries):
            assert i >= 2 * config.pairs + 1 and sample.text[i - 1] == symbol(key)
            assert sample.text[i] == value_of[symbol(key)]
            assert sample.text[: 2 * config.pairs].count(symbol(key)) == 1  # one pair holds the key
        # Outside the pairs and the queries there is only filler.
        query_slots = {i - 1 for i in answers} | set(answers)
        assert all(
            sample.text[i] == FILLER for i in range(2 * config.pairs, config.seq_len) if i not in query_slots
        )


def test_mqar_is_deterministic_by_seed_and_index():
    config = MQARConfig(vocab=32, pairs=6, queries=3, seq_len=32)
    assert [mqar_sample(config, 1, i) for i in range(20)] == [mqar_sample(config, 1, i) for i in range(20)]
    assert [mqar_sample(config, 1, i).text for i in range(20)] != [
        mqar_sample(config, 2, i).text for i in range(20)
    ]
    assert len({mqar_sample(config, 1, i).text for i in range(20)}) == 20


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"vocab": 1}, "data.task.mqar.vocab"),
        ({"vocab": 16, "pairs": 9}, "data.task.mqar.pairs"),  # 8 keys cannot make 9 distinct pairs
        ({"pairs": 0}, "data.task.mqar.pairs"),
        ({"pairs": 4, "queries": 5}, "data.task.mqar.queries"),
        ({"queries": 0}, "data.task.mqar.queries"),
        ({"pairs": 8, "queries": 8, "seq_len": 31}, "data.task.mqar.seq_len"),
    ],
)
def test_mqar_refuses_settings_without_a_valid_answer(settings, key):
    with pytest.raises(UserError) as error:
        task_of("mqar", settings)
    assert str(error.value).startswith(key) and "\n" not in str(error.value)


def test_mqar_batches_carry_the_loss_on_the_answers_only():
    config = task_of("mqar", {"vocab": 16, "pairs": 4, "queries": 3, "seq_len": 20})
    x, y = ToyTrainBatches(config, seed=0, train_size=100, batch_size=5).batch(0)
    assert x.shape == y.shape == (5, 19)
    assert ((y != IGNORE_INDEX).sum(-1) == 3).all()
    val_x, val_y = ToyValSet(config, seed=0, train_size=100, size=4)[0]
    assert val_x.shape == (19,) and int((val_y != IGNORE_INDEX).sum()) == 3


# --------------------------------------------------------------------------------------- needle


@pytest.fixture
def filler(tmp_path) -> str:
    path = tmp_path / "filler.txt"
    path.write_text(FILLER_TEXT.replace("east", "east # = marks"))  # markers in the filler must go
    return str(path)


def test_needle_has_one_fact_asked_at_the_end_at_the_chosen_depth(filler):
    config = NeedleConfig(length=120, min_length=40, filler=filler)
    for index in range(100):
        length, depth = 40 + index % 81, DEPTHS[index % len(DEPTHS)]
        sample = needle_sample(config, 3, index, length, depth, "test")
        assert len(sample.text) == len(sample.ids) == length
        question = f"{MARK}{sample.key}{ASK}"
        prompt = sample.text[:-VALUE_LEN]
        assert prompt.endswith(question) and sample.text.endswith(sample.value)
        assert sample.text.count(MARK) == 3 and sample.text.count(ASK) == 2  # the fact and the question only
        fact = f"{question}{sample.value}{MARK}"
        assert prompt.count(question) == 2 and prompt.count(fact) == 1
        assert sample.loss_mask == [False] * (length - VALUE_LEN) + [True] * VALUE_LEN
        hay_len = length - SHORTEST
        assert prompt.index(fact) == round(depth * hay_len)


def test_needle_is_deterministic_and_training_lengths_stay_in_range(filler):
    config = NeedleConfig(length=90, min_length=30, filler=filler)
    assert [config.sample(1, i) for i in range(30)] == [config.sample(1, i) for i in range(30)]
    assert [config.sample(1, i).text for i in range(30)] != [config.sample(2, i).text for i in range(30)]
    lengths = {len(config.sample(1, i).ids) for i in range(200)}
    assert min(lengths) >= 30 and max(lengths) <= 90 and len(lengths) > 20


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"length": SHORTEST - 1}, "data.task.needle.length"),
        ({"length": 64, "min_length": 65}, "data.task.needle.min_length"),
        ({"length": 64, "min_length": SHORTEST - 1}, "data.task.needle.min_length"),
    ],
)
def test_needle_refuses_settings_without_room_for_the_answer(settings, key):
    with pytest.raises(UserError) as error:
        task_of("needle", settings)
    assert str(error.value).startswith(key)


def test_needle_refuses_a_filler_too_short_for_the_haystack(tmp_path):
    (tmp_path / "short.txt").write_text("a few words of filler, far too few.\n" * 3)
    config = NeedleConfig(length=200, filler=str(tmp_path / "short.txt"))
    with pytest.raises(UserError, match="^data.task.needle.filler: the test filler has"):
        needle_sample(config, 0, 0, 200, 0.5, "test")


# ------------------------------------------------------------------------------ through commands


def task_run(tmp_path: Path, data: dict, block_size: int, steps: int = 4) -> dict:
    return {
        "seed_everything": 1,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": block_size, "warmup_steps": 1},
        "data": {"toy_train_size": 64, "toy_val_size": 8, "batch_size": 8, **data},
        "trainer": {
            "accelerator": "cpu",
            "max_steps": steps,
            "val_check_interval": steps,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {"root": str(tmp_path / "runs"), "name": data["source"], "sample_tokens": 0},
    }


def test_an_impossible_task_setting_stops_train_with_one_line_and_exit_2(tmp_path, capfd):
    assert (
        train_main(
            [
                "--config",
                str(REPO / "configs" / "mqar.yaml"),
                "--run.root",
                str(tmp_path / "runs"),
                "--data.task.mqar.pairs",
                "40",
            ]
        )
        == 2
    )
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error: data.task.mqar.pairs"), err
    assert not (tmp_path / "runs").exists()


def test_the_task_configs_parse():
    from minitx.training import check_train_args

    for name in ("mqar", "needle"):
        check_train_args(["--config", str(REPO / "configs" / f"{name}.yaml")])


def test_a_mqar_run_is_evaluated_on_a_fresh_test_set(tmp_path, capsys):
    data = {"source": "mqar", "task": {"mqar": {"vocab": 16, "pairs": 4, "queries": 2, "seq_len": 16}}}
    (tmp_path / "mqar.yaml").write_text(yaml.safe_dump(task_run(tmp_path, data, 15)))
    assert train_main(["--config", str(tmp_path / "mqar.yaml")]) == 0
    ckpt = tmp_path / "runs" / "mqar" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert eval_main(["--ckpt", str(ckpt), "--task-samples", "50", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "out.json").read_text())
    task = result["task"]
    assert (
        task["name"] == "mqar"
        and task["samples"] == 50
        and task["items"] == 100
        and task["first_sample"] == 72
    )
    assert 0 <= task["exact_match"] <= task["item_accuracy"] <= 1 and result["tokens"] == 100
    assert "exact match" in out and "item accuracy" in out


def test_a_needle_run_gets_an_accuracy_heatmap(tmp_path, filler, capsys):
    data = {"source": "needle", "task": {"needle": {"length": 48, "min_length": 24, "filler": filler}}}
    (tmp_path / "needle.yaml").write_text(yaml.safe_dump(task_run(tmp_path, data, 47)))
    assert train_main(["--config", str(tmp_path / "needle.yaml")]) == 0
    ckpt = tmp_path / "runs" / "needle" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert (
        eval_main(
            [
                "--ckpt",
                str(ckpt),
                "--lengths",
                "16",
                "32",
                "96",
                "--task-samples",
                "3",
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "depth x context length" in out
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "loss_vs_length.png",
        "needle_accuracy.png",
    ]
    # 16 tokens cannot hold a sample; 96 is past the training length but RoPE runs it.
    from minitx.evaluation import evaluate_checkpoint

    result = evaluate_checkpoint(str(ckpt), lengths=[16, 32, 96], task_samples=2)
    assert "skipped" in result["by_length"]["16"] and result["task"]["samples"] == 2 * 2 * len(DEPTHS)
    heatmap = result["task"]["heatmap"]
    assert heatmap["lengths"] == [16, 32, 96] and all(
        row[0] is None and row[1] is not None for row in heatmap["accuracy"]
    )

"""The `prepare` command: prepare a config's data ahead of training (and check it with --verify).

It takes the same config and flags as `train` (only the data section is used), so a CPU box can
prepare a corpus before a GPU job, or once for an ablation's many runs:

    python prepare.py --config configs/tinystories.yaml
    python prepare.py --config configs/tinystories.yaml --verify     # read every shard's checksum
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..errors import UserError
from ..files.configs import CommandLine


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    verify = "--verify" in args
    args = [arg for arg in args if arg != "--verify"]
    if "-h" in args or "--help" in args:
        print(__doc__.strip() + "\n\nEvery --data.* flag of `python train.py --help` applies.")
        return
    from .precheck import check_arguments

    line = CommandLine.read(args, default_config=True)
    # A mistake in a key, a value or a file: said before Lightning is imported.
    check_arguments(line, own_flags=["--verify"])
    # Here, past --help: the train command's parser and the data module import Lightning (seconds).
    # Beside the train command, whose parser reads the config: data/ knows nothing of commands.
    from ..data.datamodule import TextDataModule
    from ..data.prepare import verify_prepared
    from .command import checked_config

    data = TextDataModule(**checked_config(line)["data"])
    if data.task is not None:
        print(
            f"prepare: data.source={data.source} is a synthetic task, generated as it trains; nothing to prepare"
        )
        return
    data.setup()
    assert data.prepared is not None
    print(f"prepare: {data.summary()}; in {data.prepared.directory}")
    if verify and verify_prepared(data.prepared):
        raise UserError(
            f"prepare --verify: shards in {data.prepared.directory} are damaged (listed above); "
            "delete that directory and prepare again"
        )

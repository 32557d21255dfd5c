"""Configuration, written once: one frozen dataclass per concern; a field's docstring is its flag's help and its TOML key's
meaning, its metadata the flag's name where that differs from the field's.

    run.py           RunConfig, the run's tables ([parallel], [model], [data], [optimizer], [training], [checkpoint],
                     [reporting], and the engine's four below), built from a TOML file and flags; its validate()
    engine.py        the engine's own: ScheduleConfig, StageConfig, PrecisionConfig, DataParallelConfig; ConfigError
    checks.py        the rules that span fields (number ranges, the grid, batch against micro-batches), run once
    flags.py         the command line, generated from the dataclasses; the TOML file read and laid under the flags
    input_files.py   reading a file a user names: a regular file only, never through a wait
    output_paths.py  every file a run writes, checked before the first collective
    paths_apart.py   the rule every command asks: nothing it writes is, or lies inside, something it reads

Imports from the package: hybrid_engine._C (the C++ core's schedule rules) and, for each model's own options and
rules, hybrid_engine.models' option classes. Nothing above it (engine, train) is imported here.
"""

from .engine import ConfigError, DataParallelConfig, PrecisionConfig, ScheduleConfig, StageConfig
from .run import LaunchEnv, ModelConfig, RunConfig

__all__ = ["ConfigError", "DataParallelConfig", "LaunchEnv", "ModelConfig", "PrecisionConfig", "RunConfig",
           "ScheduleConfig", "StageConfig"]

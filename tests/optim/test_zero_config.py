"""The rules of --zero, --zero-shard-size and --zero-prefetch (config/engine.py DataParallelConfig), each refused in
one line before any process group exists."""
import pytest

from hybrid_engine import ProcessGrid
from hybrid_engine.config.engine import ConfigError, DataParallelConfig


@pytest.mark.parametrize("fields,grid,message", [
    (dict(zero=4), None, "must be 0, 1, 2 or 3, got 4"),
    (dict(zero=2, shard_size=3), (4, 1, 1), "--zero-shard-size 3 does not divide the 4 data-parallel ranks"),
    (dict(zero=0, shard_size=2), None, "--zero-shard-size 2: needs --zero 1, 2 or 3"),
    (dict(zero=3, shard_size=1), None, "1 would shard nothing: that is --zero 0"),
    (dict(zero=3, prefetch=0), None, "--zero-prefetch must be >= 1, got 0"),
    (dict(zero=3, overlap_param_gather=False), None, "--zero 3 gathers each parameter bucket just ahead"),
])
def test_refused_in_one_line(fields, grid, message):
    with pytest.raises(ConfigError) as error:
        DataParallelConfig(**fields).validate(ProcessGrid(*grid) if grid else None)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_shard_size_dividing_the_data_parallel_ranks_is_taken():
    DataParallelConfig(zero=3, shard_size=2, prefetch=2).validate(ProcessGrid(4, 2, 1))
    DataParallelConfig(zero=1, shard_size=4).validate(ProcessGrid(8, 1, 1))

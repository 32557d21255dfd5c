"""SyntheticRegression's memory-lean paths (draw / inputs / targets_of with a dtype) give exactly the numbers of
the original path (full fp32 inputs, targets from them, then a cast), for any row range; they never build a
full-size fp32 tensor; and the driver, which now draws only what each rank consumes, trains on the same data."""
import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine_reference import first_loss
from launch_utils import torchrun

from hybrid_engine.models import SyntheticRegression, stream_seed
from hybrid_engine.models.mlp.model import _STREAM_BATCH, _generator

DIM = 48
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
RANGES = [(0, 1), (0, 256), (0, 600), (100, 200), (250, 770), (255, 257), (512, 1024), (700, 1040)]


def original_batch(data: SyntheticRegression, step: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The path before the memory-lean one, verbatim: fp32 blocks sliced and concatenated, targets of all of it."""
    parts = []
    for block in range(start // data.ROW_BLOCK, (stop - 1) // data.ROW_BLOCK + 1):
        gen = _generator(data.device, stream_seed(data.seed, _STREAM_BATCH, step * 1_000_003 + block))
        rows = torch.randn(data.ROW_BLOCK, data.dim, device=data.device, generator=gen)
        lo = max(start - block * data.ROW_BLOCK, 0)
        hi = min(stop - block * data.ROW_BLOCK, data.ROW_BLOCK)
        parts.append(rows[lo:hi])
    x = parts[0] if len(parts) == 1 else torch.cat(parts)
    return x, torch.relu(x * data.scale + data.shift)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("start,stop", RANGES)
def test_every_path_equals_the_original_then_cast_bit_for_bit(start, stop, dtype):
    data = SyntheticRegression(DIM, 7, "cpu")
    x0, y0 = original_batch(data, 3, start, stop)
    x0, y0 = x0.to(dtype), y0.to(dtype)
    x, y = data.draw(3, start, stop, dtype=dtype)
    assert x.dtype == y.dtype == dtype and x.shape == (stop - start, DIM)
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert torch.equal(data.inputs(3, start, stop, dtype), x0)
    assert torch.equal(data.targets_of(3, start, stop, dtype), y0)
    bx, by = data.batch(3, 1040, start, stop, dtype=dtype)
    assert torch.equal(bx, x0) and torch.equal(by, y0)
    if dtype == torch.float32:  # the default is the original fp32 batch
        dx, dy = data.batch(3, 1040, start, stop)
        assert torch.equal(dx, x0) and torch.equal(dy, y0) and torch.equal(data.targets(dx), dy)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_row_range_equals_the_same_rows_of_the_whole_batch(dtype):
    data = SyntheticRegression(DIM, 0, "cpu")
    whole_x, whole_y = data.batch(5, 1040, dtype=dtype)
    assert torch.equal(whole_x, data.batch(5, 1040)[0].to(dtype))
    for start, stop in RANGES:
        x, y = data.draw(5, start, stop, dtype=dtype)
        assert torch.equal(x, whole_x[start:stop]) and torch.equal(y, whole_y[start:stop])
        assert torch.equal(data.targets_of(5, start, stop, dtype), whole_y[start:stop])
    # DP slices of the global batch put back together are the global batch
    for dp in (2, 4, 5):
        per = 1040 // dp
        xs, ys = zip(*(data.draw(5, r * per, (r + 1) * per, dtype=dtype) for r in range(dp)))
        assert torch.equal(torch.cat(xs), whole_x) and torch.equal(torch.cat(ys), whole_y)
    assert not torch.equal(data.inputs(6, 0, 10, dtype), whole_x[:10])  # another step, other numbers


def test_draw_returns_only_what_is_asked_for():
    data = SyntheticRegression(DIM, 0, "cpu")
    x, y = data.draw(0, 10, 20, targets=False, dtype=torch.float16)
    assert y is None and x.dtype == torch.float16
    x, y = data.draw(0, 10, 20, inputs=False)
    assert x is None and y.dtype == torch.float32
    assert data.draw(0, 10, 20, inputs=False, targets=False) == (None, None)
    with pytest.raises(ValueError):
        data.draw(0, 20, 20)


class _Sizes(TorchDispatchMode):
    """Records (dtype, rows) of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() == 2:
                self.made.append((t.dtype, t.shape[0]))
        return out


@pytest.mark.parametrize("inputs,targets", [(True, False), (False, True), (True, True)])
def test_no_full_size_temporary_exists_only_the_outputs(inputs, targets):
    data = SyntheticRegression(DIM, 0, "cpu")
    rows = 4 * data.ROW_BLOCK + 100
    with _Sizes() as seen:
        data.draw(1, 0, rows, inputs=inputs, targets=targets, dtype=torch.float16)
    big = [(dt, n) for dt, n in seen.made if n > data.ROW_BLOCK]
    assert big == [(torch.float16, rows)] * (inputs + targets), big  # the outputs, allocated once, in half
    assert all(n <= data.ROW_BLOCK for dt, n in seen.made if dt == torch.float32)


def test_driver_trains_on_the_same_data_as_one_process_across_dp_slices_and_blocks(tmp_path):
    """dp 2 x pp 2 on CPU: rank (dp 0, pp 0) draws only inputs, (dp 0, pp 1) only targets, each 520 rows that
    cross 256-row blocks; the first loss (before any update) is the whole model's loss on the whole batch."""
    metrics = tmp_path / "m.jsonl"
    run = torchrun(4, "--dp", "2", "--pp", "2", "--dim", "32", "--depth", "4", "--batch-size", "1040",
                   "--micro-batches", "4", "--steps", "1", "--warmup", "0", "--quiet", "--metrics", str(metrics))
    assert run.returncode == 0, run.stderr[-3000:]
    loss = json.loads(metrics.read_text().splitlines()[0])["loss"]
    expected = first_loss(32, 4, 1040)
    assert math.isfinite(loss) and loss == pytest.approx(expected, rel=1e-5)

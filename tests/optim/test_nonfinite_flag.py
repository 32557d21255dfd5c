"""The read-only overflow check of fp16 training (csrc/amp/nonfinite.h): a float32 [1] flag, 1.0 iff some element
of some tensor is inf or NaN.

The CPU path runs in CI; on a GPU the vectorised kernel (fp32, contiguous; float4 body, scalar tail, scalar only
for misaligned views) and the ATen fallback (other dtypes, strided views) run too."""
import pytest
import torch

from hybrid_engine import _C

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BAD = [float("inf"), float("-inf"), float("nan")]
# Vector body with and without a tail, shorter than one vector, one element, several grid-stride rounds.
SIZES = [4099, 4096, 3, 1, (1 << 20) + 5]


def flag(tensors, device):
    out = _C._testing.nonfinite_flag(tensors, torch.device(device))
    assert out.dtype == torch.float32 and out.shape == (1,) and out.device.type == device
    return out.item()


def random_views(device, sizes, offset, seed=0):
    """Views into one flat buffer at `offset` past each 16-byte boundary (1: no view is float4-aligned), with
    inf poisoned into the gaps between them: a view that read past its end would see it."""
    gen = torch.Generator(device=device).manual_seed(seed)
    flat = torch.full((sum(sizes) + len(sizes) * 4 + offset,), float("inf"), device=device)
    views, start = [], offset
    for n in sizes:
        flat[start:start + n] = torch.randn(n, device=device, generator=gen) * 1e4
        views.append(flat[start:start + n])
        start += n + 4
    return views


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 1])
def test_finite_tensors_give_zero_even_beside_poison(device, offset):
    assert flag(random_views(device, SIZES, offset), device) == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_bad_element_anywhere_is_found(device, offset, bad, where):
    for which, n in enumerate(SIZES):
        views = random_views(device, SIZES, offset, seed=which)
        index = {"first": 0, "middle": n // 2, "last": n - 1}[where]
        views[which][index] = bad
        assert flag(views, device) == 1.0, (n, index)


@pytest.mark.parametrize("device", DEVICES)
def test_a_clean_tensor_after_a_bad_one_keeps_the_flag(device):
    views = random_views(device, [257, 4099, 8], 0)
    views[0][100] = float("nan")
    assert flag(views, device) == 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(device, dtype):
    gen = torch.Generator(device=device).manual_seed(3)
    t = torch.randn(1001, device=device, generator=gen).to(dtype)
    assert flag([t], device) == 0.0
    for bad in BAD:
        u = t.clone()
        u[1000] = bad
        assert flag([torch.randn(5, device=device, generator=gen), u], device) == 1.0
    # fp16's largest value is finite; a scaled fp16 gradient past it became inf during the backward
    assert flag([torch.full((3,), 65504.0, device=device, dtype=torch.float16)], device) == 0.0
    assert flag([torch.tensor([0, 7], device=device, dtype=torch.int32)], device) == 0.0  # integers: finite


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_views_see_only_their_own_elements(device):
    gen = torch.Generator(device=device).manual_seed(4)
    base = torch.randn(64, 33, device=device, generator=gen)
    base[:, 32] = float("inf")  # outside the [:, :32] view
    assert flag([base[:, :32], base[:, :32].t()], device) == 0.0
    base[62, 5] = float("-inf")
    assert flag([base[:, :32].t()], device) == 1.0
    rows = torch.randn(64, 32, device=device, generator=gen)
    rows[1::2, 0] = float("nan")  # outside the [::2] view
    assert flag([rows[::2], rows[::2].t()], device) == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_none_and_empty_entries_are_skipped(device):
    assert flag([], device) == 0.0
    assert flag([None, torch.empty(0, device=device), None], device) == 0.0
    bad = torch.randn(9, device=device)
    bad[4] = float("inf")
    assert flag([None, bad, None], device) == 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_only_reads(device):
    views = random_views(device, SIZES, 1)
    views[1][7] = float("nan")
    before = [v.clone() for v in views]
    assert flag(views, device) == 1.0
    for got, want in zip(views, before):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_tensors_with_a_cpu_flag_and_no_host_sync_before_reading():
    t = torch.randn(4099, device="cuda")
    t[4098] = float("inf")
    assert flag([t], "cpu") == 1.0  # another device: the ATen path carries the answer over
    out = _C._testing.nonfinite_flag([t], torch.device("cuda"))
    torch.cuda.synchronize()
    assert out.item() == 1.0

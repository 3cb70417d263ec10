"""One size parser and one formatter (dtcore.units, C++ csrc/dtcore/common/units.h): SI and IEC meanings."""

import pytest
import torch

import dtcore
from dtcore.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2GB", 2 * 10**9),
        ("512MB", 512 * 10**6),
        ("1kB", 1000),
        ("1TB", 10**12),
        ("1.5GiB", 1_610_612_736),
        (" 64 kib ", 65536),
        ("768MiB", 768 << 20),
        ("4096", 4096),
        ("4096B", 4096),
        (4096, 4096),
    ],
)
def test_sizes_mean_what_the_standards_say(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text,why",
    [
        ("2XB", "is not a size"),
        ("-1GB", "is not a size"),
        ("0", "is not a size"),
        ("0.1B", "is not a size"),
        ("", "is not a size"),
        ("64M", "ambiguous"),
        ("1G", "ambiguous"),
        (0, "is not a size"),
    ],
)
def test_bad_or_ambiguous_sizes_are_refused_with_the_fix(text, why):
    with pytest.raises(dtcore.ConfigError, match=why) as e:
        parse_bytes(text, "the budget")
    assert str(e.value).startswith("the budget") and "Fix:" in str(e.value)


def test_one_formatter_exact_when_whole():
    assert [format_bytes(n) for n in (8, 65536, 1 << 30, 1_610_612_736, 100_000, 3 << 40)] == [
        "8 B",
        "64 KiB",
        "1 GiB",
        "1.5 GiB",
        "97.7 KiB",
        "3 TiB",
    ]


def test_bucket_sizes_are_mib_as_in_torch_ddp(fresh_dtcore):
    dtcore.init(timeout=20)
    # Two gradients of 1,020,000 bytes: under a 1 MiB cap the first leaves room (one bucket of two);
    # under 1 MB (10^6) it would fill a bucket alone.
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(255_000)) for _ in range(2)])
    wrapped = dtcore.wrap(model, bucket_mb=1, first_bucket_mb=1)
    assert wrapped.bucket_params == [[1, 0]]

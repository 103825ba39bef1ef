"""The one reader of the calibration tables (tracegen/calibration_csv.py), on a table written here."""

from dataclasses import dataclass

import pytest
from xsim.tracegen.calibration_csv import read_points


@dataclass(frozen=True)
class _Point:
    gpu: str
    causal: bool
    seq_len: int
    tflops: float


def test_rows_become_points_in_field_order_and_comment_rows_are_skipped(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        'gpu,tflops,seq_len,causal,source\nH100,335,512,0,"a, b"\n#note,1,1,1,x\nA100,1.5,2048,1,y\n'
    )
    assert read_points(str(path), _Point) == [
        _Point("H100", False, 512, 335.0),
        _Point("A100", True, 2048, 1.5),
    ]


def test_a_malformed_number_fails_where_it_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("gpu,causal,seq_len,tflops\nH100,0,five,1\n")
    with pytest.raises(ValueError):
        read_points(str(path), _Point)


@dataclass(frozen=True)
class _Renamed:
    gpu: str
    phase: str


def test_a_field_reads_the_column_it_is_renamed_to(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("gpu,pass\nA100,bwd\n")
    assert read_points(str(path), _Renamed, {"phase": "pass"}) == [_Renamed("A100", "bwd")]

"""Manifest validation: every error names its row and column; paths never escape the dataset folder."""
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splavu_core.ingest.manifest import ManifestError, load_manifest

HEADER = "video_id,path,split,action,segments,anomaly,anomaly_intervals,attr_hat\n"


@pytest.fixture
def dataset(tmp_path):
    (tmp_path / "videos").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "videos" / f"{name}.mp4").write_bytes(b"\x00")
    return tmp_path


def write(dataset, *rows):
    p = dataset / "manifest.csv"
    p.write_text(HEADER + "".join(r + "\n" for r in rows))
    return p


def problems(path):
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    return str(e.value)


def test_valid_manifest_parses_types(dataset):
    m = load_manifest(write(dataset, 'a,videos/a.mp4,train,wave,"[[0.5, 2.0, ""wave""]]",1,"[[1, 2]]",1',
                           "b,videos/b.mp4,test,,,0,,0"))
    a, b = m.rows
    assert a["segments"] == [[0.5, 2.0, "wave"]] and a["anomaly"] == 1 and a["anomaly_intervals"] == [[1.0, 2.0]]
    assert a["attr_hat"] == 1 and b["action"] is None and b["segments"] is None and m.attributes == ("hat",)
    assert m.to_arrow().num_rows == 2


def test_parquet_manifest(dataset):
    p = dataset / "manifest.parquet"
    pq.write_table(pa.table({"video_id": ["a"], "path": ["videos/a.mp4"], "split": ["val"]}), p)
    assert load_manifest(p).rows[0]["split"] == "val"


def test_duplicate_ids(dataset):
    msg = problems(write(dataset, "a,videos/a.mp4,train,,,,,", "a,videos/b.mp4,train,,,,,"))
    assert "row 2 (video_id 'a'), column 'video_id': duplicate of row 1" in msg


def test_missing_file(dataset):
    msg = problems(write(dataset, "a,videos/a.mp4,train,,,,,", "x,videos/nope.mp4,train,,,,,"))
    assert "row 2 (video_id 'x'), column 'path': file not found" in msg and "nope.mp4" in msg


def test_unknown_split(dataset):
    msg = problems(write(dataset, "a,videos/a.mp4,training,,,,,"))
    assert "row 1 (video_id 'a'), column 'split': 'training' is not one of" in msg


def test_malformed_json(dataset):
    msg = problems(write(dataset, 'a,videos/a.mp4,train,,"[[0.5, 2.0, ""wave""]",,,',
                         'b,videos/b.mp4,train,,"[[3, 1, ""x""]]",,,', 'c,videos/c.mp4,train,,,,"{""a"": 1}",'))
    assert "row 1 (video_id 'a'), column 'segments': malformed JSON" in msg
    assert "row 2 (video_id 'b'), column 'segments': item 0" in msg  # end before start
    assert "row 3 (video_id 'c'), column 'anomaly_intervals': expected a JSON list" in msg


def test_bad_binary_columns(dataset):
    msg = problems(write(dataset, "a,videos/a.mp4,train,,,2,,yes"))
    assert "column 'anomaly': '2' is not 0 or 1" in msg and "column 'attr_hat': 'yes' is not 0 or 1" in msg


@pytest.mark.parametrize("path", ["../outside.mp4", "videos/../../outside.mp4", "/etc/passwd"])
def test_paths_outside_are_refused(dataset, path):
    (dataset.parent / "outside.mp4").write_bytes(b"\x00")
    msg = problems(write(dataset, f"a,{path},train,,,,,"))
    assert "row 1 (video_id 'a'), column 'path'" in msg and "refused" in msg


def test_symlink_leading_out_is_refused_never_read(dataset, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    fifo = outside / "secret.mp4"
    os.mkfifo(fifo)  # opening a FIFO with no writer would hang: the check must not read it
    os.symlink(fifo, dataset / "videos" / "link.mp4")
    os.symlink(outside, dataset / "linkdir")
    msg = problems(write(dataset, "a,videos/link.mp4,train,,,,,", "b,linkdir/secret.mp4,train,,,,,"))
    assert "row 1 (video_id 'a'), column 'path'" in msg and "outside the dataset folder; refused" in msg
    assert "row 2 (video_id 'b'), column 'path'" in msg


def test_symlink_inside_is_fine(dataset):
    os.symlink(dataset / "videos" / "a.mp4", dataset / "videos" / "alias.mp4")
    assert load_manifest(write(dataset, "a,videos/alias.mp4,train,,,,,")).rows[0]["path"] == "videos/alias.mp4"


def test_missing_columns_and_every_problem_listed(dataset):
    p = dataset / "manifest.csv"
    p.write_text("video_id,path\na,videos/a.mp4\n")
    assert "missing required column(s) ['split']" in problems(p)
    msg = problems(write(dataset, "a,videos/a.mp4,nope,,,,,", "b,videos/zz.mp4,train,,,,,", ",videos/c.mp4,test,,,,,"))
    assert "3 problem(s)" in msg and "row 3, column 'video_id': empty" in msg


def test_unsupported_manifest_type(dataset):
    p = dataset / "manifest.json"
    p.write_text("{}")
    assert "unsupported manifest type" in problems(p)

"""A check reads each file once (fs/digests.py ``remembered``): the commit stage's check of the table it has just
built, and a multi-graph bundle's check of its top-level table and then each component's, no longer hash the
same graph twice; a file changed in between is hashed anew."""
import os

from helpers import hf_dirs

import cann_export
from cann_export.fs import digests


def test_a_decoder_with_past_export_hashes_each_graph_once_per_check(tmp_path, monkeypatch):
    read: list[str] = []
    stream = digests.sha256_stream

    def reading(f, limit=None, h=None):
        read.append(os.path.basename(f.name))
        return stream(f, limit, h)

    monkeypatch.setattr(digests, "sha256_stream", reading)
    directory = hf_dirs.save("gpt2", tmp_path / "gpt2")
    result = cann_export.export(str(directory), tmp_path / "out", export_format="onnx",
                                task="text-generation-with-past", sandbox="off")  # the whole check in this process
    assert result.ok and set(result.components) == {"prefill", "decode"}, result
    # per graph: its component's commit (the table built, then checked) and the bundle's check (its top-level
    # table, then the component's own)
    assert read.count("model.onnx") == 4, read
    cann_export.validate(str(tmp_path / "out"))  # raises on any difference from its tables


def test_a_file_changed_within_the_block_is_hashed_anew(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 100)
    with digests.remembered():
        first = digests.sha256_file(f)
        assert digests.sha256_file(f) == first
        f.write_bytes(b"b" * 100)  # same size, in place
        assert digests.sha256_file(f) == digests.sha256_bytes(b"b" * 100) != first
    assert digests.sha256_file(f) == digests.sha256_bytes(b"b" * 100)


def test_the_memo_is_this_threads_own(tmp_path):
    """A second export thread hashes outside any block of the first's: a new thread starts with no memo."""
    import threading

    seen = []
    with digests.remembered():
        thread = threading.Thread(target=lambda: seen.append(digests._REMEMBERED.get()))
        thread.start()
        thread.join()
    assert seen == [None]

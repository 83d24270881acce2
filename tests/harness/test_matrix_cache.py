"""The matrix's render cache keeps only the renders of the code as it is: a render is tens of
megabytes and a full matrix a thousand of them (74 GB of stale renders once filled a disk)."""

from exporter.harness import matrix


def test_renders_of_other_code_and_interrupted_writes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SIDECAR_MATRIX_CACHE", str(tmp_path))
    now = matrix._code_digest()
    current = tmp_path / f"seed-night-1d-15s-8p-{now}.pickle"
    stale = tmp_path / "seed-night-1d-15s-8p-0123456789abcdef.pickle"
    partial = tmp_path / f"seed-night-1h-15s-8p-{now}.4242.tmp"
    other = tmp_path / "notes.txt"
    for f in (current, stale, partial, other):
        f.write_bytes(b"x")
    assert matrix.prune_render_cache() == 2
    assert current.exists() and other.exists() and not stale.exists() and not partial.exists()


def test_no_cache_no_pruning(monkeypatch):
    monkeypatch.delenv("VLLM_SIDECAR_MATRIX_CACHE", raising=False)
    assert matrix.prune_render_cache() == 0

